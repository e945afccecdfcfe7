"""Where the output of an engine the testbed drives goes: the testbed's lines to the terminal,
everything else (this process's descriptors, the processes it starts, what C code prints at
interpreter exit) to the log; a refusal after it still reaches the terminal."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

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


def _one_scenario(*flags: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "testbed", "run", *flags, "--layout", "2,1,2,1", "--stages",
                           "bf16:16", "--tokens", "5,7"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]
    return done.stdout.splitlines()


def _testbeds_lines_only(lines: list[str], label: str) -> None:
    assert len(lines) <= 8, lines
    assert lines[0].startswith(f"{label}'s and the ranks' own output: ") and lines[0].endswith("(-v shows it live)")
    assert all(line.startswith(("PASS ", "GONE ")) for line in lines[1:-1]), lines
    assert lines[-1].startswith("1 passed, 0 failed in "), lines


@pytest.mark.needs("vllm")
def test_console_one_vllm_scenario_prints_the_testbeds_lines_only():
    lines = _one_scenario("--integration", "vllm", "--vllm-source", "0.34.0")
    _testbeds_lines_only(lines, "vLLM")
    log = lines[0].split(": ", 1)[1].split(" (-v")[0]
    # vLLM's CPU communicator says it falls back from the FlashInfer manager the testbed put back
    assert "not supported on CPU" not in open(log).read()


@pytest.mark.needs("sglang")
def test_console_one_sglang_scenario_prints_the_testbeds_lines_only():
    _testbeds_lines_only(_one_scenario("--integration", "sglang"), "SGLang")
