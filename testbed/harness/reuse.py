"""Reuse against none: the same scenarios judged on a pool whose worlds hand each scenario the
process groups earlier scenarios made (:mod:`testbed.cluster.engine_groups`) and on one where
every scenario makes and destroys its own. Any verdict that differs is state that outlived
its scenario through a reused group (an engine's manager or workspace kept per group, say):
a defect of the reuse, or of the code under test, never a difference to accept.
"""

from __future__ import annotations

from testbed.harness.invariants import Verdict


def fingerprint(v: Verdict) -> tuple:
    """What must not depend on reuse: the status, the findings reproduced, each failed
    invariant, the workspaces built per stage and, of a passing scenario, the worst error (the
    same inputs through the same code). A ``KNOWN`` scenario's error is the finding's damage,
    which for a race (FI-RACE: a peer still reading the region the next round writes) differs
    from run to run with the ranks' timing, reuse or not."""
    return (v.status, tuple(sorted(v.known)), tuple(sorted(f.invariant for f in v.failures)),
            tuple(tuple(stage) for stage in v.builds), round(v.worst, 6) if v.status == "PASS" else None,
            bool(v.testbed_error))


def differences(reused: list[Verdict], fresh: list[Verdict]) -> list[str]:
    """One line per scenario whose verdict with reuse differs from its verdict without."""
    lines = []
    for i, (a, b) in enumerate(zip(reused, fresh, strict=True), 1):
        if fingerprint(a) != fingerprint(b):
            lines.append(f"{i}: {a.scenario.label or a.scenario.short()}: with reuse {_said(a)}; "
                         f"without {_said(b)}")
    return lines


def _said(v: Verdict) -> str:
    failed = sorted({f.invariant for f in v.failures})
    builds = " ".join(f"s{s} {len(b)}" for s, b in enumerate(v.builds))
    return f"{v.status}" + (f" ({', '.join(failed)})" if failed else "") + f", builds {builds}, worst {v.worst:.3g}x"
