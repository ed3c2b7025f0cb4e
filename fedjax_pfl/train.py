"""``python -m fedjax_pfl.train``: train one method (the command itself is fedjax_pfl/runs/cli.py)."""

import sys

from fedjax_pfl.runs.cli import main

if __name__ == "__main__":
    sys.exit(main())
