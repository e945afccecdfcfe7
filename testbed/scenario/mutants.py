"""The historical bugs (SPEC.md section 4), re-created as subclasses of the integration.

A test runs a mutant to prove the testbed catches that bug: the same scenario must pass with
the real class and fail, in the documented way, with the mutant. Scenarios pick them by name
(``MANAGERS`` / ``PREPARE_FINALIZES``), so rank programs stay picklable.
"""

from __future__ import annotations

import torch.distributed as dist

from impl.one_sided import OneSidedManager, OneSidedPrepareFinalize
from impl.two_sided import TwoSidedPrepareFinalize


class FirstLayerWorkspaceManager(OneSidedManager):
    """Bug 2 (seed 001): the workspace is built once, for the first layer, and never grown."""

    def initialize(self, *args, **kwargs) -> None:
        if not self.initialized:
            super().initialize(*args, **kwargs)


class WorldBarrierManager(OneSidedManager):
    """Bug 3 (seed 001): the rebuild barrier on the world group instead of the EP group."""

    def _barrier_after_build(self) -> None:
        dist.barrier()


class UnprobedOutputManager(OneSidedManager):
    """Bug 4 (seed 000): ``combine(output=...)`` passed without asking FlashInfer first."""

    def _build(self) -> None:
        super()._build()
        self.combine_supports_output = True


class DoubleReduceOneSided(OneSidedPrepareFinalize):
    """Bug 1 (seed 002): claims its combined output still needs the TP all-reduce."""

    def output_is_reduced(self) -> bool:
        return False


class DoubleReduceTwoSided(TwoSidedPrepareFinalize):
    """Bug 1 on the two-sided path (vLLM's two-sided prepare/finalize returned False too)."""

    def output_is_reduced(self) -> bool:
        return False


MANAGERS = {
    "one_sided": OneSidedManager,
    "first_layer_workspace": FirstLayerWorkspaceManager,
    "world_barrier": WorldBarrierManager,
    "unprobed_output": UnprobedOutputManager,
}
PREPARE_FINALIZES = {
    "one_sided": OneSidedPrepareFinalize,
    "two_sided": TwoSidedPrepareFinalize,
    "double_reduce_one_sided": DoubleReduceOneSided,
    "double_reduce_two_sided": DoubleReduceTwoSided,
}
