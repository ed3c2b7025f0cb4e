"""``python -m fedjax_pfl.train``: train one method (the command is fedjax_pfl/commands/train.py)."""

import sys

from fedjax_pfl.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
