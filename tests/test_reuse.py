"""Process groups reused across scenarios, held to a run without reuse (:mod:`testbed.harness.reuse`)."""

from __future__ import annotations

from testbed import integrations
from testbed.harness import reuse, runner


def _both(scenarios) -> tuple[list, list]:
    with runner.scenario_pool() as pool:
        reused = [runner.run(pool, sc) for sc in scenarios]
    with runner.scenario_pool(reuse_groups=False) as pool:
        fresh = [runner.run(pool, sc) for sc in scenarios]
    return reused, fresh


def test_reuse_differential_catches_a_session_kept_per_group(no_leaks):
    """A planted leak (an integration that keeps its session, manager and workspaces, per
    process group): made fresh, every scenario passes; with reuse, the second runs on the first's
    session, and the differential names it."""
    scenarios = integrations.register("toy_integration.leaky").matrix()
    reused, fresh = _both(scenarios)
    assert [v.status for v in fresh] == ["PASS", "PASS"], [v.failures for v in fresh]
    lines = reuse.differences(reused, fresh)
    assert len(lines) == 1 and lines[0].startswith("2: toy-leaky: bf16:16: with reuse FAIL"), lines


def test_reuse_differential_same_verdicts_without_a_leak(no_leaks):
    """The toy integration, whose sessions are its scenario's own, judged twice on a world
    that reuses groups (the second time on the first's groups) and on fresh ones: the same."""
    toy = integrations.register("toy_integration")
    scenarios = toy.matrix() * 2
    reused, fresh = _both(scenarios)
    assert all(v.passed for v in reused + fresh)
    assert reuse.differences(reused, fresh) == []
