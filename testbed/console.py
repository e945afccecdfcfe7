"""Where the output of code the testbed drives goes: an engine (vLLM, SGLang) logs at INFO from
every rank, warns with tracebacks it then ignores, and at interpreter exit its Triton bindings
print nanobind's leak report. A person reads the testbed's lines; the engine's go to a log file
whose path the testbed prints.

The redirection is of file descriptors 1 and 2, not of ``sys.stdout``: the rank pool's fork
server and every rank inherit them when they start, and C code (nanobind's report) writes to
the descriptor itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator, TextIO


@contextlib.contextmanager
def engine_output_to(path: str) -> Iterator[TextIO]:
    """Send descriptors 1 and 2 (this process's, so also ``sys.stdout``'s and ``sys.stderr``'s
    and every process it starts) to ``path``; yields a stream to the terminal for the testbed's
    own lines. On leaving, descriptor 1 is the terminal again and ``sys.stderr`` writes to it
    (a refusal reaches the person), while descriptor 2 stays on the log, so what the engine's
    extensions print at interpreter exit lands there too."""
    sys.stdout.flush()
    sys.stderr.flush()
    terminal_out, terminal_err = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    terminal = os.fdopen(terminal_out, "w", buffering=1)
    try:
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        terminal.flush()
        os.dup2(terminal_out, 1)
        sys.stderr = os.fdopen(terminal_err, "w", buffering=1)
