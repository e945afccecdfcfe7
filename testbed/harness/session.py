"""A tree of processes the testbed starts but does not own: an engine's own server and the
processes it spawns, an engine's own pytest session and the ranks its tests spawn.

The first process leads a session of its own (``start_new_session``), so the whole tree is
found by its session id whoever started each process, and it is killed with SIGKILL should
the testbed die first (``PR_SET_PDEATHSIG``; its children watch it in turn). On a timeout
every process of the session writes its stacks (:mod:`fakes.stacks`, installed at start-up
where :data:`fakes.stacks.STACKS_ENV` names a directory), and :func:`stuck` names each with
the frame it waits in; :func:`kill` then ends the session to its last process. The session's
temporary files (``TMPDIR``: vLLM's ZMQ socket files, which a killed process never unlinks)
go in a folder of its own, removed by :func:`kill` (or, where the testbed died first, by the
next rank pool's start).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from testbed.cluster.pool import STACKS_PREFIX
from testbed.cluster.worker import scratch_environment

# Variables of the caller's that would decide for the engine what the stand-in decides: vLLM
# takes an explicit CPU target as its platform (0.34 on) before any plugin's.
WITHHELD = ("VLLM_TARGET_DEVICE",)
# How long the session's processes have to write their stacks once asked: faulthandler writes
# from its signal handler, at once, whatever the process waits on.
STACKS_GRACE_S = 3.0
STDLIB = sysconfig.get_paths()["stdlib"]
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def engine_environment(code: Path | None) -> dict:
    """The environment of an engine's process tree: the caller's less :data:`WITHHELD`, the
    engine's code (``code``: a checkout's or a release's unpacked Python; None, the installed
    one) first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD}
    paths = [str(code)] if code is not None else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


_scratch: dict[int, str] = {}  # a session's leader pid: its temporary folder


def start(argv: list[str], *, env: dict, cwd, out, live: bool = False) -> subprocess.Popen:
    """Start ``argv`` as the leader of a session of its own, its output to ``out`` (a binary
    file; the terminal where ``live``), its temporary files in a folder of its own, killed
    should this process die first."""
    # Named as a rank pool's scratch of this process: should this process die before kill()
    # removes it, the next pool to start sweeps it (testbed.cluster.pool.sweep_stack_dirs).
    scratch = tempfile.mkdtemp(prefix=f"{STACKS_PREFIX}{os.getpid()}-session-")
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env | scratch_environment(scratch), stdout=None if live else out,
                                stderr=None if live else subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    _scratch[proc.pid] = scratch
    return proc


def stuck(proc: subprocess.Popen, stacks: Path, log) -> list[str]:
    """Ask every process of ``proc``'s session for its stacks, and append them to ``log`` (a
    binary file); one line per process: who it is and the innermost frame of the thread that
    was running."""
    try:
        os.killpg(proc.pid, signal.SIGUSR1)
    except ProcessLookupError:
        return ["  (the session ended as it timed out)"]
    deadline = time.monotonic() + STACKS_GRACE_S
    # A process writes its stacks at once; one with no handler ends on SIGUSR1. Either way the
    # set of dumps stops growing; others are killed next.
    while time.monotonic() < deadline and len(list(stacks.glob("stacks-*.txt"))) < len(members(proc.pid)):
        time.sleep(0.05)
    lines = []
    for dump in sorted(stacks.glob("stacks-*.txt")):
        text = dump.read_text(errors="replace")
        log.write(f"\n--- stacks, on the timeout: {text}".encode())
        head, _, body = text.partition("\n")
        # the running thread's frames, innermost first; the first outside Python's own library
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', body.split("\n\n")[0])
        own = [f for f in frames if not f[0].startswith(STDLIB)] or frames
        where = f"{Path(own[0][0]).name}:{own[0][1]} in {own[0][2]}" if own else "no stack written"
        lines.append(f"  {head[:160]}: {where}")
    return lines or ["  (no process of the session wrote its stacks)"]


def kill(proc: subprocess.Popen, within: float = 30.0) -> None:
    """Kill what is left of ``proc``'s session, reap ``proc``, and return once no process of
    the session runs (or raise after ``within`` seconds naming those that still do)."""
    from fakes.arena import pid_alive

    deadline = time.monotonic() + within
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        left = [pid for pid in members(proc.pid) if pid_alive(pid)]
        if not left:
            scratch = _scratch.pop(proc.pid, None)
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {left} of session {proc.pid} survive SIGKILL")
        for pid in left:  # one that left the process group (its own setpgid) is still of the session
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)  # SIGKILL is delivered; the kernel has yet to end them


def members(sid: int) -> list[int]:
    """The processes of session ``sid``, by ``/proc``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if len(fields) > 3 and fields[3] == str(sid):  # the session id, after state, ppid and pgrp
            found.append(int(stat.parent.name))
    return found
