"""Fake TRT-LLM-gen fused MoE entry points: reference math on CPU, real signatures per profile.

Legend: T tokens, K top_k, H hidden, I intermediate, L local experts, P permuted rows.

What is reproduced: the signatures of each release (``inspect.signature`` sees them), the
routing inputs (logits with the softmax/top-k methods, packed ``(id << 16) | bf16 weight``,
or an ``(ids, weights)`` pair), the weight layouts the kernels read (inverted here: gated row
reorder, epilogue-tile row shuffle, BlockMajorK, 128x4 scale interleave), only local experts
``[local_expert_offset, + local_num_experts)`` computed, SwiGLU (``silu(gate) * linear``, the
linear half first) or Relu2, and both return forms: ``do_finalize=True`` the ``[T, H]``
output (a bare tensor for bf16/fp8, ``[output]`` for fp4), ``do_finalize=False``
``[gemm2_output [P, H] (permuted, unweighted, each expert's rows padded to PERMUTE_TILE,
padding NaN), expert_weights [T, K] (activation dtype), expanded_idx_to_permuted_idx [T*K]
int32 (-1: expert not local)]``.

What is not: speed, and the kernels' intermediate requantization (GEMM1's output is kept in
fp32 before GEMM2). The epilogue tiles the weights must be shuffled for are the fake's
assumption where no FlashInfer helper fixes it (128 for bf16 as FlashInfer's own bf16 preparation,
64 for DeepSeek fp8, 128 for fp4), as is PERMUTE_TILE (the real
padding depends on the tuned tile). Inside an expert, permuted rows follow the fake's slot
order (shuffled by default), so nothing may depend on it.
"""

from __future__ import annotations

import inspect

import torch

from fakes.flashinfer import profiles, tllm_enums
from fakes.flashinfer._check import icheck
from fakes.flashinfer.comm.moe_a2a_kernels import SlotOrder
from fakes.flashinfer.fused_moe import layouts
from fakes.flashinfer.tllm_enums import SfLayout, WeightLayout

PERMUTE_TILE = 8
# The epilogue tile the kernels read each format's weights shuffled for: 128 for bf16 (FlashInfer's
# prepare_trtllm_bf16_weights, its BF16 MoE test, vLLM's and SGLang's bf16 block layouts), 64 for
# DeepSeek fp8 (vLLM's _shuffle_deepseek_fp8_moe_weights), 128 for fp4.
EPILOGUE_TILE_M = {"bf16": 128, "fp8": 64, "fp4": 128}
_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_REQUIRED = inspect.Parameter.empty


# --- the weight-layout helpers (the real module defines them; the package re-exports them) ----


def convert_to_block_layout(input_tensor, blockK: int):
    """``[M, K]`` -> ``[K / blockK, M, blockK]`` (``blockK`` in elements of the tensor given)."""
    return layouts.to_block_major_k(input_tensor, blockK)


def reorder_rows_for_gated_act_gemm(x):
    return x[layouts.gated_reorder_indices(x.shape[0])]


def _maybe_get_cached_w3_w1_permute_indices(_cache_permute_indices, dst_w3_w1_weight, epilogue_tile_m: int,
                                            num_elts_per_sf=None, is_gated_act_gemm: bool = True):
    """The rows of GEMM1's weight in the order the kernel reads them (``new[i] = old[idx[i]]``):
    the gated reorder, then the epilogue-tile shuffle; memoized in the caller's dict by the
    same key as FlashInfer's."""
    key = ("w3_w1", dst_w3_w1_weight.shape, epilogue_tile_m, num_elts_per_sf, is_gated_act_gemm)
    if key not in _cache_permute_indices:
        m = dst_w3_w1_weight.shape[0]
        first = layouts.gated_reorder_indices(m) if is_gated_act_gemm else torch.arange(m)
        _cache_permute_indices[key] = first[_shuffle_rows(m, epilogue_tile_m, num_elts_per_sf)]
    return _cache_permute_indices[key]


def get_w2_permute_indices_with_cache(_cache_permute_indices, dst_w2_weight, epilogue_tile_m: int, num_elts_per_sf=None,
                                      is_gated_act_gemm=None):
    """GEMM2's weight rows in the kernel's order: the epilogue-tile shuffle alone."""
    key = ("w2", dst_w2_weight.shape, epilogue_tile_m, num_elts_per_sf, is_gated_act_gemm)
    if key not in _cache_permute_indices:
        _cache_permute_indices[key] = _shuffle_rows(dst_w2_weight.shape[0], epilogue_tile_m, num_elts_per_sf)
    return _cache_permute_indices[key]


def _shuffle_rows(m: int, epilogue_tile_m: int, num_elts_per_sf) -> torch.Tensor:
    if num_elts_per_sf is not None:  # the scale factors' shuffle (shuffle_matrix_sf_a's rows)
        raise NotImplementedError("the CPU fake's permute-index helpers shuffle weight rows only "
                                  f"(num_elts_per_sf=None), got num_elts_per_sf={num_elts_per_sf}")
    return layouts.shuffle_indices(m, epilogue_tile_m)


# --- routing ---------------------------------------------------------------------------------

# RoutingCustomPolicy's largest tier: precomputed routing runs only where a tier covers
# (num_experts, top_k) (trtllm_fused_moe_routing_common.cu, runPostTopKPipeline).
_ROUTING_TIER_MAX = (2048, 32)


# Whether the routed entries read topk_ids as an (ids, weights) pair: from 0.6.12 on (its fp4
# entry declares the pair first; the others' annotations refuse it until they do).
_READS_PAIR = {"0.6.8": False, "0.6.12": True, "0.7.4": True}


def _precomputed_routing(topk_ids, top_k: int, num_experts: int):
    """``(ids [T, K] long, weights [T, K] fp32)`` from a packed tensor or an (ids, weights) pair."""
    icheck(0 < top_k <= num_experts, "args->top_k > 0 && args->top_k <= args->num_experts",
           "top_k must be between 1 and num_experts")
    if num_experts > _ROUTING_TIER_MAX[0] or top_k > _ROUTING_TIER_MAX[1]:
        raise RuntimeError(f"runPostTopKPipeline: no compiled tier covers numExperts={num_experts} topK={top_k} "
                           "for the post-topK permutation")
    if isinstance(topk_ids, tuple):
        if not profiles.pick(_READS_PAIR):
            raise TypeError(f"flashinfer {profiles.release()}'s routed MoE takes topk_ids as one packed int32 tensor "
                            "((id << 16) | bf16 weight); it was given a tuple, which its C++ op cannot take")
        ids, weights = topk_ids
        icheck(ids.dtype == torch.int32, "topk_ids.dtype() == dl_int32", "topk_ids must be int32")
        icheck(weights.dtype in (torch.bfloat16, torch.float32),
               "topk_weights.dtype() == dl_bfloat16 || topk_weights.dtype() == dl_float32",
               "topk_weights must be bfloat16 or float32")
        icheck(tuple(weights.shape) == tuple(ids.shape), "topk_weights.sizes() == topk_ids.sizes()",
               "topk_weights and topk_ids must have the same shape")
        ids_TK, w_TK = ids.long(), weights.float()
    else:
        icheck(topk_ids.dtype == torch.int32, "topk_ids.dtype() == dl_int32", "packed topk_ids must be int32")
        ids_TK = (topk_ids >> 16).long()
        w_TK = (topk_ids & 0xFFFF).to(torch.int16).view(torch.bfloat16).float()
    icheck(ids_TK.dim() == 2 and ids_TK.size(1) == top_k, "topk_ids.size(1) == top_k",
           f"topk_ids must be [num_tokens, {top_k}]")
    # The routing kernels skip every lane whose expert is not local (RoutingKernel.cuh guards
    # each use with isLocalExpert), so the sentinels the all-to-alls write, -1 (one-sided) and
    # num_experts (two-sided), are skipped. Any other id outside [0, num_experts) is no
    # all-to-all's output: stricter, raise.
    if ids_TK.numel() and (ids_TK.min() < -1 or ids_TK.max() > num_experts):
        raise RuntimeError(f"expert ids must be in [0, {num_experts}), -1 or {num_experts} (the invalid-lane "
                           f"sentinels); got [{int(ids_TK.min())}, {int(ids_TK.max())}]")
    return ids_TK, w_TK


def _routing_from_logits(logits_TE, bias, top_k: int, method: int, norm_topk_prob: bool):
    scores = logits_TE.float() + (0 if bias is None else bias.float())
    if method == tllm_enums.RoutingMethodType.Default:
        w, ids = torch.softmax(scores, -1).topk(top_k, -1)
    elif method == tllm_enums.RoutingMethodType.Renormalize:
        w, ids = scores.topk(top_k, -1)
        w = torch.softmax(w, -1)
    elif method == tllm_enums.RoutingMethodType.RenormalizeNaive:
        w, ids = torch.softmax(scores, -1).topk(top_k, -1)
        if norm_topk_prob:
            w = w / w.sum(-1, keepdim=True)
    elif method == tllm_enums.RoutingMethodType.TopK:
        w, ids = scores.topk(top_k, -1)
    else:
        raise NotImplementedError(f"the CPU fake implements routing methods Default, Renormalize, "
                                  f"RenormalizeNaive and TopK; got {tllm_enums.RoutingMethodType(method).name}")
    return ids, w


# --- weights ---------------------------------------------------------------------------------

def _row_order(rows: int, *, shuffled: bool, tile: int, gated: bool) -> torch.Tensor:
    """``kernel[i] = logical[idx[i]]``: the gated reorder, then the epilogue-tile shuffle."""
    idx = layouts.gated_reorder_indices(rows) if gated else torch.arange(rows)
    return idx[layouts.shuffle_indices(rows, tile)] if shuffled else idx


def _logical(w, rows: int, *, layout: int, shuffled: bool, tile: int, gated: bool) -> torch.Tensor:
    """``[L, rows, K]`` in logical row order from the kernel layout of ``w``."""
    w_LMK = layouts.from_block_major_k(w) if layout == WeightLayout.BlockMajorK else w
    icheck(w_LMK.size(1) == rows, "weights.size(-2) == expected rows", f"weights must have {rows} rows per expert")
    return layouts.unpermute_rows(w_LMK, _row_order(rows, shuffled=shuffled, tile=tile, gated=gated))


def _logical_sf_128x4(sf, rows: int, cols: int, *, tile: int, gated: bool) -> torch.Tensor:
    """``[L, rows, cols]`` linear scales in logical row order from shuffled, 128x4-interleaved ones."""
    s_LRC = layouts.deinterleave_128x4(sf.reshape(sf.size(0), -1), rows, cols)
    return layouts.unpermute_rows(s_LRC, _row_order(rows, shuffled=True, tile=tile, gated=gated))


def _e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Unpack e2m1 codes (two per byte, low nibble first) to fp32 values."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], packed.size(-1) * 2).long()
    return _E2M1[codes & 7] * torch.where((codes & 8) != 0, -1.0, 1.0)


def _nvfp4(packed, sf) -> torch.Tensor:
    """e2m1 values times their e4m3 block scale (16 values each); the global scales are the
    caller's ``output*_scale_scalar``."""
    return _e2m1(packed) * sf.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=-1)


def _fp8_block(w, scale) -> torch.Tensor:
    """e4m3 ``[L, M, K]`` times its fp32 ``[L, M/128, K/128]`` block scales."""
    return w.float() * scale.float().repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)


# --- the MoE ---------------------------------------------------------------------------------

def _activate(h_PM, activation_type: int, I: int, e: int, alpha, beta, clamp, lin_scale, gate_scale):
    if activation_type == tllm_enums.ActivationType.Relu2:
        return torch.relu(h_PM * lin_scale[e]) ** 2
    if activation_type != tllm_enums.ActivationType.Swiglu:
        raise NotImplementedError(f"the CPU fake implements Swiglu and Relu2; got {tllm_enums.ActivationType(activation_type).name}")
    x1, x2 = h_PM[:, :I] * lin_scale[e], h_PM[:, I:] * gate_scale[e]
    if clamp is not None:
        x1, x2 = x1.clamp(-float(clamp[e]), float(clamp[e])), x2.clamp(max=float(clamp[e]))
    a = 1.0 if alpha is None else float(alpha[e])
    b = 0.0 if beta is None else float(beta[e])
    return x2 * torch.sigmoid(a * x2) * (x1 + b)


def _run(x_TH, ids_TK, w_TK, w1_LMH, w2_LHI, *, num_experts, local_expert_offset, local_num_experts,
         intermediate_size, activation_type, do_finalize, out_dtype, output, b1=None, b2=None,
         alpha=None, beta=None, clamp=None, lin_scale=None, gate_scale=None, out_scale=None):
    T, K = ids_TK.shape
    H = x_TH.size(1)
    icheck(local_expert_offset >= 0 and local_expert_offset + local_num_experts <= num_experts,
           "local_expert_offset + local_num_experts <= num_experts", "local experts out of range")
    ones = torch.ones(local_num_experts)
    lin_scale = ones if lin_scale is None else lin_scale.float()
    gate_scale = ones if gate_scale is None else gate_scale.float()
    out_scale = ones if out_scale is None else out_scale.float()
    flat_ids = ids_TK.flatten()
    perm = torch.full((T * K,), -1, dtype=torch.int32)
    blocks, start = [], 0
    for e in range(local_num_experts):
        expanded = (flat_ids == local_expert_offset + e).nonzero().flatten()
        if expanded.numel() and SlotOrder.mode == "shuffled":
            g = torch.Generator().manual_seed(SlotOrder.seed * 65537 + e)
            expanded = expanded[torch.randperm(expanded.numel(), generator=g)]
        perm[expanded] = torch.arange(start, start + expanded.numel(), dtype=torch.int32)
        blocks.append((e, expanded, start))
        start += -(-expanded.numel() // PERMUTE_TILE) * PERMUTE_TILE
    gemm2_PH = torch.full((start, H), float("nan"), dtype=out_dtype)
    for e, expanded, at in blocks:
        if not expanded.numel():
            continue
        h = x_TH[expanded // K] @ w1_LMH[e].T
        if b1 is not None:
            h = h + b1[e].float()
        act = _activate(h, activation_type, intermediate_size, e, alpha, beta, clamp, lin_scale, gate_scale)
        y = act @ w2_LHI[e].T
        if b2 is not None:
            y = y + b2[e].float()
        gemm2_PH[at:at + expanded.numel()] = (y * out_scale[e]).to(out_dtype)
    if not do_finalize:
        return [gemm2_PH, w_TK.to(out_dtype), perm]
    out_TH = torch.zeros(T, H)
    hit = perm >= 0
    tok = torch.arange(T * K)[hit] // K
    out_TH.index_add_(0, tok, w_TK.flatten()[hit, None] * gemm2_PH[perm[hit].long()].float())
    if output is None:
        return out_TH.to(out_dtype)
    icheck(tuple(output.shape) == (T, H) and output.dtype == out_dtype and output.is_contiguous(),
           "output.sizes() == {num_tokens, hidden_size} && output.dtype() == dl_bfloat16",
           f"output must be a contiguous {out_dtype} [{T}, {H}] tensor")
    return output.copy_(out_TH)


def _gemm1_rows(activation_type: int, intermediate_size: int) -> tuple[bool, int]:
    """Whether GEMM1 is gated (linear and gate halves) and its output rows per expert."""
    gated = activation_type != tllm_enums.ActivationType.Relu2
    return gated, (2 if gated else 1) * intermediate_size


def _check_locals(w, local_num_experts, name):
    icheck(w.size(0) == local_num_experts, f"{name}.size(0) == local_num_experts",
           f"{name} must hold local_num_experts experts")


def _bf16_moe(ids_TK, w_TK, hidden_states, gemm1_weights, gemm2_weights, num_experts, intermediate_size,
              local_expert_offset, local_num_experts, use_shuffled_weight, weight_layout, do_finalize,
              activation_type, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output):
    icheck(hidden_states.dtype == torch.bfloat16, "hidden_states.dtype() == dl_bfloat16", "hidden_states must be bfloat16")
    icheck(weight_layout == WeightLayout.BlockMajorK, "weight_layout == WeightLayout::BlockMajorK",
           "BF16 MoE requires the BlockMajorK weight layout")
    _check_locals(gemm1_weights, local_num_experts, "gemm1_weights")
    tile = EPILOGUE_TILE_M["bf16"]
    I, H = intermediate_size, hidden_states.size(1)
    gated, M1 = _gemm1_rows(activation_type, I)
    w1 = _logical(gemm1_weights, M1, layout=weight_layout, shuffled=use_shuffled_weight,
                  tile=tile, gated=gated).float()
    w2 = _logical(gemm2_weights, H, layout=weight_layout, shuffled=use_shuffled_weight, tile=tile, gated=False).float()
    result = _run(hidden_states.float(), ids_TK, w_TK, w1, w2, num_experts=num_experts,
                  local_expert_offset=local_expert_offset, local_num_experts=local_num_experts,
                  intermediate_size=I, activation_type=activation_type, do_finalize=do_finalize,
                  out_dtype=torch.bfloat16, output=output, alpha=gemm1_alpha, beta=gemm1_beta,
                  clamp=gemm1_clamp_limit)
    return result


class _Unset:
    """0.7.4's default for ``nvfp4_4over6``: not given (the release picks)."""

    def __repr__(self) -> str:
        return "_UNSET"


_UNSET = _Unset()


def trtllm_bf16_moe(routing_logits, routing_bias, hidden_states, gemm1_weights, gemm2_weights, num_experts,
                    top_k, n_group, topk_group, intermediate_size, local_expert_offset, local_num_experts,
                    routed_scaling_factor=None, routing_method_type=0, use_shuffled_weight=True,
                    weight_layout=WeightLayout.BlockMajorK, do_finalize=True, enable_pdl=True,
                    tune_max_num_tokens=8192, activation_type=tllm_enums.ActivationType.Swiglu.value, norm_topk_prob=True,
                    routing_replay_out=None, gemm1_alpha=None, gemm1_beta=None, gemm1_clamp_limit=None, output=None,
                    workspace_buffer=None):
    ids_TK, w_TK = _routing_from_logits(routing_logits, routing_bias, top_k, routing_method_type, norm_topk_prob)
    if routing_replay_out is not None:
        routing_replay_out[: ids_TK.size(0)] = ids_TK.to(routing_replay_out.dtype)
    return _bf16_moe(ids_TK, w_TK, hidden_states, gemm1_weights, gemm2_weights, num_experts, intermediate_size,
                     local_expert_offset, local_num_experts, use_shuffled_weight, weight_layout, do_finalize,
                     activation_type, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output)


def trtllm_bf16_routed_moe(topk_ids, hidden_states, gemm1_weights, gemm2_weights, num_experts, top_k, n_group,
                           topk_group, intermediate_size, local_expert_offset, local_num_experts,
                           routed_scaling_factor=None, routing_method_type=0, use_shuffled_weight=True,
                           weight_layout=WeightLayout.BlockMajorK, do_finalize=True, enable_pdl=True,
                           gemm1_lora_delta=None, tune_max_num_tokens=8192,
                           activation_type=tllm_enums.ActivationType.Swiglu.value, routing_replay_out=None, gemm1_alpha=None,
                           gemm1_beta=None, gemm1_clamp_limit=None, output=None, workspace_buffer=None):
    _no_lora(gemm1_lora_delta)
    ids_TK, w_TK = _precomputed_routing(topk_ids, top_k, num_experts)
    return _caller_weights(topk_ids, _bf16_moe(
        ids_TK, w_TK, hidden_states, gemm1_weights, gemm2_weights, num_experts, intermediate_size,
        local_expert_offset, local_num_experts, use_shuffled_weight, weight_layout, do_finalize,
        activation_type, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, output), do_finalize)


def trtllm_fp8_block_scale_routed_moe(topk_ids, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                                      gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, num_experts, top_k,
                                      n_group, topk_group, intermediate_size, local_expert_offset,
                                      local_num_experts, routed_scaling_factor, routing_method_type=0,
                                      use_shuffled_weight=False, weight_layout=0, do_finalize=True,
                                      enable_pdl=None, gemm1_lora_delta=None, output=None,
                                      tune_max_num_tokens=8192,
                                      fp8_quantization_type=tllm_enums.Fp8QuantizationType.DeepSeekFp8,
                                      activation_type=tllm_enums.ActivationType.Swiglu.value, gemm1_alpha=None,
                                      gemm1_beta=None, gemm1_clamp_limit=None, valid_hidden_size=None,
                                      valid_intermediate_size=None, workspace_buffer=None):
    _no_lora(gemm1_lora_delta)
    if fp8_quantization_type != tllm_enums.Fp8QuantizationType.DeepSeekFp8:
        raise NotImplementedError(f"the CPU fake implements DeepSeekFp8 only; got {tllm_enums.Fp8QuantizationType(fp8_quantization_type).name}")
    ids_TK, w_TK = _precomputed_routing(topk_ids, top_k, num_experts)
    T, H = hidden_states.shape
    icheck(hidden_states.dtype == torch.float8_e4m3fn, "hidden_states.dtype() == dl_float8_e4m3fn",
           "hidden_states must be fp8 for DeepSeekFp8")
    icheck(H % 128 == 0, "hidden_size % 128 == 0", "hidden_size must be divisible by 128")
    icheck(hidden_states_scale is not None and hidden_states_scale.dtype == torch.float32
           and tuple(hidden_states_scale.shape) == (H // 128, T),
           "hidden_states_scale.sizes() == {hidden_size / 128, num_tokens}",
           f"hidden_states_scale must be fp32 [{H // 128}, {T}] (block-major K)")
    _check_locals(gemm1_weights, local_num_experts, "gemm1_weights")
    I, tile = intermediate_size, EPILOGUE_TILE_M["fp8"]
    gated, M1 = _gemm1_rows(activation_type, I)
    w1 = _logical(gemm1_weights, M1, layout=weight_layout, shuffled=use_shuffled_weight, tile=tile, gated=False)
    w2 = _logical(gemm2_weights, H, layout=weight_layout, shuffled=use_shuffled_weight, tile=tile, gated=False)
    icheck(tuple(gemm1_weights_scale.shape[1:]) == (M1 // 128, H // 128),
           "gemm1_weights_scale.sizes() == {E, M / 128, hidden_size / 128}", "gemm1_weights_scale has the wrong shape")
    icheck(tuple(gemm2_weights_scale.shape[1:]) == (H // 128, I // 128),
           "gemm2_weights_scale.sizes() == {E, hidden_size / 128, I / 128}", "gemm2_weights_scale has the wrong shape")
    x_TH = hidden_states.float() * hidden_states_scale.t().float().repeat_interleave(128, dim=1)
    return _caller_weights(topk_ids, _run(
        x_TH, ids_TK, w_TK, _fp8_block(w1, gemm1_weights_scale), _fp8_block(w2, gemm2_weights_scale),
        num_experts=num_experts, local_expert_offset=local_expert_offset, local_num_experts=local_num_experts,
        intermediate_size=I, activation_type=activation_type, do_finalize=do_finalize, out_dtype=torch.bfloat16,
        output=output, alpha=gemm1_alpha, beta=gemm1_beta, clamp=gemm1_clamp_limit), do_finalize)


def trtllm_fp4_block_scale_routed_moe(topk_ids, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                                      gemm1_weights_scale, gemm1_bias, gemm1_alpha, gemm1_beta, gemm1_clamp_limit,
                                      gemm2_weights, gemm2_weights_scale, gemm2_bias, output1_scale_scalar,
                                      output1_scale_gate_scalar, output2_scale_scalar, num_experts, top_k,
                                      n_group, topk_group, intermediate_size, local_expert_offset,
                                      local_num_experts, routed_scaling_factor, routing_method_type=0,
                                      do_finalize=True, enable_pdl=None,
                                      activation_type=tllm_enums.ActivationType.Swiglu.value, per_token_scale=None,
                                      output=None, tune_max_num_tokens=8192, gemm1_lora_delta=None,
                                      valid_hidden_size=None, valid_intermediate_size=None,
                                      num_fused_shared_experts=None, hidden_states_scale_layout=None,
                                      workspace_buffer=None, nvfp4_4over6=_UNSET, routing_metadata=None):
    _no_lora(gemm1_lora_delta)
    if per_token_scale is not None or num_fused_shared_experts:
        raise NotImplementedError("the CPU fake does not implement per_token_scale or fused shared experts")
    if nvfp4_4over6 not in (_UNSET, False) or routing_metadata is not None:
        raise NotImplementedError("the CPU fake does not implement nvfp4_4over6 or routing_metadata")
    if hidden_states_scale_layout not in (None, SfLayout.layout_linear):
        raise ValueError("only the linear hidden_states_scale layout is supported")
    ids_TK, w_TK = _precomputed_routing(topk_ids, top_k, num_experts)
    icheck(hidden_states.dtype == torch.uint8, "hidden_states.dtype() == dl_uint8",
           "the CPU fake implements NVFP4 hidden states (packed uint8) only")
    T, H = hidden_states.size(0), hidden_states.size(1) * 2
    icheck(hidden_states_scale is not None and hidden_states_scale.numel() == T * H // 16,
           "hidden_states_scale.numel() == num_tokens * hidden_size / 16",
           f"hidden_states_scale must hold [{T}, {H // 16}] scales (linear layout)")
    _check_locals(gemm1_weights, local_num_experts, "gemm1_weights")
    I, tile = intermediate_size, EPILOGUE_TILE_M["fp4"]
    gated, M1 = _gemm1_rows(activation_type, I)
    w1_raw = _logical(gemm1_weights, M1, layout=WeightLayout.MajorK, shuffled=True, tile=tile, gated=gated)
    w2_raw = _logical(gemm2_weights, H, layout=WeightLayout.MajorK, shuffled=True, tile=tile, gated=False)
    sf1 = _logical_sf_128x4(gemm1_weights_scale, M1, H // 16, tile=tile, gated=gated)
    sf2 = _logical_sf_128x4(gemm2_weights_scale, H, I // 16, tile=tile, gated=False)
    x_TH = _nvfp4(hidden_states, hidden_states_scale.reshape(T, H // 16))
    result = _run(x_TH, ids_TK, w_TK, _nvfp4(w1_raw, sf1), _nvfp4(w2_raw, sf2), num_experts=num_experts,
                  local_expert_offset=local_expert_offset, local_num_experts=local_num_experts,
                  intermediate_size=I, activation_type=activation_type, do_finalize=do_finalize,
                  out_dtype=torch.bfloat16, output=output, b1=gemm1_bias, b2=gemm2_bias, alpha=gemm1_alpha,
                  beta=gemm1_beta, clamp=gemm1_clamp_limit, lin_scale=output1_scale_scalar,
                  gate_scale=output1_scale_gate_scalar, out_scale=output2_scale_scalar)
    return [result] if do_finalize else _caller_weights(topk_ids, result, do_finalize)


def _caller_weights(topk_ids, result, do_finalize: bool):
    """With ``do_finalize=False`` and an ``(ids, weights)`` pair, the triple's
    ``expert_weights`` is the caller's own weights tensor, whatever its dtype: the launcher
    borrows that buffer instead of allocating one (trtllm_fused_moe_kernel_launcher.cu)."""
    if not do_finalize and isinstance(topk_ids, tuple):
        result[1] = topk_ids[1]
    return result


def _no_lora(delta) -> None:
    if delta is not None:
        raise NotImplementedError("the CPU fake does not implement gemm1_lora_delta")


# --- per-release signatures --------------------------------------------------------------------

_LATEST = {
    "trtllm_bf16_moe": trtllm_bf16_moe,
    "trtllm_bf16_routed_moe": trtllm_bf16_routed_moe,
    "trtllm_fp8_block_scale_routed_moe": trtllm_fp8_block_scale_routed_moe,
    "trtllm_fp4_block_scale_routed_moe": trtllm_fp4_block_scale_routed_moe,
}
_OA = ("gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit")
_VALID = ("valid_hidden_size", "valid_intermediate_size")
_FP4_NEW = ("gemm1_lora_delta",) + _VALID + ("num_fused_shared_experts", "hidden_states_scale_layout")
_WS = ("workspace_buffer",)
_FP4_0_7_4 = _WS + ("nvfp4_4over6", "routing_metadata")
# Parameters each release lacks, against 0.7.4 (read from the flashinfer-python wheels); a
# release without an entry lacks what its base lacks.
_MISSING = {
    "0.6.8": {
        "trtllm_bf16_moe": _OA + ("output",) + _WS,
        "trtllm_bf16_routed_moe": ("gemm1_lora_delta",) + _OA + ("output",) + _WS,
        "trtllm_fp8_block_scale_routed_moe": ("gemm1_lora_delta",) + _OA + _VALID + _WS,
        "trtllm_fp4_block_scale_routed_moe": ("per_token_scale",) + _FP4_NEW + _FP4_0_7_4,
    },
    "0.6.13": {"trtllm_bf16_moe": ("output",) + _WS, "trtllm_bf16_routed_moe": ("output",) + _WS,
               "trtllm_fp8_block_scale_routed_moe": _VALID + _WS,
               "trtllm_fp4_block_scale_routed_moe": _FP4_NEW + _FP4_0_7_4},
    "0.6.14": {"trtllm_bf16_moe": _WS, "trtllm_bf16_routed_moe": _WS,
               "trtllm_fp8_block_scale_routed_moe": _VALID + _WS,
               "trtllm_fp4_block_scale_routed_moe": _FP4_NEW + _FP4_0_7_4},
    "0.6.18": {"trtllm_bf16_moe": _WS, "trtllm_bf16_routed_moe": _WS,
               "trtllm_fp8_block_scale_routed_moe": _VALID + _WS,
               "trtllm_fp4_block_scale_routed_moe": _FP4_NEW[1:] + _FP4_0_7_4},
    "0.7.0": {"trtllm_bf16_moe": _WS, "trtllm_bf16_routed_moe": _WS, "trtllm_fp8_block_scale_routed_moe": _WS,
              "trtllm_fp4_block_scale_routed_moe": _FP4_0_7_4},
    "0.7.4": {},
}
# Before 0.6.8 the bf16 entries take no activation_type, routing_replay_out or norm_topk_prob,
# before 0.6.7 the fp8 one no activation_type, before 0.6.5 the bf16 and fp8 ones no do_finalize,
# and 0.6.3's fp8 one no fp8_quantization_type: a call runs with the defaults (SwiGLU, no
# replay, renormalized top-k, finalized, DeepSeek fp8 blocks).
_REPLAY = ("activation_type", "routing_replay_out")
_MISSING["0.6.7"] = {**_MISSING["0.6.8"],
                     "trtllm_bf16_moe": _MISSING["0.6.8"]["trtllm_bf16_moe"] + _REPLAY + ("norm_topk_prob",),
                     "trtllm_bf16_routed_moe": _MISSING["0.6.8"]["trtllm_bf16_routed_moe"] + _REPLAY}
_MISSING["0.6.6"] = {**_MISSING["0.6.7"], "trtllm_fp8_block_scale_routed_moe":
                     _MISSING["0.6.8"]["trtllm_fp8_block_scale_routed_moe"] + ("activation_type",)}
_MISSING["0.6.4"] = {**_MISSING["0.6.6"],
                     "trtllm_bf16_moe": _MISSING["0.6.6"]["trtllm_bf16_moe"] + ("do_finalize",),
                     "trtllm_fp8_block_scale_routed_moe": _MISSING["0.6.6"]["trtllm_fp8_block_scale_routed_moe"]
                     + ("do_finalize",)}
_MISSING["0.6.3"] = {**_MISSING["0.6.4"], "trtllm_fp8_block_scale_routed_moe":
                     _MISSING["0.6.4"]["trtllm_fp8_block_scale_routed_moe"] + ("fp8_quantization_type",)}
_MISSING["0.6.11"] = {**_MISSING["0.6.8"], "trtllm_fp4_block_scale_routed_moe": _FP4_NEW + _FP4_0_7_4}  # per_token_scale=


def _for_release(name: str, release: str):
    fn = _LATEST[name]
    missing = set(_MISSING[release].get(name, ()))
    if not missing:
        return fn
    sig = inspect.signature(fn)
    sig = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in missing])

    def entry(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)  # TypeError for a keyword this release lacks
        return fn(**bound.arguments)

    entry.__signature__ = sig
    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = fn.__doc__
    return entry


_BY_RELEASE = {r: {n: _for_release(n, r) for n in _LATEST} for r in _MISSING}
ENTRY_POINTS = tuple(_LATEST)


def entry_point(name: str):
    """``name`` as the active profile's release has it."""
    return profiles.pick(_BY_RELEASE)[name]


# The module's names are the release's entry points too (fused_moe re-exports these objects).
del trtllm_bf16_moe, trtllm_bf16_routed_moe, trtllm_fp8_block_scale_routed_moe, trtllm_fp4_block_scale_routed_moe


# The enums the real module imports from tllm_enums (SGLang's runners import them from here).
_ENUMS = ("ActivationType", "Fp8QuantizationType", "RoutingMethodType", "SfLayout", "WeightLayout")


def __getattr__(name: str):
    if name in _LATEST:
        return entry_point(name)
    if name in _ENUMS:
        return getattr(tllm_enums, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LATEST) | set(_ENUMS))
