"""The fuzz loop of ``a2a-testbed fuzz``: Hypothesis draws scenarios from an integration's
strategy (:meth:`testbed.integrations.base.Integration.strategy`), each is run and judged, and
a failing one is shrunk and raised with its reproducing line."""

from __future__ import annotations

from typing import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed

from testbed.scenario.model import Scenario


class ScenarioFailed(AssertionError):
    def __init__(self, verdict):
        self.verdict = verdict
        super().__init__(f"{verdict.scenario.to_cli()}\n"
                         + "\n".join(f"[{f.invariant}] {f.evidence[:300]}" for f in verdict.failures))


def fuzz(check: Callable[[Scenario], object], *, examples: int, strategy, seed: int | None = None) -> None:
    """Run ``check(scenario)`` (which returns a :class:`Verdict`) on ``examples`` scenarios
    ``strategy`` draws; a failing one is shrunk and raised as :class:`ScenarioFailed`. With ``seed``
    None the draw is derandomized (the same scenarios every time)."""

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy)
    def prop(sc: Scenario) -> None:
        verdict = check(sc)
        if not verdict.passed:
            raise ScenarioFailed(verdict)

    if seed is not None:
        prop = hyp_seed(seed)(prop)
    prop()
