"""The caller's side of prepare/finalize: vLLM's fused MoE layer around them.

Legend: T tokens of this rank, C its sequence-parallel chunk, K top_k, H hidden, N rows the
experts receive.

The reduce contract lives here: the layer all-reduces over TP only when the prepare/finalize
says its output is not already reduced. Both FlashInfer all-to-alls reduce inside combine,
so a second all-reduce adds the same sum once per TP rank (historical bug 1: the double
reduce of seed 002). Under sequence-parallel MoE each TP rank routes only its chunk of the
tokens and the chunks are all-gathered over TP at the end (seed 003). A layer returns a
:class:`impl.moe_output.MoEOutput` from :meth:`MoELayer.forward` (``reduce_results=False``)
and the finalized tensor from calling it (seed 004).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Protocol, Union

import torch
import torch.distributed as dist

from impl.collectives import all_gatherv
from impl.formats import ActivationFormat, QuantConfig, activation_format
from impl.forward_context import sequence_parallel_active, sequence_parallel_sizes, sp_chunk
from impl.moe_output import MoEOutput, UnfinalizedMoEOutput, finalize_moe_output
from impl.parallel import EXPERT_OUTPUTS, ParallelConfig, check_supported


class PrepareResult(NamedTuple):
    """What prepare hands the experts (vLLM's ``PrepareResultType``)."""

    a1q: torch.Tensor  # [N, Hq] received activations (quantized bytes when quantized)
    a1q_scale: Optional[torch.Tensor]  # [N, C] their scales, or None
    expert_tokens_meta: Any  # always None here (standard activation format)
    topk_ids: torch.Tensor  # [N, K] global expert ids of each received row
    topk_weights: torch.Tensor  # [N, K] fp32 router weights


class PrepareFinalize(Protocol):
    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                num_experts: int, expert_map: Optional[torch.Tensor], apply_router_weight_on_input: bool,
                quant_config: QuantConfig, defer_input_quant: bool = False) -> PrepareResult: ...

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool, weight_and_reduce_impl: Any) -> None: ...

    def output_is_reduced(self) -> bool: ...

    def topk_indices_dtype(self) -> Optional[torch.dtype]:
        """The dtype ``prepare`` needs the ids in (the router converts them), or None: any."""


class ExpertsKernel(Protocol):
    def __call__(self, prepared: PrepareResult, *, defer: bool = False,
                 output: Optional[torch.Tensor] = None) -> Union[torch.Tensor, UnfinalizedMoEOutput]:
        """Per received row, the router-weighted sum of this rank's experts over the row's
        lanes (``[N, H]`` in the activation dtype, written into ``output`` when given), or
        with ``defer`` the :class:`UnfinalizedMoEOutput` before that sum."""

    def supports_deferred_finalize(self) -> bool: ...


def scale_input_by_router_weight(a1_TH: torch.Tensor, topk_weights_TK: torch.Tensor,
                                 topk_ids_TK: torch.Tensor) -> torch.Tensor:
    """The activations times their router weight (only defined for top_k == 1); the caller's
    tensor is left alone (the shared experts read it too)."""
    if topk_ids_TK.size(1) != 1:
        raise ValueError("apply_router_weight_on_input is only implemented for top_k == 1; "
                         f"got top_k={topk_ids_TK.size(1)}")
    return a1_TH * topk_weights_TK.to(a1_TH.dtype)


# ActivationFormat -> the support table's column.
_FORMAT_COLUMN = {ActivationFormat.UNQUANTIZED: "bf16", ActivationFormat.NVFP4: "nvfp4",
                  ActivationFormat.MXFP8: "mxfp8", ActivationFormat.FP8_BLOCK: "fp8_block"}


@dataclass(frozen=True)
class MoELayerConfig:
    """One MoE layer's model facts (vLLM's ``FusedMoEConfig`` fields the layer reads).

    ``expert_output``: ``"separate"`` (the experts write their own tensor) or
    ``"workspace"`` (straight into the one-sided combine region, no staging copy).
    """

    num_experts: int
    top_k: int
    hidden: int
    quant_config: QuantConfig
    activation_dtype: torch.dtype = torch.bfloat16
    routed_scaling_factor: float = 1.0
    apply_router_weight_on_input: bool = False
    expert_output: str = "separate"


class MoELayer:
    """prepare -> experts -> finalize, plus shared experts, deferral and sequence parallel.

    Parameters
    ----------
    config : MoELayerConfig
    parallel : ParallelConfig
        Decides sequence parallel (:attr:`ParallelConfig.use_sequence_parallel_moe`) and
        deferral (:attr:`ParallelConfig.use_deferred_moe_finalize`); the activation format
        and the expert output are checked against :data:`impl.parallel.SUPPORT` here.
    prepare_finalize : PrepareFinalize
        From :func:`impl.factory.make_prepare_finalize` for ``parallel``'s backend.
    experts : ExpertsKernel
    tp_group : ProcessGroup, optional
        This rank's TP group (``parallel.tp`` ranks; may be None only when that is 1): the
        final all-reduce and the sequence-parallel all-gather.
    shared_experts : callable, optional
        ``shared_experts(x_TH) -> [T, H]`` in the activation dtype; a TP-partial sum exactly
        when :attr:`reduce_pending` (the rank shards them like the routed experts).
    """

    def __init__(self, config: MoELayerConfig, parallel: ParallelConfig, prepare_finalize: PrepareFinalize,
                 experts: ExpertsKernel, *, tp_group: Optional[dist.ProcessGroup] = None,
                 shared_experts: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        if config.expert_output not in EXPERT_OUTPUTS:
            raise ValueError(f"expert_output must be one of {EXPERT_OUTPUTS}, got {config.expert_output!r}")
        fmt = _FORMAT_COLUMN[activation_format(config.quant_config, config.activation_dtype)]
        check_supported(parallel.all2all_backend, fmt, workspace_output=config.expert_output == "workspace")
        tp_size = 1 if tp_group is None else dist.get_world_size(tp_group)
        if tp_size != parallel.tp:
            raise ValueError(f"tp_group has {tp_size} rank(s) but parallel.tp is {parallel.tp}"
                             + (" (give the TP group)" if tp_group is None else ""))
        self.config, self.parallel, self.prepare_finalize, self.experts = config, parallel, prepare_finalize, experts
        self.tp_group, self.shared_experts = tp_group, shared_experts

    @property
    def sequence_parallel(self) -> bool:
        return self.parallel.use_sequence_parallel_moe

    @property
    def reduce_pending(self) -> bool:
        """Whether the parts of this layer's :class:`MoEOutput` are TP-partial sums: the
        prepare/finalize does not reduce, and no sequence-parallel reduce-scatter over the
        whole EP group did it either."""
        return not self.prepare_finalize.output_is_reduced() and not self.sequence_parallel

    def _tp(self) -> tuple[int, int]:
        if self.tp_group is None:
            return 0, 1
        return dist.get_rank(self.tp_group), dist.get_world_size(self.tp_group)

    def forward(self, x_TH: torch.Tensor, topk_weights_TK: torch.Tensor, topk_ids_TK: torch.Tensor) -> MoEOutput:
        """This rank's tokens through the experts, the reduce left open (``reduce_results=False``).

        Returns
        -------
        MoEOutput
            ``routed`` is an :class:`UnfinalizedMoEOutput` only when deferral is on
            (:attr:`ParallelConfig.use_deferred_moe_finalize`), this rank has tokens and the
            experts can defer.
        """
        cfg, pf = self.config, self.prepare_finalize
        if self.sequence_parallel and not sequence_parallel_active():
            raise RuntimeError("under sequence-parallel MoE, forward takes this TP rank's chunk inside "
                               "sequence_parallel_sizes(tp); call the layer, which chunks and all-gathers")
        T = x_TH.size(0)
        shared = self.shared_experts(x_TH) if self.shared_experts is not None else None
        defer = self.parallel.use_deferred_moe_finalize and T > 0 and self.experts.supports_deferred_finalize()
        prepared = pf.prepare(x_TH, topk_weights_TK, topk_ids_TK, cfg.num_experts, None,
                              cfg.apply_router_weight_on_input, cfg.quant_config)
        buffer = pf.expert_output_buffer(cfg.activation_dtype) if cfg.expert_output == "workspace" else None
        fused = self.experts(prepared, defer=defer, output=buffer)
        if isinstance(fused, UnfinalizedMoEOutput):
            if not defer:
                raise RuntimeError("the experts returned an UnfinalizedMoEOutput although this forward does not "
                                   "defer finalize")
            return MoEOutput(fused, shared, cfg.routed_scaling_factor)
        routed = torch.empty(x_TH.shape, dtype=cfg.activation_dtype, device=x_TH.device)
        pf.finalize(routed, fused, topk_weights_TK, topk_ids_TK, cfg.apply_router_weight_on_input, None)
        return MoEOutput(routed, shared, cfg.routed_scaling_factor)

    def __call__(self, x_TH: torch.Tensor, topk_weights_TK: torch.Tensor, topk_ids_TK: torch.Tensor) -> torch.Tensor:
        """The finalized ``[T, H]`` (activation dtype) of this DP rank's tokens: under sequence
        parallel this TP rank's chunk goes through :meth:`forward` and the chunks are
        all-gathered over TP; then :func:`finalize_moe_output` (the one consumer)."""
        tp_rank, tp_size = self._tp()
        T = x_TH.size(0)
        if not self.sequence_parallel:
            return self._finalized(self.forward(x_TH, topk_weights_TK, topk_ids_TK), T)
        rows = sp_chunk(T, tp_size, tp_rank)
        chunk = slice(rows.start, rows.stop)
        with sequence_parallel_sizes(tp_size):
            out = self.forward(x_TH[chunk], topk_weights_TK[chunk], topk_ids_TK[chunk])
        sizes = tuple(len(sp_chunk(T, tp_size, t)) for t in range(tp_size))
        return all_gatherv(self._finalized(out, len(rows)), sizes, self.tp_group)

    def _finalized(self, out: MoEOutput, num_tokens: int) -> torch.Tensor:
        cfg = self.config
        return finalize_moe_output(out, activation_dtype=cfg.activation_dtype, num_tokens=num_tokens,
                                   top_k=cfg.top_k, hidden=cfg.hidden, tp_group=self.tp_group,
                                   reduce=self.reduce_pending)
