"""``python tests/kill_during_checkpoint.py ARGS...``: the training command in this process, killed (SIGKILL,
as kill -9) during its first checkpoint's save: once Orbax has written the round into its temporary folder,
before it renames it into place. The run folder is left as a kill at that moment leaves it: records
written, no complete checkpoint. A helper for tests that need a real process."""

import os
import signal
import sys

from orbax.checkpoint._src.path import async_path

from fedjax_pfl.commands import train as cli


async def killed_before_rename(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    async_path.rename = killed_before_rename  # Orbax's last step of a save: the temporary folder renamed
    sys.exit(cli.main(sys.argv[1:]))
