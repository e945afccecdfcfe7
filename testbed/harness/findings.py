"""Known findings: failures the testbed shows in code it did not write (vLLM, FlashInfer),
each written up in ``docs/findings.md`` under its id.

A finding names the scenarios it applies to (a property of the scenario, never a list) and
how it fails there: ``(invariant, piece of its evidence)`` pairs, the first its signature
(what must show), the rest what may follow from it (a rank that raised leaves its peers failing). A scenario it applies to is
``KNOWN <id>`` when its signature shows and every failure is one of the pairs of the findings
that apply (the failures move to ``known_failures``) (every failure matches one of the pairs, at least
one does), a plain failure when it also fails some other way, and a failure of the finding
itself when it passes: the bug is gone (fixed upstream, or the testbed no longer reaches it),
so the write-up and this entry must go.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

from testbed import integrations
from testbed.harness.invariants import Failure, Verdict
from testbed.integrations.base import Finding
from testbed.scenario.model import Scenario


def known(sc: Scenario) -> list[Finding]:
    """The findings that apply to ``sc`` in the engine release this process runs."""
    integration = integrations.get(sc.integration)
    return [f for f in integration.findings() if f.applies(sc) and gone(integration, f) is None]


def gone(integration, finding: Finding) -> Optional[str]:
    """Why the engine release this process runs no longer has ``finding`` (one line: the file
    and the pattern of :attr:`Finding.code` that no longer match), or None where it has it
    (every pattern matches, the finding names no code of the engine's, or no release of the
    engine is here to read)."""
    engine = integration.engine
    if not finding.code or engine is None:
        return None
    return _gone(engine, finding.code, os.environ.get(engine.source_env) or None)


def gone_lines(scenarios) -> list[str]:
    """``GONE <id>: why`` for each finding of the scenarios' integrations that the engine
    release this process runs no longer has (their scenarios were judged as any other)."""
    lines = []
    for name in dict.fromkeys(sc.integration for sc in scenarios):
        integration = integrations.get(name)
        lines += [f"GONE     {f.id}: {why}" for f in integration.findings() if (why := gone(integration, f))]
    return lines


@functools.cache
def _gone(engine, code: tuple, source: Optional[str]) -> Optional[str]:
    return engine.missing_code(code, source)


def judge(v: Verdict) -> Optional[str]:
    """``"KNOWN <id>, ..."`` when ``v`` fails exactly as its scenario's known findings say (the
    verdict's failures are then cleared), else None; a known finding that no longer reproduces
    becomes a failure of the verdict."""
    expected = known(v.scenario)
    if not expected:
        return None
    if v.passed:
        v.failures.append(Failure("known-finding", "the scenario passes, but " + "; ".join(
            f"{f.id} ({f.title}) says it fails" for f in expected) + ": the finding no longer reproduces; "
            "check it upstream, then retire it from the integration's findings.py and docs/findings.md"))
        return None
    pairs = [pair for f in expected for pair in f.expect]
    explained = all(any(inv == f.invariant and piece in f.evidence for inv, piece in pairs) for f in v.failures)
    # A finding reproduces when its signature shows; the other pairs are what may follow.
    ids = [f.id for f in expected if f.shows(v.failures)]
    if not explained or not ids:
        return None
    v.known, v.known_failures, v.failures = ids, list(v.failures), []
    return "KNOWN " + ", ".join(ids)
