"""``python tests/memory_limited_train.py BYTES ARGS...``: the training command in this process as on a machine
with BYTES of memory available (data/client_limits.py's `available_bytes`; ``-``: this machine's), printing
``peak_rss_bytes=N`` (its peak resident memory) on stdout once the command ends. A helper for tests that check
the memory estimate against what a run takes, and the refusal's advice."""

import resource
import sys

from fedjax_pfl.commands import train as cli
from fedjax_pfl.data import client_limits

if __name__ == "__main__":
    limit, *argv = sys.argv[1:]
    if limit != "-":
        client_limits.available_bytes = lambda: int(limit)
    code = cli.main(argv)
    print(f"peak_rss_bytes={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}", flush=True)
    sys.exit(code)
