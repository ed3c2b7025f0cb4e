"""``python -m fedjax_pfl.reproduce NAME``: a paper's table (the command is fedjax_pfl/papers/reproduce.py)."""

import sys

from fedjax_pfl.papers.reproduce import main

if __name__ == "__main__":
    sys.exit(main())
