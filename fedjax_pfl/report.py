"""``python -m fedjax_pfl.report RUN_DIR...``: runs side by side (fedjax_pfl/runs/report.py)."""

import sys

from fedjax_pfl.outputs.report import main

if __name__ == "__main__":
    sys.exit(main())
