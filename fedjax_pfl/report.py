"""``python -m fedjax_pfl.report RUN_DIR...``: runs side by side (the command is fedjax_pfl/commands/report.py)."""

import sys

from fedjax_pfl.commands.report import main

if __name__ == "__main__":
    sys.exit(main())
