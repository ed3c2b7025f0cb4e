"""``python tests/signal_after_round.py ROUNDS SIGNAL ARGS...``: the training command in this process,
sending itself SIGNAL (e.g. KILL, INT) once ROUNDS rounds are done, before their records are written
(as a kill or Ctrl-C arriving mid-run). A helper for tests that need a real process."""

import os
import signal
import sys

from fedjax_pfl.commands import train as cli


def signal_after(rounds: int, name: str):
    """An ``observe`` callback sending SIG``name`` to this process after ``rounds`` rounds."""

    def observe(done: int) -> None:
        if done == rounds:
            os.kill(os.getpid(), getattr(signal, "SIG" + name))

    return observe


if __name__ == "__main__":
    rounds, name, *argv = sys.argv[1:]
    sys.exit(cli.main(argv, observe=signal_after(int(rounds), name)))
