"""An engine's own tests of its FlashInfer all-to-all, run on the CPU: the engine repository's
multi-GPU tests (:attr:`Engine.own_tests`) under ``pytest --fake-flashinfer=PIN
--fake-devices N`` (:mod:`fakes.pytest_plugin`), in a pytest process of their own.

The tests are the engine's, never a copy: a checkout's own ``tests/``, or a release's from its
source distribution (:func:`testbed.contract.source.release_tests`). The engine's code is the
checkout's, the installed release's, or another release's unpacked wheel, first on the path.
What the engine prints goes to a log file; the person reads one line per test that did not
pass, and the verdict last.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# Variables of the caller's that would decide for the tests what the stand-in decides: vLLM
# takes an explicit CPU target as its platform (0.34 on) before any plugin's.
WITHHELD = ("VLLM_TARGET_DEVICE",)


@dataclass(frozen=True)
class Outcome:
    """One test's outcome: ``passed``, ``failed`` (or an error in its set-up or teardown) or
    ``skipped``, and the first line of why (empty where it passed)."""

    test: str  # pytest's node id, from the tests' root
    outcome: str
    why: str = ""


@dataclass(frozen=True)
class Plan:
    """What one run of an engine's own tests runs: the test files under ``root``, the engine's
    code from ``code`` (None: the installed release), on the fake of ``pin`` with ``devices``
    stand-in accelerators."""

    engine: str  # "vLLM 0.34.0", "vLLM checkout 0.34.0+g1234abc"
    root: Path
    tests: tuple[str, ...]
    code: Path | None
    pin: str
    devices: int
    origin: str  # where the tests come from, in words
    off_cpu: tuple[tuple[str, str], ...] = ()  # (node id, what it needs): deselected, listed as not run


def command(plan: Plan, junit: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """The pytest command line of ``plan``, run from ``plan.root``."""
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--fake-flashinfer={plan.pin}",
            f"--fake-devices={plan.devices}", f"--junitxml={junit}", "-o", "junit_family=xunit1", "-rA",
            *[a for test, _ in plan.off_cpu for a in ("--deselect", test)], *plan.tests, *extra]


def environment(plan: Plan) -> dict:
    """The pytest process's environment: the caller's, the engine's code first on the path, less
    :data:`WITHHELD`."""
    env = {k: v for k, v in os.environ.items() if k not in WITHHELD}
    paths = [str(plan.code)] if plan.code is not None else []
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run(plan: Plan, log: Path, junit: Path, timeout: float, extra: tuple[str, ...] = (),
        live: bool = False) -> tuple[list[Outcome], str | None]:
    """Run ``plan``; the outcomes read from pytest's JUnit report, and why the run itself went
    wrong (a timeout, pytest's own refusal), or None.

    The pytest process leads a session of its own. On a timeout every process of the session
    writes its stacks (:func:`fakes.stacks.on_signal`) and the report names each with
    where it waits; then the whole session is killed, and the shared-memory segments of its
    arena unlinked, also when this command is interrupted.
    """
    import tempfile

    from fakes.arena import scenario_prefix, unlink_prefix
    from fakes.stacks import STACKS_ENV

    junit.unlink(missing_ok=True)
    with open(log, "ab") as out, tempfile.TemporaryDirectory(prefix="a2a-stacks-") as stacks:
        proc = subprocess.Popen(command(plan, junit, extra), cwd=plan.root, env=environment(plan) | {STACKS_ENV: stacks},
                                stdout=None if live else out, stderr=None if live else subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            trouble = None
        except subprocess.TimeoutExpired:
            code, trouble = None, f"timed out after {timeout:.0f} s; the session's processes, killed, were at:\n" \
                + "\n".join(_stuck(proc, Path(stacks), out))
        finally:
            _kill_session(proc)
            unlink_prefix(scenario_prefix(proc.pid, "pytest"))
    outcomes = read_junit(junit) if junit.is_file() else []
    if trouble is None and not outcomes:
        trouble = f"pytest exited {code} without a report of any test (see the log)"
    elif trouble is None and code not in (0, 1):  # 1: tests failed, reported
        trouble = f"pytest exited {code} (see the log)"
    return outcomes, trouble


# How long the session's processes have to write their stacks once asked: faulthandler writes
# from its signal handler, at once, whatever the process waits on.
STACKS_GRACE_S = 3.0
STDLIB = sysconfig.get_paths()["stdlib"]


def _stuck(proc: subprocess.Popen, stacks: Path, log) -> list[str]:
    """Ask every process of ``proc``'s session for its stacks, and append them to ``log`` (a
    binary file); one line per process: who it is and the innermost frame of the thread that
    was running."""
    try:
        os.killpg(proc.pid, signal.SIGUSR1)
    except ProcessLookupError:
        return ["  (the session ended as it timed out)"]
    try:
        proc.wait(timeout=STACKS_GRACE_S)  # a process with no handler ends on SIGUSR1; others are killed next
    except subprocess.TimeoutExpired:
        pass
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


def _kill_session(proc: subprocess.Popen, within: float = 30.0) -> None:
    """Kill what is left of ``proc``'s session (a worker its test did not join, all of it on a
    timeout or an interrupt), reap ``proc``, and return once no process of the session runs
    (or raise after ``within`` seconds naming those that still do)."""
    from fakes.arena import pid_alive

    deadline = time.monotonic() + within
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        left = [pid for pid in _session(proc.pid) if pid_alive(pid)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {left} of the pytest session {proc.pid} survive SIGKILL")
        time.sleep(0.05)  # SIGKILL is delivered; the kernel has yet to end them


def _session(sid: int) -> list[int]:
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


def read_junit(path: Path) -> list[Outcome]:
    """Each test of pytest's JUnit XML at ``path``, once, in order: a failure or an error anywhere
    in it (set-up, call, teardown, which pytest may report as a case of its own) makes it
    failed, else a skip skipped."""
    found: dict[str, Outcome] = {}
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('file') or case.get('classname', '').replace('.', '/') + '.py'}::{case.get('name')}"
        bad = [c for c in case if c.tag in ("failure", "error")]
        skipped = [c for c in case if c.tag == "skipped"]
        outcome = (Outcome(test, "failed", _why(bad[0])) if bad else
                   Outcome(test, "skipped", _why(skipped[0])) if skipped else Outcome(test, "passed"))
        if test not in found or rank[outcome.outcome] > rank[found[test].outcome]:
            found[test] = outcome
    return list(found.values())


_RAISED = re.compile(r"^\s*(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception)\b.*)$")


def _why(element) -> str:
    """The last exception a failure's message names (a test that collects its workers' tracebacks
    says "Worker(s) failed:" first), else its first line."""
    text = (element.get("message") or element.text or "").strip()
    raised = [m.group(1).strip() for m in map(_RAISED.match, text.splitlines()) if m]
    if raised:
        return raised[-1]
    return text.splitlines()[0] if text else element.tag


def _has(root: Path, test: str) -> bool:
    """Whether the file of node id ``test`` under ``root`` defines its test function."""
    path, _, name = test.partition("::")
    return (root / path).is_file() and f"def {name}(" in (root / path).read_text(errors="replace")


def summary_lines(plan: Plan, outcomes: list[Outcome], trouble: str | None) -> list[str]:
    """What a person reads: the run, each failure, the skips grouped by reason, the verdict last."""
    lines = [f"{plan.engine}: its own tests of the FlashInfer all-to-all ({', '.join(plan.tests)}; {plan.origin}), "
             f"on the fake of FlashInfer {plan.pin} with {plan.devices} stand-in accelerators"]
    lines += [f"  FAILED {o.test}: {o.why}" for o in outcomes if o.outcome == "failed"]
    lines += [f"  not run on the CPU: {test}: needs {need}" for test, need in plan.off_cpu if _has(plan.root, test)]
    skips = Counter((o.test.split("::")[0], o.why) for o in outcomes if o.outcome == "skipped")
    lines += [f"  skipped {n} in {where}: {why}" for (where, why), n in skips.items()]
    counts = Counter(o.outcome for o in outcomes)
    tally = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    verdict = "PASS" if not trouble and not counts["failed"] and counts["passed"] else "FAIL"
    lines.append(f"{verdict} {tally}" + (f"; {trouble}" if trouble else ""))
    return lines


def plan_for(engine, source: str | None, profile: str | None, devices: int) -> Plan:
    """The run of ``engine``'s (:class:`testbed.integrations.engine.Engine`) own tests for
    ``source``: None (the installed release), a release number, or a checkout's root.

    Raises
    ------
    ValueError
        One line naming the flag and the rule: no tests known for the engine, no such release
        or checkout, a checkout without the tests, a pin the fake does not serve.
    """
    from fakes.flashinfer.profiles import resolve
    from testbed.contract.source import RELEASE, SourceError, package_root, release_tests, unpacked

    flag = f"--{engine.name}-source"
    if not engine.own_tests:
        raise ValueError(f"--integration {engine.name}: the testbed knows no tests of {engine.label}'s own for its "
                         "FlashInfer all-to-all")
    installed = engine.release()[0]
    code = root = None
    try:
        if source is None or source == installed:
            if installed == "unknown":
                raise ValueError(f"{engine.label} is not installed here: give {flag} RELEASE or a checkout")
            version, origin = installed, "from its source distribution"
            root = release_tests(engine.name, version)
        elif RELEASE.fullmatch(source):
            version, origin = source, "from its source distribution"
            code, root = unpacked(engine.name, source), release_tests(engine.name, source)
        else:
            root = Path(source).resolve()
            code = package_root(engine.name, root)
            if code is None:
                raise ValueError(f"{flag}: {source} holds no {engine.name}/ package (give a checkout's root)")
            code = code.parent
            version, origin = engine.release(str(root))[0], f"from the checkout {root}"
    except SourceError as e:
        raise ValueError(f"{flag} {source or installed}: {e}") from None
    missing = [t for t in engine.own_tests if not (root / t).is_file()]
    if missing:
        raise ValueError(f"{flag} {source or installed}: {root} has no {', '.join(missing)}")
    pin = profile or engine.pinned(None if source in (None, installed) else source)
    resolve(pin, "--profile" if profile else f"{engine.label} {version}'s FlashInfer pin")
    return Plan(f"{engine.label} {version}", root, engine.own_tests, code, pin, devices, origin,
                engine.own_tests_off_cpu)
