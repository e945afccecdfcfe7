"""CPU stand-ins for the kernels vLLM's MoE layer calls that its CPU platform lacks: each
computes what the kernel it replaces computes, in torch, and refuses the variants the
kernel has that the stand-in does not.

- ``per_token_group_quant_fp8`` (``fused_moe.utils``, the DeepSeek blockwise FP8 activation
  quantize): on a non-CUDA platform vLLM launches a Triton kernel; this is that kernel's
  arithmetic (``scale = max(amax, eps) * (1 / fp8_max)``, a power of two with ``use_ue8m0``,
  values clamped to the e4m3 range), row-major scales.
- ``torch.ops._C.scaled_fp4_quant.out`` (``_custom_ops.scaled_fp4_quant``, the NVFP4 activation
  quantize): vLLM's compiled op, absent from its CUDA wheel on a CPU, registered here under
  vLLM's own schema with a CPU kernel: the NVFP4 recipe of the fake FlashInfer's quantizer
  (per 16 values an e4m3 scale ``gs * amax / 6``, e2m1 values), linear or 128x4-swizzled
  scales as asked.
"""

from __future__ import annotations

import functools

import torch

from fakes.flashinfer.quantization import block_quant
from testbed import patch

# vLLM 0.33.0's schema (csrc/torch_bindings.cpp, as its _C_stable_libtorch.abi3.so declares it).
SCALED_FP4_QUANT_OUT = ("scaled_fp4_quant.out(Tensor input, Tensor input_scale, bool is_sf_swizzled_layout, *, "
                        "Tensor(a!) output, Tensor(b!) output_scale) -> ()")


def per_token_group_quant_fp8(x, group_size, eps=1e-10, dtype=None, column_major_scales=False,
                              tma_aligned_scales=False, out_q=None, use_ue8m0=None):
    """``[M, H]`` -> (e4m3 ``[M, H]``, fp32 scales ``[M, H / group_size]``)."""
    from vllm.model_executor.layers.quantization.utils.fp8_utils import get_fp8_min_max, is_deep_gemm_e8m0_used

    if column_major_scales or tma_aligned_scales:
        raise NotImplementedError("the testbed's per_token_group_quant_fp8 writes row-major scales only")
    if x.shape[-1] % group_size:
        raise ValueError(f"the last dimension of `x` {x.shape[-1]} must be divisible by `group_size` {group_size}")
    use_ue8m0 = is_deep_gemm_e8m0_used() if use_ue8m0 is None else use_ue8m0
    fp8_min, fp8_max = get_fp8_min_max()
    groups = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    scale = groups.abs().amax(-1, keepdim=True).clamp(min=eps) * (1.0 / fp8_max)
    if use_ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = (groups / scale).clamp(fp8_min, fp8_max).to(dtype or torch.float8_e4m3fn).reshape(x.shape)
    if out_q is not None:
        q = out_q.copy_(q)
    return q, scale.squeeze(-1)


def scaled_fp4_quant_out(input, input_scale, is_sf_swizzled_layout, *, output, output_scale) -> None:
    """``[M, N]`` bf16/fp16 -> ``output`` packed e2m1 ``[M, N/2]`` uint8 and ``output_scale``
    (e4m3 bytes: ``[M, N/16]`` uint8, or the 128x4 swizzle in int32 words)."""
    m, n = input.shape
    if n % 16:
        raise ValueError(f"scaled_fp4_quant: the last dimension has to be a multiple of 16, got {n}")
    # The kernel reads the global scale's first element: one scale, or one expanded per expert
    # (vLLM's FlashInfer backends share it); scales that differ would be silently wrong there.
    flat_scale = input_scale.float().reshape(-1)
    if flat_scale.numel() == 0 or (flat_scale != flat_scale[0]).any():
        raise ValueError(f"scaled_fp4_quant takes one global scale, got {input_scale.numel()} that differ")
    values, scales = block_quant.nvfp4(input, flat_scale[:1].expand(m), is_sf_swizzled_layout)
    output.copy_(values)
    flat = output_scale.view(torch.uint8).reshape(-1)
    if flat.numel() != scales.numel():
        raise ValueError(f"scaled_fp4_quant: output_scale holds {flat.numel()} scale bytes, the layout needs "
                         f"{scales.numel()}")
    flat.copy_(scales)


@functools.cache
def _register_compiled_ops() -> torch.library.Library:
    """vLLM's ``_C`` ops the layer calls, defined once per process (a library cannot be
    defined twice; kept alive by the cache)."""
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define(SCALED_FP4_QUANT_OUT)
    lib.impl("scaled_fp4_quant.out", scaled_fp4_quant_out, "CPU")
    return lib


def install(add_cleanup) -> None:
    """Put the stand-ins where vLLM's MoE layer looks them up, for one scenario (the compiled
    ops, once per process: vLLM's CPU build defines none of them)."""
    import vllm.model_executor.layers.fused_moe.utils as moe_utils

    if not hasattr(torch.ops._C, "scaled_fp4_quant"):
        _register_compiled_ops()

    add_cleanup(patch.attribute(moe_utils, "per_token_group_quant_fp8", per_token_group_quant_fp8))
