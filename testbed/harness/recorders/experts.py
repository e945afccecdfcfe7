"""The layer's experts recorded: what each forward hands them."""

from __future__ import annotations

from collections import Counter

from testbed.scenario.events import EventLog, ExpertsCall
from testbed.scenario.reference import lane_keys


class RecordingExperts:
    """The layer's experts, logging what each forward hands them: whether to defer, whether
    into the workspace, and the ``(expert, weight)`` lanes of this rank's experts."""

    def __init__(self, experts, log: EventLog, own: range):
        self.experts, self.log, self.own = experts, log, own
        self.lanes: Counter = Counter()

    def supports_deferred_finalize(self) -> bool:
        return self.experts.supports_deferred_finalize()

    def __call__(self, prepared, *, defer: bool = False, output=None):
        self.lanes.update(lane_keys(prepared.topk_ids.cpu(), prepared.topk_weights.cpu(), self.own))
        self.log.write(ExpertsCall(defer=defer, region=output is not None))
        return self.experts(prepared, defer=defer, output=output)
