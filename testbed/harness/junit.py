"""JUnit XML of a run, a fuzz or a mutant hunt, the report CI systems read: one test case per
scenario, fuzz example or mutant, its failure carrying the evidence and the line that
reproduces it, a scenario the integration cannot run a skipped case with the rule.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Iterable, Optional

from testbed.harness.invariants import Verdict


@dataclass(frozen=True)
class Case:
    """One test case: ``failure`` (its first line is the message), ``error`` (the testbed's), or
    ``skipped`` (the reason) or none (passed); ``output`` goes to ``system-out``."""

    name: str
    classname: str
    seconds: float = 0.0
    failure: Optional[str] = None
    error: Optional[str] = None  # the testbed's own trouble, not the code under test's
    skipped: Optional[str] = None
    output: str = ""


def verdict_case(index: int, v: Verdict, classname: str) -> Case:
    """A scenario's case: failed with each invariant's evidence and the reproducing line; a
    known finding passes with its failures in ``system-out``."""
    sc = v.scenario
    name = f"{index:03d} {sc.label or sc.short()}"
    reproduce = f"reproduce: {sc.to_cli()}"
    if v.testbed_error:
        return Case(name, classname, v.seconds, error=f"testbed error: {v.testbed_error}\n{reproduce}",
                    output=sc.short())
    if not v.passed:
        text = "\n".join(f"[{f.invariant}] {f.evidence}" for f in v.failures)
        return Case(name, classname, v.seconds, failure=f"{text}\n{reproduce}", output=sc.short())
    known = "".join(f"[{f.invariant}, known {', '.join(v.known)}] {f.evidence}\n" for f in v.known_failures)
    return Case(name, classname, v.seconds, output=f"{sc.short()}\n{known}{reproduce}")


def not_run_case(index: int, sc, rule: str, classname: str) -> Case:
    return Case(f"{index:03d} {sc.label or sc.short()}", classname, skipped=f"NOT RUN: {rule}",
                output=f"{sc.short()}\nreproduce: {sc.to_cli()}")


def write(path: str, suite: str, cases: Iterable[Case], seconds: float) -> None:
    """Write ``cases`` as one ``testsuite`` named ``suite`` inside ``testsuites``."""
    cases = list(cases)
    failures = sum(c.failure is not None for c in cases)
    skipped = sum(c.skipped is not None for c in cases)
    errors = sum(c.error is not None for c in cases)
    root = ET.Element("testsuites", name="a2a-testbed", tests=str(len(cases)), failures=str(failures),
                      errors=str(errors), skipped=str(skipped), time=f"{seconds:.3f}")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)), failures=str(failures),
                         errors=str(errors), skipped=str(skipped), time=f"{seconds:.3f}")
    for c in cases:
        case = ET.SubElement(node, "testcase", name=c.name, classname=c.classname, time=f"{c.seconds:.3f}")
        if c.failure is not None:
            ET.SubElement(case, "failure", message=c.failure.splitlines()[0][:500]).text = c.failure
        if c.error is not None:
            ET.SubElement(case, "error", message=c.error.splitlines()[0][:500]).text = c.error
        if c.skipped is not None:
            ET.SubElement(case, "skipped", message=c.skipped[:500])
        if c.output:
            ET.SubElement(case, "system-out").text = c.output
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
