"""``python -m fedjax_pfl.reproduce NAME``: a paper's table (the command itself is fedjax_pfl/runs/reproduce.py)."""

import sys

from fedjax_pfl.papers.reproduce import main

if __name__ == "__main__":
    sys.exit(main())
