"""``python tests/busy_when_signalled.py``: a command (commands/command.py) whose main thread waits on a compiled call
that never ends when it is stopped: it prints 'computing' once the call runs. Python runs no signal handler while
the main thread waits there (as in a long compile or round), yet the command must end on Ctrl-C or SIGTERM within
seconds. A helper for tests that need a real process."""

import sys

import jax
import jax.numpy as jnp

from fedjax_pfl.commands.command import Command


def body() -> int:
    # x + 1 stops growing at 2**24 in float32 but never turns negative: a loop without end
    forever = jax.jit(lambda x: jax.lax.while_loop(lambda v: v >= 0, lambda v: v + 1.0, x)).lower(0.0).compile()
    print("computing", flush=True)
    jax.block_until_ready(forever(jnp.float32(0)))
    return 0


if __name__ == "__main__":
    sys.exit(Command("interrupted; nothing more was written", own_process=True).run(body))
