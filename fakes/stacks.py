"""Stacks on demand from processes the testbed did not start itself: where :data:`STACKS_ENV`
names a directory, :func:`on_signal` makes SIGUSR1 write every thread's stack to
``stacks-<pid>.txt`` there, under a first line naming the process. ``faulthandler`` writes from
its signal handler, even while the process waits inside C code (a gloo wait, a futex). The
start-up hook (:mod:`fakes.spawned`) calls it first thing in every process a run starts, before
anything slow is imported, so a watchdog's SIGUSR1 finds the handler there."""

from __future__ import annotations

import os
import sys

STACKS_ENV = "A2A_FAKE_STACKS_DIR"
_file = None  # kept open for the life of the process


def on_signal() -> None:
    """Register the handler where :data:`STACKS_ENV` names a directory (once per process)."""
    global _file
    where = os.environ.get(STACKS_ENV)
    if not where or _file is not None:
        return
    import faulthandler
    import signal

    _file = open(os.path.join(where, f"stacks-{os.getpid()}.txt"), "w")
    _file.write(f"process {os.getpid()} (parent {os.getppid()}): {' '.join(sys.argv) or sys.executable}\n")
    _file.flush()
    faulthandler.register(signal.SIGUSR1, file=_file, all_threads=True, chain=False)
