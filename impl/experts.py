"""The TRT-LLM fused-MoE kernels as the layer's experts (vLLM's ``TrtLlm*Experts``), driven
from what prepare delivered, with the weights prepared by FlashInfer's own layout helpers.

Legend: L local experts, I intermediate size per rank, H hidden, N received rows, K top_k.
Logical weights are ``w1 [L, 2I, H]`` (the linear half's rows first, then the gate's: SwiGLU
is ``silu(gate) * linear``) and ``w2 [L, H, I]``; quantized formats give them as
:class:`QuantizedWeights`. The kernels take the received ``(ids, weights)`` pair as is: ids of
experts that are not local, and the invalid-lane sentinels (-1, ``num_experts``), are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from impl.backend import FlashInferAPI
from impl.compat import supports_kw
from impl.moe_layer import PrepareResult
from impl.moe_output import UnfinalizedMoEOutput
from impl.parallel import DEFERRING_FORMATS, TRTLLM_FORMATS
from impl.quant import prepare_deepseek_fp8_x_sf

EPILOGUE_TILE_M = {"bf16": 128, "fp8_block": 64, "nvfp4": 128}  # as vLLM prepares each for the kernels
BLOCK_MAJOR_K_BYTES = 128


@dataclass(frozen=True)
class QuantizedWeights:
    """Block-quantized ``[L, M, K]`` weights: fp8_block e4m3 values + fp32 ``[L, M/128, K/128]``
    scales; nvfp4 e2m1 packed ``[L, M, K/2]`` uint8 + e4m3 ``[L, M, K/16]`` scales and an fp32
    ``[L]`` global scale (``w ~ e2m1 * sf / global_scale``)."""

    values: torch.Tensor
    scales: torch.Tensor
    global_scale: Optional[torch.Tensor] = None


Weights = Union[torch.Tensor, QuantizedWeights]


# The row shuffle and scale interleave are exported by ``flashinfer`` itself (not by
# ``flashinfer.fused_moe``, which has only the gated reorder and the block layout).

def _shuffled_block_major(api: FlashInferAPI, w_LMK: torch.Tensor, tile: int, gated: bool) -> torch.Tensor:
    """Per expert: the gated row reorder, the epilogue-tile shuffle, then BlockMajorK."""
    fm, out = api.fused_moe, []
    for w in w_LMK:
        raw = w.view(torch.uint8)
        raw = fm.reorder_rows_for_gated_act_gemm(raw) if gated else raw
        out.append(fm.convert_to_block_layout(api.root.shuffle_matrix_a(raw, tile), BLOCK_MAJOR_K_BYTES).view(w.dtype))
    return torch.stack(out)


def _shuffled_fp4(api: FlashInferAPI, q: QuantizedWeights, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fm, tile, values, scales = api.fused_moe, EPILOGUE_TILE_M["nvfp4"], [], []
    for v, s in zip(q.values, q.scales):
        s = s.view(torch.uint8)
        if gated:
            v, s = fm.reorder_rows_for_gated_act_gemm(v), fm.reorder_rows_for_gated_act_gemm(s)
        values.append(api.root.shuffle_matrix_a(v, tile))
        scales.append(api.root.shuffle_matrix_sf_a(s, tile).view(torch.float8_e4m3fn).reshape(s.shape))
    return torch.stack(values), torch.stack(scales)


def pack_topk_ids_weights(ids_NK: torch.Tensor, w_NK: torch.Tensor) -> torch.Tensor:
    """int32 ``[N, K]``: ``(id << 16) | bf16 weight bits`` (ids -1 and ``num_experts`` survive the
    arithmetic shift back)."""
    return (ids_NK.to(torch.int32) << 16) | (w_NK.to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF)


class TrtLlmExperts:
    """One EP rank's (or TP rank's) experts on a TRT-LLM routed MoE kernel.

    Parameters
    ----------
    api : FlashInferAPI
    fmt : str
        ``bf16`` (bf16 activations), ``fp8_block`` (DeepSeek fp8, scales through
        :func:`impl.quant.prepare_deepseek_fp8_x_sf`) or ``nvfp4``.
    w1, w2 : torch.Tensor or QuantizedWeights
        Logical local weights (see the module docstring); bf16 tensors for ``bf16``.
    num_experts, top_k, local_expert_offset : int
        Global expert count, experts per token, and the first local expert's global id.
    a1_gscale : torch.Tensor, optional
        nvfp4 only: the activations' global scale (the kernel's input dequantization).
    weighted : bool
        False when prepare already applied the router weights (``apply_router_weight_on_input``).
    packed_routing : bool
        Hand the kernel ``(id << 16) | bf16 weight`` in one int32 (vLLM's former
        ``trtllm_moe_pack_topk_ids_weights``; the weights round to bf16) instead of the
        ``(ids, weights)`` pair vLLM passes today.
    """

    def __init__(self, api: FlashInferAPI, fmt: str, w1: Weights, w2: Weights, *, num_experts: int, top_k: int,
                 local_expert_offset: int, a1_gscale: Optional[torch.Tensor] = None, weighted: bool = True,
                 packed_routing: bool = False):
        if fmt not in TRTLLM_FORMATS:
            raise NotImplementedError(f"TRT-LLM experts implemented for {', '.join(TRTLLM_FORMATS)}; got fmt={fmt!r}")
        if fmt == "nvfp4" and a1_gscale is None:
            raise ValueError("a1_gscale: the nvfp4 kernel needs the activations' global scale")
        self.api, self.fmt, self.num_experts, self.top_k = api, fmt, num_experts, top_k
        self.local_expert_offset, self.weighted, self.a1_gscale = local_expert_offset, weighted, a1_gscale
        self.packed_routing = packed_routing
        tile = EPILOGUE_TILE_M[fmt]
        if fmt == "bf16":
            self.local_num_experts, self.intermediate = w1.size(0), w1.size(1) // 2
            self.w1 = _shuffled_block_major(api, w1.bfloat16(), tile, gated=True)
            self.w2 = _shuffled_block_major(api, w2.bfloat16(), tile, gated=False)
        elif fmt == "fp8_block":
            self.local_num_experts, self.intermediate = w1.values.size(0), w1.values.size(1) // 2
            self.w1 = _shuffled_block_major(api, w1.values, tile, gated=False)
            self.w2 = _shuffled_block_major(api, w2.values, tile, gated=False)
            self.s1, self.s2 = w1.scales.float(), w2.scales.float()
        else:
            self.local_num_experts, self.intermediate = w1.values.size(0), w1.values.size(1) // 2
            self.w1, self.s1 = _shuffled_fp4(api, w1, gated=True)
            self.w2, self.s2 = _shuffled_fp4(api, w2, gated=False)
            self.scale1 = (1.0 / (a1_gscale.float() * w1.global_scale.float())).float()
            self.scale2 = (1.0 / w2.global_scale.float()).float()

    def supports_deferred_finalize(self) -> bool:
        return self.fmt in DEFERRING_FORMATS

    def __call__(self, prepared: PrepareResult, *, defer: bool = False,
                 output: Optional[torch.Tensor] = None) -> Union[torch.Tensor, UnfinalizedMoEOutput]:
        """``[N, H]`` bf16 (into ``output`` when given), or with ``defer`` the unfinalized form."""
        if defer and not self.supports_deferred_finalize():
            raise ValueError(f"defer: the TRT-LLM {self.fmt} experts cannot stop after GEMM2")
        ids_NK = prepared.topk_ids.to(torch.int32)
        w_NK = prepared.topk_weights.float() if self.weighted else torch.ones_like(prepared.topk_weights).float()
        routing = pack_topk_ids_weights(ids_NK, w_NK) if self.packed_routing else (ids_NK, w_NK)
        fm, x = self.api.fused_moe, prepared.a1q
        common = dict(num_experts=self.num_experts, top_k=self.top_k, n_group=None, topk_group=None,
                      intermediate_size=self.intermediate, local_expert_offset=self.local_expert_offset,
                      local_num_experts=self.local_num_experts, do_finalize=not defer)
        if self.fmt == "bf16":
            kernel = fm.trtllm_bf16_routed_moe
            args = dict(topk_ids=routing, hidden_states=x, gemm1_weights=self.w1, gemm2_weights=self.w2,
                        routed_scaling_factor=None, use_shuffled_weight=True,
                        weight_layout=fm.WeightLayout.BlockMajorK, **common)
        elif self.fmt == "fp8_block":
            if prepared.a1q_scale is None:
                raise RuntimeError("TRT-LLM FP8 experts require precomputed activation scales")
            kernel = fm.trtllm_fp8_block_scale_routed_moe
            args = dict(topk_ids=routing, routing_bias=None, hidden_states=x.view(torch.float8_e4m3fn),
                        hidden_states_scale=prepare_deepseek_fp8_x_sf(x.view(torch.float8_e4m3fn),
                                                                      prepared.a1q_scale.view(torch.float32)),
                        gemm1_weights=self.w1, gemm1_weights_scale=self.s1, gemm2_weights=self.w2,
                        gemm2_weights_scale=self.s2, routed_scaling_factor=None, use_shuffled_weight=True,
                        weight_layout=fm.WeightLayout.BlockMajorK,
                        fp8_quantization_type=fm.Fp8QuantizationType.DeepSeekFp8, **common)
        else:
            kernel = fm.trtllm_fp4_block_scale_routed_moe
            args = dict(topk_ids=routing, routing_bias=None, hidden_states=x.view(torch.uint8),
                        hidden_states_scale=prepared.a1q_scale.view(torch.float8_e4m3fn).reshape(-1),
                        gemm1_weights=self.w1, gemm1_weights_scale=self.s1, gemm1_bias=None, gemm1_alpha=None,
                        gemm1_beta=None, gemm1_clamp_limit=None, gemm2_weights=self.w2,
                        gemm2_weights_scale=self.s2, gemm2_bias=None, output1_scale_scalar=self.scale1,
                        output1_scale_gate_scalar=self.scale1, output2_scale_scalar=self.scale2,
                        routed_scaling_factor=None, **common)
        if defer:
            gemm2, weights, perm = kernel(**args)
            # Given an (ids, weights) pair the kernel hands back the caller's weights buffer, fp32
            # here: the unfinalized output carries them in the activation dtype.
            return UnfinalizedMoEOutput(gemm2, weights.to(gemm2.dtype), perm.to(torch.int32).view(-1, self.top_k))
        takes_output = output is not None and supports_kw(kernel, "output", allow_var_kwargs=False)
        result = kernel(**args, output=output) if takes_output else kernel(**args)
        out_NH = result[0] if isinstance(result, (list, tuple)) else result
        if output is not None and not takes_output:
            output.copy_(out_NH)
            return output
        return out_NH
