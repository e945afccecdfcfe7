"""Where the output of an engine the testbed drives goes: the testbed's lines to the terminal,
everything else (this process's descriptors, the processes it starts, what C code prints at
interpreter exit) to the log; a refusal after it still reaches the terminal."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import atexit, os, subprocess, sys
    from testbed import console

    def at_exit():  # as nanobind's leak report: C code writing to descriptor 2 at exit
        os.write(2, b"leak report at exit\\n")

    atexit.register(at_exit)
    with console.engine_output_to(sys.argv[1]) as terminal:
        print("INFO engine log line")
        print("WARNING engine warning", file=sys.stderr)
        subprocess.run([sys.executable, "-c", "import os; os.write(1, b'rank output\\\\n')"], check=True)
        print("PASS 1/1 the testbed's verdict", file=terminal)
    print("a2a-testbed engine: error: refused", file=sys.stderr)
    print("1/1 passed")
""")


def test_console_engine_output_goes_to_the_log_and_the_testbeds_to_the_terminal(tmp_path):
    log = tmp_path / "engine.log"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["PASS 1/1 the testbed's verdict", "1/1 passed"]
    assert done.stderr.splitlines() == ["a2a-testbed engine: error: refused"]
    assert log.read_text().splitlines() == ["INFO engine log line", "WARNING engine warning", "rank output",
                                            "leak report at exit"]
