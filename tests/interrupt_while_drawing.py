"""``python tests/interrupt_while_drawing.py RUNS SIGNAL ARGS...``: the training command in this process, sending
itself SIGNAL (e.g. INT, TERM) once the figures of RUNS runs are drawn (as a Ctrl-C arriving while a sweep draws
its runs' figures). A helper for tests that need a real process."""

import os
import signal
import sys

from fedjax_pfl.commands import train as cli
from fedjax_pfl.outputs import figures

if __name__ == "__main__":
    runs, name, *argv = sys.argv[1:]
    draw_run, drawn = figures.draw_run, []

    def counted(*args, **kwargs):
        out = draw_run(*args, **kwargs)
        drawn.append(args[0])
        if len(drawn) == int(runs):
            os.kill(os.getpid(), getattr(signal, "SIG" + name))
        return out

    figures.draw_run = counted
    sys.exit(cli.main(argv))
