"""One-layer MoE cases (``MoECase``) and the rank programs that drive ``impl`` through them
(``run_layers``, ``forward_layer``), for the unit-level tests and ``gpu_tests``; the
scenario model (:mod:`testbed.scenario.model`) describes whole deployments.

Legend: T tokens of a DP rank, K top_k, H hidden, E experts.
Every rank rebuilds every DP rank's tokens and every expert's weights from the case's seed,
so the reference needs no communication. Inputs are exactly representable in the case's
format (:func:`testbed.scenario.reference.representable`), so the reference is the dense
fp32 MoE of the inputs as given and never quantizes. Expert e is the linear map ``x @ W_e``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from impl.formats import QuantConfig, dispatch_layout
from impl.forward_context import forward_context
from impl.moe_layer import MoELayer, MoELayerConfig
from impl.parallel import ONE_SIDED, TWO_SIDED, ParallelConfig
from impl.factory import make_manager, make_prepare_finalize
from impl.moe_ep import MoeEpManager, MoeEpPrepareFinalize
from impl.one_sided import OneSidedManager
from impl.two_sided import TwoSidedPrepareFinalize
from testbed.scenario.rank import forward_pass_token_counts, quant_config, rank_api, rank_device
from testbed.scenario.experts import Experts
from testbed.scenario.reference import (
    ACT_DTYPE,
    dense_moe,
    linear_expert,
    expert_weight,
    local_experts,
    representable,
)

FORMATS = ("bf16", "nvfp4", "mxfp8", "fp8_block")


@dataclass(frozen=True)
class MoECase:
    """One MoE layer's shapes, activation format and inputs (by seed)."""

    num_experts: int
    top_k: int
    hidden: int
    tokens_per_dp: tuple[int, ...]
    fmt: str = "bf16"
    seed: int = 0
    mx_alignment: int = 0
    max_num_tokens: Optional[int] = None  # the layer's workspace bound; default max(tokens_per_dp, 1)

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {self.fmt!r}")

    @property
    def max_tokens(self) -> int:
        return self.max_num_tokens or max(max(self.tokens_per_dp), 1)

    def quant_config(self) -> QuantConfig:
        return quant_config(self.fmt, self.mx_alignment)


def rank_inputs(case: MoECase, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_TH bf16, topk_ids_TK int32 distinct, topk_weights_TK fp32)`` of ``dp_rank``."""
    g = torch.Generator().manual_seed(case.seed * 7919 + dp_rank)
    T, K, E, H = case.tokens_per_dp[dp_rank], case.top_k, case.num_experts, case.hidden
    x_TH = representable(case.fmt, T, H, g)
    ids_TK = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K].to(torch.int32)
    w_TK = torch.softmax(torch.randn(T, K, generator=g), dim=1)
    return x_TH, ids_TK, w_TK


def case_weight(case: MoECase, expert: int) -> torch.Tensor:
    """Expert ``expert`` of ``case``: the linear map ``x @ W``, fp32 ``[H, H]``."""
    return expert_weight(case.seed, 0, 0, expert, case.hidden)


def reference_output(case: MoECase, dp_rank: int) -> torch.Tensor:
    """Dense fp32 ``[T, H]``: ``sum_k w[t,k] * (x[t] @ W_ids[t,k])``."""
    return dense_moe(*rank_inputs(case, dp_rank), linear_expert(functools.partial(case_weight, case)))


def case_experts(case: MoECase, ep_size: int, ep_rank: int) -> Experts:
    """The experts of EP rank ``ep_rank`` for ``case``."""
    return Experts(case.fmt, case.hidden, local_experts(case.num_experts, ep_size, ep_rank),
                   functools.partial(case_weight, case))


@dataclass
class LayersResult:
    """What :func:`run_layers` reports from one rank."""

    dp_rank: int
    builds: list[int] = field(default_factory=list)  # manager.builds after each layer's constructor
    workspace_sizes: list[int] = field(default_factory=list)
    rebuilt: list[bool] = field(default_factory=list)  # a new MoeAlltoAll object after the constructor
    probe: Optional[bool] = None  # the manager's combine_supports_output at the end
    outputs: list[torch.Tensor] = field(default_factory=list)


def run_layers(ctx, stages: tuple[tuple[MoECase, ...], ...], *, kind: str = "one_sided", profile: str = "0.7.2",
               slot_order: str = "shuffled", forward: bool = True, backend: str = "fake",
               a2a_api: Optional[str] = None) -> LayersResult:
    """Build this rank's pipeline stage's layers (``stages[pp_rank]``) on one shared manager,
    then run each layer's forward on this DP rank's tokens.

    ``kind`` is ``"one_sided"`` or ``"two_sided"``. ``backend="flashinfer"`` drives the
    real package on this rank's GPU (``profile`` and ``slot_order`` are the fake's); outputs
    come back on the CPU either way. ``a2a_api`` (``"comm"`` or ``"moe_ep"``) picks the
    FlashInfer API; None takes what the release offers (``comm`` first).
    """
    device = rank_device(ctx, backend)
    api = rank_api(ctx, backend, profile, slot_order)
    ep_group = ctx.groups["ep"]
    layers = stages[ctx.coords.pp_rank]
    result = LayersResult(dp_rank=ctx.coords.dp_rank)
    parallel = _parallel(ctx, kind)
    mgr = make_manager(parallel, api, ep_group, a2a_api)
    pfs = []
    for case in layers:
        before = getattr(mgr, "moe_alltoall", None)
        pfs.append(make_prepare_finalize(parallel, mgr, dp_group=ctx.groups["dp"], ep_group=ep_group,
                                         max_num_tokens=case.max_tokens, top_k=case.top_k, num_experts=case.num_experts,
                                         hidden_size=case.hidden,
                                         layout=dispatch_layout(case.hidden, case.quant_config(), ACT_DTYPE)))
        if isinstance(mgr, (OneSidedManager, MoeEpManager)):
            result.builds.append(mgr.builds)
        if isinstance(mgr, OneSidedManager):
            result.workspace_sizes.append(mgr.workspace_size)
            result.rebuilt.append(mgr.moe_alltoall is not before)
    if isinstance(mgr, OneSidedManager):
        result.probe = mgr.combine_supports_output
    if forward:
        result.outputs = [forward_layer(ctx, pf, case, device).cpu() for case, pf in zip(layers, pfs)]
    return result


def _parallel(ctx, kind: str) -> ParallelConfig:
    """This rank's stage as vLLM's parallel config of the ``kind`` all-to-all, SP off."""
    if kind not in ("one_sided", "two_sided"):
        raise ValueError(f"kind must be 'one_sided' or 'two_sided', got {kind!r}")
    return ParallelConfig(tp=dist.get_world_size(ctx.groups["tp"]), dp=dist.get_world_size(ctx.groups["dp"]),
                          all2all_backend=TWO_SIDED if kind == "two_sided" else ONE_SIDED, sequence_parallel_moe=False)


def case_layer(ctx, pf, case: MoECase) -> MoELayer:
    """``case`` as a :class:`MoELayer` over ``pf`` with this EP rank's experts."""
    ep_group = ctx.groups["ep"]
    two_sided = isinstance(pf, TwoSidedPrepareFinalize) or isinstance(pf, MoeEpPrepareFinalize) \
        and pf.manager.kind == "two_sided"
    parallel = _parallel(ctx, "two_sided" if two_sided else "one_sided")
    experts = case_experts(case, dist.get_world_size(ep_group), dist.get_rank(ep_group))
    return MoELayer(MoELayerConfig(case.num_experts, case.top_k, case.hidden, case.quant_config()), parallel, pf,
                    experts, tp_group=ctx.groups["tp"])


def forward_layer(ctx, pf, case: MoECase, device: Optional[torch.device] = None) -> torch.Tensor:
    """One forward pass of one layer on this rank's DP tokens: the token-count exchange, then
    :func:`case_layer`. Returns ``[T, H]`` on ``device`` (default the CPU)."""
    device = torch.device("cpu") if device is None else device
    ep_group = ctx.groups["ep"]
    x_TH, ids_TK, w_TK = (t.to(device) for t in rank_inputs(case, ctx.coords.dp_rank))
    counts = forward_pass_token_counts(ep_group, ctx.coords.dp_rank, ctx.layout.dp, x_TH.size(0))
    with forward_context(counts):
        return case_layer(ctx, pf, case)(x_TH, w_TK, ids_TK)


def one_sided_manager(ctx, api) -> OneSidedManager:
    """``api``'s one-sided manager (``MoeAlltoAll``) over this rank's EP group, not yet
    initialized, as vLLM's one-sided backend makes it."""
    return make_manager(_parallel(ctx, "one_sided"), api, ctx.groups["ep"], "comm")


