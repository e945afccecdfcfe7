"""The caller's side of prepare/finalize: what vLLM's fused MoE layer does around them.

The reduce contract lives here: after finalize, the layer all-reduces over TP only when the
prepare/finalize says its output is not already reduced. Both FlashInfer all-to-alls reduce
inside combine, so a second all-reduce adds the same sum once per TP rank (historical bug 1:
the double reduce of seed 002).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Protocol

import torch
import torch.distributed as dist

from impl.formats import QuantConfig


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


def scale_input_by_router_weight(a1_TH: torch.Tensor, topk_weights_TK: torch.Tensor,
                                 topk_ids_TK: torch.Tensor) -> None:
    """Scale the activations by their router weight in place (only defined for top_k == 1)."""
    if topk_ids_TK.size(1) != 1:
        raise ValueError("apply_router_weight_on_input is only implemented for top_k == 1; "
                         f"got top_k={topk_ids_TK.size(1)}")
    a1_TH.mul_(topk_weights_TK.to(a1_TH.dtype))


def moe_forward(prepare_finalize: PrepareFinalize, x_TH: torch.Tensor, topk_weights_TK: torch.Tensor,
                topk_ids_TK: torch.Tensor, experts: Callable[[PrepareResult], torch.Tensor],
                quant_config: QuantConfig, *, num_experts: int, tp_group: Optional[dist.ProcessGroup] = None,
                apply_router_weight_on_input: bool = False) -> torch.Tensor:
    """One MoE layer on this rank: prepare -> experts -> finalize -> TP all-reduce if needed.

    Parameters
    ----------
    experts : callable
        ``experts(prepared) -> [N, H]``: per received row, the router-weighted sum of this rank's
        local experts (the fused experts kernel), in the activation dtype.
    tp_group : ProcessGroup, optional
        This rank's TP group; its all-reduce runs only when ``output_is_reduced()`` is False.

    Returns
    -------
    torch.Tensor
        ``[T, H]`` in ``x_TH``'s dtype.
    """
    prepared = prepare_finalize.prepare(x_TH, topk_weights_TK, topk_ids_TK, num_experts, None,
                                        apply_router_weight_on_input, quant_config)
    fused_out = experts(prepared)
    output = torch.empty(x_TH.shape, dtype=x_TH.dtype, device=x_TH.device)
    prepare_finalize.finalize(output, fused_out, topk_weights_TK, topk_ids_TK,
                              apply_router_weight_on_input, None)
    if tp_group is not None and dist.get_world_size(tp_group) > 1 and not prepare_finalize.output_is_reduced():
        dist.all_reduce(output, group=tp_group)
    return output
