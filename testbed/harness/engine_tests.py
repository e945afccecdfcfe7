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

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from testbed.harness import session

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


def run(plan: Plan, log: Path, junit: Path, timeout: float, extra: tuple[str, ...] = (),
        live: bool = False) -> tuple[list[Outcome], str | None]:
    """Run ``plan``; the outcomes read from pytest's JUnit report, and why the run itself went
    wrong (a timeout, pytest's own refusal), or None.

    The pytest process leads a session of its own (:mod:`testbed.harness.session`). On a
    timeout every process of the session writes its stacks and the report names each with
    where it waits; then the whole session is killed, and the shared-memory segments of its
    arena unlinked, also when this command is interrupted.
    """
    import tempfile

    from fakes.arena import scenario_prefix, unlink_prefix
    from fakes.stacks import STACKS_ENV

    junit.unlink(missing_ok=True)
    with open(log, "ab") as out, tempfile.TemporaryDirectory(prefix="a2a-stacks-") as stacks:
        proc = session.start(command(plan, junit, extra), cwd=plan.root, env=session.engine_environment(plan.code) | {STACKS_ENV: stacks},
                             out=out, live=live)
        try:
            code = proc.wait(timeout=timeout)
            trouble = None
        except subprocess.TimeoutExpired:
            code, trouble = None, f"timed out after {timeout:.0f} s; the session's processes, killed, were at:\n" \
                + "\n".join(session.stuck(proc, Path(stacks), out))
        finally:
            session.kill(proc)
            unlink_prefix(scenario_prefix(proc.pid, "pytest"))
    outcomes = read_junit(junit) if junit.is_file() else []
    if trouble is None and not outcomes:
        trouble = f"pytest exited {code} without a report of any test (see the log)"
    elif trouble is None and code not in (0, 1):  # 1: tests failed, reported
        trouble = f"pytest exited {code} (see the log)"
    return outcomes, trouble


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


def engine_source(engine, source: str | None) -> tuple[str, Path | None, Path | None]:
    """Where ``engine``'s code comes from for ``source`` (None: the installed release, a release
    number, or a checkout's root): ``(its version, the directory to put first on the path or
    None for the installed release, the checkout's root or None)``.

    Raises
    ------
    ValueError
        One line naming the flag and the rule: no such release or checkout, none installed.
    """
    from testbed.contract.source import RELEASE, SourceError, package_root, unpacked

    flag = f"--{engine.name}-source"
    installed = engine.release()[0]
    try:
        if source is None or source == installed:
            if installed == "unknown":
                raise ValueError(f"{engine.label} is not installed here: give {flag} RELEASE or a checkout")
            return installed, None, None
        if RELEASE.fullmatch(source):
            return source, unpacked(engine.name, source), None
        root = Path(source).resolve()
        code = package_root(engine.name, root)
        if code is None:
            raise ValueError(f"{flag}: {source} holds no {engine.name}/ package (give a checkout's root)")
        return engine.release(str(root))[0], code.parent, root
    except SourceError as e:
        raise ValueError(f"{flag} {source or installed}: {e}") from None


def engine_pin(engine, source: str | None, version: str, profile: str | None) -> str:
    """The FlashInfer release ``engine``'s code of ``source`` (release ``version``) runs on:
    ``profile`` where given, else its pin; one no profile serves raises ``ValueError`` naming
    the flag."""
    from fakes.flashinfer.profiles import resolve

    pin = profile or engine.pinned(None if source in (None, engine.release()[0]) else source)
    resolve(pin, "--profile" if profile else f"{engine.label} {version}'s FlashInfer pin")
    return pin


def plan_for(engine, source: str | None, profile: str | None, devices: int) -> Plan:
    """The run of ``engine``'s (:class:`testbed.integrations.engine.Engine`) own tests for
    ``source``: None (the installed release), a release number, or a checkout's root.

    Raises
    ------
    ValueError
        One line naming the flag and the rule: no tests known for the engine, no such release
        or checkout, a checkout without the tests, a pin the fake does not serve.
    """
    from testbed.contract.source import SourceError, release_tests

    flag = f"--{engine.name}-source"
    if not engine.own_tests:
        raise ValueError(f"--integration {engine.name}: the testbed knows no tests of {engine.label}'s own for its "
                         "FlashInfer all-to-all")
    version, code, root = engine_source(engine, source)
    origin = f"from the checkout {root}" if root else "from its source distribution"
    if root is None:
        try:
            root = release_tests(engine.name, version)
        except SourceError as e:
            raise ValueError(f"{flag} {source or version}: {e}") from None
    missing = [t for t in engine.own_tests if not (root / t).is_file()]
    if missing:
        raise ValueError(f"{flag} {source or version}: {root} has no {', '.join(missing)}")
    pin = engine_pin(engine, source, version, profile)
    return Plan(f"{engine.label} {version}", root, engine.own_tests, code, pin, devices, origin,
                engine.own_tests_off_cpu)
