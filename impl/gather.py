"""Prepare/finalize without the FlashInfer all-to-alls: vLLM's default ``allgather_reducescatter``
and, with expert parallel off, the plain local one (vLLM's ``MoEPrepareAndFinalizeNoDPEP``).

Legend: T local tokens, K top_k, H hidden, N rows gathered from every rank of the group.
Neither output is reduced: every rank's experts produce a partial sum the layer completes
with its TP all-reduce (the other side of seed 002's contract).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from impl.collectives import all_gatherv, reduce_scatterv
from impl.formats import QuantConfig
from impl.forward_context import token_counts_per_rank
from impl.moe_layer import PrepareResult, scale_input_by_router_weight
from impl.quant import quantize_input


class AllGatherReduceScatter:
    """vLLM's ``allgather_reducescatter``: gather every rank's tokens (quantized, with their
    scales, ids and weights) over ``group``, run the local experts on all of them, and
    reduce-scatter the results back.

    ``group`` is the DP group, or under sequence-parallel MoE the EP group (each TP rank then
    holds its own slice of the tokens); the row counts come from the forward context.
    """

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.sizes: Optional[tuple[int, ...]] = None

    def output_is_reduced(self) -> bool:
        return False

    def topk_indices_dtype(self) -> Optional[torch.dtype]:
        return None

    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                expert_map: Optional[torch.Tensor], apply_router_weight_on_input: bool,
                quant_config: QuantConfig, defer_input_quant: bool = False) -> PrepareResult:
        sizes = self._sizes(a1.size(0))
        if apply_router_weight_on_input:
            a1 = scale_input_by_router_weight(a1, topk_weights, topk_ids)
        a1q, a1q_scale = (a1, None) if defer_input_quant else quantize_input(a1, quant_config)
        gather = lambda t: all_gatherv(t.contiguous(), sizes, self.group)  # noqa: E731
        self.sizes = sizes
        return PrepareResult(gather(a1q), None if a1q_scale is None else gather(a1q_scale), None,
                             gather(topk_ids.to(torch.int32)), gather(topk_weights.float()))

    def _sizes(self, local: int) -> tuple[int, ...]:
        W = dist.get_world_size(self.group)
        counts = token_counts_per_rank()
        sizes = (local,) * W if counts is None and W == 1 else counts
        if sizes is None or len(sizes) != W:
            raise RuntimeError(f"allgather_reducescatter over a group of {W} ranks needs one token count per rank "
                               f"in the forward context, got {sizes}")
        if sizes[dist.get_rank(self.group)] != local:
            raise ValueError(f"this rank has {local} tokens but the forward context says "
                             f"{sizes[dist.get_rank(self.group)]} (sizes {list(sizes)})")
        return tuple(sizes)

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool, weight_and_reduce_impl: Any) -> None:
        if self.sizes is None:
            raise RuntimeError("finalize called before prepare")
        if fused_expert_output.size(0) != sum(self.sizes):
            raise ValueError(f"fused_expert_output must have one row per gathered token ({sum(self.sizes)}), "
                             f"got {tuple(fused_expert_output.shape)}")
        output.copy_(reduce_scatterv(fused_expert_output, self.sizes, self.group))
        self.sizes = None


class LocalPrepareFinalize:
    """Expert parallel off: quantize, run this rank's (TP-sharded) experts on its own tokens,
    and hand their partial sums back for the TP all-reduce."""

    def output_is_reduced(self) -> bool:
        return False

    def topk_indices_dtype(self) -> Optional[torch.dtype]:
        return None

    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                expert_map: Optional[torch.Tensor], apply_router_weight_on_input: bool,
                quant_config: QuantConfig, defer_input_quant: bool = False) -> PrepareResult:
        if apply_router_weight_on_input:
            a1 = scale_input_by_router_weight(a1, topk_weights, topk_ids)
        a1q, a1q_scale = (a1, None) if defer_input_quant else quantize_input(a1, quant_config)
        return PrepareResult(a1q, a1q_scale, None, topk_ids.to(torch.int32), topk_weights.float())

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool, weight_and_reduce_impl: Any) -> None:
        output.copy_(fused_expert_output)
