"""The manager and prepare/finalize for an all-to-all backend named as vLLM names it."""

from __future__ import annotations

from typing import Optional, Union

import torch.distributed as dist

from impl.backend import FlashInferAPI
from impl.formats import DispatchLayout
from impl.gather import AllGatherReduceScatter, LocalPrepareFinalize
from impl.one_sided import INVALID_EXPERT_ID, OneSidedManager, OneSidedPrepareFinalize
from impl.parallel import AG_RS, NO_EP, ONE_SIDED, TWO_SIDED, ParallelConfig
from impl.two_sided import TwoSidedManager, TwoSidedPrepareFinalize

Manager = Union[OneSidedManager, TwoSidedManager]


def make_manager(parallel: ParallelConfig, api: FlashInferAPI, ep_group: dist.ProcessGroup) -> Optional[Manager]:
    """The all-to-all manager every MoE layer of an EP group shares (None: the backend has
    no FlashInfer workspace)."""
    if parallel.all2all_backend == ONE_SIDED:
        return OneSidedManager(api, ep_group)
    if parallel.all2all_backend == TWO_SIDED:
        return TwoSidedManager(api, ep_group)
    return None


def make_prepare_finalize(parallel: ParallelConfig, manager: Optional[Manager], *, dp_group: dist.ProcessGroup,
                          ep_group: dist.ProcessGroup, max_num_tokens: int, top_k: int, num_experts: int,
                          hidden_size: int, layout: DispatchLayout, invalid_expert_id: int = INVALID_EXPERT_ID):
    """One MoE layer's prepare/finalize for ``parallel.all2all_backend``.

    Parameters
    ----------
    manager : OneSidedManager or TwoSidedManager or None
        From :func:`make_manager` (grown here to this layer's payload, one-sided).
    dp_group, ep_group : ProcessGroup
        ``allgather_reducescatter`` gathers over the DP group, or under sequence-parallel
        MoE over the EP group (each TP rank then holds different tokens).
    max_num_tokens, top_k, num_experts, hidden_size, layout, invalid_expert_id
        The one-sided layer's workspace facts (see :class:`OneSidedPrepareFinalize`).
    """
    backend = parallel.all2all_backend
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
