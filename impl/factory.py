"""The manager and prepare/finalize for an all-to-all backend named as vLLM names it."""

from __future__ import annotations

from typing import Optional, Union

import torch.distributed as dist

from impl.backend import FlashInferAPI
from impl.formats import DispatchLayout
from impl.gather import AllGatherReduceScatter, LocalPrepareFinalize
from impl.moe_ep import MoeEpManager, MoeEpPrepareFinalize
from impl.one_sided import INVALID_EXPERT_ID, OneSidedManager, OneSidedPrepareFinalize
from impl.parallel import AG_RS, NO_EP, ONE_SIDED, TWO_SIDED, ParallelConfig
from impl.two_sided import TwoSidedManager, TwoSidedPrepareFinalize

Manager = Union[OneSidedManager, TwoSidedManager, MoeEpManager]


def make_manager(parallel: ParallelConfig, api: FlashInferAPI, ep_group: dist.ProcessGroup,
                 a2a_api: Optional[str] = None) -> Optional[Manager]:
    """The all-to-all manager every MoE layer of an EP group shares (None: the backend has
    no FlashInfer workspace).

    ``a2a_api`` chooses the FlashInfer API that carries the all-to-all (``"comm"``:
    ``MoeAlltoAll`` / ``MnnvlMoe``; ``"moe_ep"``: the NVLink backends of ``flashinfer.moe_ep``);
    None takes what :meth:`impl.backend.FlashInferAPI.a2a_api` finds.
    """
    backend = parallel.all2all_backend
    if backend not in (ONE_SIDED, TWO_SIDED):
        return None
    two_sided = backend == TWO_SIDED
    if api.a2a_api(two_sided, a2a_api) == "moe_ep":
        return MoeEpManager(api, ep_group, "two_sided" if two_sided else "one_sided")
    return TwoSidedManager(api, ep_group) if two_sided else OneSidedManager(api, ep_group)


def make_prepare_finalize(parallel: ParallelConfig, manager: Optional[Manager], *, dp_group: dist.ProcessGroup,
                          ep_group: dist.ProcessGroup, max_num_tokens: int, top_k: int, num_experts: int,
                          hidden_size: int, layout: DispatchLayout, invalid_expert_id: int = INVALID_EXPERT_ID):
    """One MoE layer's prepare/finalize for ``parallel.all2all_backend``.

    Parameters
    ----------
    manager : OneSidedManager or TwoSidedManager or MoeEpManager or None
        From :func:`make_manager` (grown here to this layer's payload, one-sided; a
        ``MoeEpManager`` builds this layer's communication).
    dp_group, ep_group : ProcessGroup
        ``allgather_reducescatter`` gathers over the DP group, or under sequence-parallel
        MoE over the EP group (each TP rank then holds different tokens).
    max_num_tokens, top_k, num_experts, hidden_size, layout, invalid_expert_id
        The one-sided layer's workspace facts (see :class:`OneSidedPrepareFinalize`).
    """
    backend = parallel.all2all_backend
    if backend in (ONE_SIDED, TWO_SIDED) and isinstance(manager, MoeEpManager):
        kind = "two_sided" if backend == TWO_SIDED else "one_sided"
        if manager.kind != kind:
            raise TypeError(f"{backend} needs a {kind} MoeEpManager (make_manager), got a {manager.kind} one")
        # The two-sided path marks rows and lanes without a local token with num_experts.
        return MoeEpPrepareFinalize(manager, max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                                    hidden_size=hidden_size, layout=layout,
                                    invalid_expert_id=invalid_expert_id if backend == ONE_SIDED else num_experts)
    if backend == ONE_SIDED:
        _require(manager, OneSidedManager, backend)
        return OneSidedPrepareFinalize(manager, max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                                       hidden_size=hidden_size, layout=layout, invalid_expert_id=invalid_expert_id)
    if backend == TWO_SIDED:
        _require(manager, TwoSidedManager, backend)
        return TwoSidedPrepareFinalize(manager)
    if backend == AG_RS:
        return AllGatherReduceScatter(ep_group if parallel.use_sequence_parallel_moe else dp_group)
    assert backend == NO_EP, backend
    if parallel.dp > 1:
        raise NotImplementedError(
            f"all2all_backend={NO_EP!r} with dp={parallel.dp}: with expert parallel off vLLM flattens TP across "
            "DP and gathers every DP rank's tokens naively; impl implements expert parallel off for dp = 1 only")
    return LocalPrepareFinalize()


def _require(manager, cls: type, backend: str) -> None:
    if not isinstance(manager, cls):
        raise TypeError(f"{backend} needs a {cls.__name__} (make_manager), got {type(manager).__name__}")
