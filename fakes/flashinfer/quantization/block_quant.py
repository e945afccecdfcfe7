"""The device kernels of FlashInfer's activation quantizers (``quantization.cuh``,
``quantize_with_block_size``) on the CPU, bit for bit where the numerics are exact:

- nvfp4: per 16 values ``sf = e4m3(global_scale * amax / 6)`` (round to nearest even,
  saturating), values ``e2m1(x * global_scale / sf)`` (round to nearest even), two per byte,
  element ``2i`` in the low nibble;
- mxfp8: per 32 values ``sf = e8m0(amax / 448)`` rounded toward +inf, values
  ``e4m3(x / sf)``; columns past ``k`` up to the padded width are 0, and so are their scales.

Scales come back linear ``[rows, blocks]`` or in the 128x4 swizzle (rows padded to 128,
blocks to 4, the padding 0). Legend: M rows, K values per row, B scale blocks per row.
"""

from __future__ import annotations

import torch

from fakes.flashinfer.fused_moe.core import _E2M1
from fakes.flashinfer.fused_moe.layouts import interleave_128x4

E2M1_MAX, E4M3_MAX = 6.0, 448.0


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even e2m1 codes (sign bit 3) of fp32 ``v``."""
    mag = v.abs().clamp(max=E2M1_MAX)
    dist = (mag[..., None] - _E2M1).abs()
    best = dist.min(-1, keepdim=True).values
    ties = dist == best
    # Of two equally near grid values the one with the even code (mantissa bit 0) wins.
    even = ties & (torch.arange(8) % 2 == 0)
    code = torch.where(even.any(-1), even.float().argmax(-1), ties.float().argmax(-1))
    return (code | torch.signbit(v).long() << 3).to(torch.uint8)


def swizzle_or_linear(sf_MB: torch.Tensor, swizzled: bool) -> torch.Tensor:
    """Linear ``[M, B]`` scales, or flattened in the 128x4 swizzle."""
    return interleave_128x4(sf_MB) if swizzled else sf_MB.reshape(-1)


def nvfp4(x_MK: torch.Tensor, gs_M: torch.Tensor, swizzled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed uint8 [M, K/2], e4m3 scale bytes, flat)``; ``gs_M``: each row's global scale."""
    M, K = x_MK.shape
    x_MBV = x_MK.float().reshape(M, K // 16, 16)
    amax = x_MBV.abs().amax(-1)
    gs = gs_M.float().reshape(M, 1)
    sf = (gs * (amax / E2M1_MAX)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    sf_f = sf.float()
    out_scale = torch.where(sf_f != 0, gs / torch.where(sf_f != 0, sf_f, 1.0), 0.0)
    codes = e2m1_codes(x_MBV * out_scale[..., None]).reshape(M, K)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), swizzle_or_linear(sf.view(torch.uint8), swizzled)


def mxfp8(x_MK: torch.Tensor, padded_k: int, swizzled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e4m3 [M, padded_k], ue8m0 scale bytes, flat)``."""
    M, K = x_MK.shape
    x_MBV = x_MK.float().reshape(M, K // 32, 32)
    amax = x_MBV.abs().amax(-1)
    ratio = amax / E4M3_MAX
    exp = torch.where(ratio > 0, torch.ceil(torch.log2(torch.where(ratio > 0, ratio, 1.0))), -127.0)
    exp = exp.clamp(-127, 127)
    scale = torch.where(exp > -127, torch.exp2(exp), 0.0)  # e8m0 0x00 reads as 0 (flushed)
    inv = torch.where(scale != 0, 1.0 / torch.where(scale != 0, scale, 1.0), 0.0)
    q = torch.zeros(M, padded_k, dtype=torch.float8_e4m3fn)
    q[:, :K] = (x_MBV * inv[..., None]).clamp(-E4M3_MAX, E4M3_MAX).reshape(M, K).to(torch.float8_e4m3fn)
    sf = torch.zeros(M, padded_k // 32, dtype=torch.uint8)
    sf[:, :K // 32] = (exp + 127).to(torch.uint8)
    return q, swizzle_or_linear(sf, swizzled)
