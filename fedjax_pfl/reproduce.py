"""``python -m fedjax_pfl.reproduce NAME``: a paper's table (the command is fedjax_pfl/cells/reproduce.py)."""

import sys

from fedjax_pfl.cells.reproduce import main

if __name__ == "__main__":
    sys.exit(main())
