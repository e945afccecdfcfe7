"""CPU stand-ins for the kernels vLLM's MoE layer calls that its CPU platform lacks: each
computes what the kernel it replaces computes, in torch, and refuses the variants the
kernel has that the stand-in does not.

- ``per_token_group_quant_fp8`` (``fused_moe.utils``, the DeepSeek blockwise FP8 activation
  quantize): on a non-CUDA platform vLLM launches a Triton kernel; this is that kernel's
  arithmetic (``scale = max(amax, eps) * (1 / fp8_max)``, a power of two with ``use_ue8m0``,
  values clamped to the e4m3 range), row-major scales.
"""

from __future__ import annotations

import torch

from testbed import patch


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


def install(add_cleanup) -> None:
    """Put the stand-ins where vLLM's MoE layer looks them up, for one scenario."""
    import vllm.model_executor.layers.fused_moe.utils as moe_utils

    add_cleanup(patch.attribute(moe_utils, "per_token_group_quant_fp8", per_token_group_quant_fp8))
