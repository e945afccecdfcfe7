"""Reference activation quantizers on CPU (numerics, not speed), each with its dequantizer.

Legend: T tokens, H hidden, B scale blocks per token. Every quantizer returns
``(q_T?, sf_TB)`` whose per-token byte counts are :func:`impl.formats.dispatch_layout`'s.

- nvfp4: e2m1 codes packed two per byte (element ``2i`` in the low nibble), an e4m3 scale per
  16 values, and a per-tensor fp32 global scale ``gs``: ``x ~ e2m1 * sf / gs``.
- mxfp8: e4m3 values, a ue8m0 (power-of-two exponent + 127) scale per 32 values, scale
  columns padded to ``mx_alignment`` with 127 (2^0). The scale is ``2^ceil(log2(amax/448))``,
  so no value saturates.
- DeepSeek blockwise fp8: e4m3 values, an fp32 scale ``amax / 448`` per 1x128 block.
"""

from __future__ import annotations

from typing import Optional

import torch

from impl.formats import (
    FP8_BLOCK,
    FP8_DTYPE,
    MX_BLOCK,
    NVFP4_BLOCK,
    ActivationFormat,
    QuantConfig,
    activation_format,
    dispatch_layout,
)

FP8_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MIDPOINTS = (E2M1_VALUES[1:] + E2M1_VALUES[:-1]) / 2
UE8M0_BIAS = 127


def nvfp4_global_scale(amax: float | torch.Tensor) -> torch.Tensor:
    """The calibrated global scale vLLM keeps as ``a1_gscale``: ``448 * 6 / amax``."""
    amax = torch.as_tensor(amax, dtype=torch.float32).clamp(min=1e-12)
    return (FP8_MAX * E2M1_MAX / amax).reshape(())


def quantize_input(x_TH: torch.Tensor, quant_config: QuantConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """prepare's quantize step: ``(x_q, x_sf)``; unquantized formats return ``(x, None)``."""
    fmt = activation_format(quant_config, x_TH.dtype)
    if x_TH.dim() != 2:
        raise ValueError(f"activations must be 2-D [tokens, hidden], got shape {tuple(x_TH.shape)}")
    dispatch_layout(x_TH.size(1), quant_config, x_TH.dtype)  # hidden-size rules, with their errors
    if fmt is ActivationFormat.UNQUANTIZED:
        return x_TH, None
    if fmt is ActivationFormat.NVFP4:
        if quant_config.a1_gscale is None:
            raise ValueError("nvfp4 activation quantization needs quant_config.a1_gscale (the global scale)")
        return quantize_nvfp4(x_TH, quant_config.a1_gscale)
    if fmt is ActivationFormat.MXFP8:
        return quantize_mxfp8(x_TH, quant_config.mx_alignment)
    return quantize_fp8_block(x_TH)


def dequantize_input(x_q: torch.Tensor, x_sf: Optional[torch.Tensor], quant_config: QuantConfig,
                     hidden: int) -> torch.Tensor:
    """fp32 ``[T, hidden]`` from what :func:`quantize_input` produced (or received copies of it)."""
    if quant_config.quant_dtype is None:
        return x_q.float()
    if x_sf is None:
        raise ValueError(f"{quant_config.quant_dtype!r} activations need their scales")
    fmt = activation_format(quant_config, x_q.dtype)
    if fmt is ActivationFormat.NVFP4:
        return dequantize_nvfp4(x_q, x_sf, quant_config.a1_gscale)
    if fmt is ActivationFormat.MXFP8:
        return dequantize_mxfp8(x_q, x_sf)
    return dequantize_fp8_block(x_q, x_sf)


def quantize_nvfp4(x_TH: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes uint8 [T, H/2], sf float8_e4m3fn [T, H/16])``."""
    T, H = x_TH.shape
    gs = torch.as_tensor(global_scale, dtype=torch.float32)
    x_TBV = x_TH.float().reshape(T, H // NVFP4_BLOCK, NVFP4_BLOCK)
    amax_TB1 = x_TBV.abs().amax(-1, keepdim=True)
    sf_TB1 = (amax_TB1 / E2M1_MAX * gs).clamp(max=FP8_MAX).to(FP8_DTYPE)
    sf_f = sf_TB1.float()
    inv = torch.where(sf_f > 0, gs / sf_f.clamp(min=torch.finfo(torch.float32).tiny), 0.0)
    v_TBV = (x_TBV * inv).clamp(-E2M1_MAX, E2M1_MAX)
    mag = torch.bucketize(v_TBV.abs(), _E2M1_MIDPOINTS.to(x_TH.device), right=False).to(torch.uint8)
    codes = (mag | ((v_TBV < 0).to(torch.uint8) << 3)).reshape(T, H)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.contiguous(), sf_TB1.reshape(T, H // NVFP4_BLOCK).contiguous()


def dequantize_nvfp4(packed_TH2: torch.Tensor, sf_TB: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    T, H = packed_TH2.size(0), packed_TH2.size(1) * 2
    codes = torch.stack([packed_TH2 & 0xF, packed_TH2 >> 4], dim=-1).reshape(T, H).long()
    vals = E2M1_VALUES.to(codes.device)[codes & 7] * torch.where((codes & 8) != 0, -1.0, 1.0)
    gs = torch.as_tensor(global_scale, dtype=torch.float32)
    scale = sf_TB.view(FP8_DTYPE).float().repeat_interleave(NVFP4_BLOCK, dim=1) / gs
    return vals * scale


def quantize_mxfp8(x_TH: torch.Tensor, mx_alignment: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e4m3 [T, H], ue8m0 uint8 [T, pad(H)/32])``."""
    T, H = x_TH.shape
    cols = dispatch_layout(H, QuantConfig("mxfp8", mx_alignment=mx_alignment), x_TH.dtype).x_sf_bytes_per_token
    x_TBV = x_TH.float().reshape(T, H // MX_BLOCK, MX_BLOCK)
    amax = x_TBV.abs().amax(-1, keepdim=True)
    exp = torch.ceil(torch.log2(amax.clamp(min=2.0 ** -126) / FP8_MAX)).clamp(-UE8M0_BIAS, UE8M0_BIAS)
    exp = torch.where(amax > 0, exp, torch.full_like(exp, -UE8M0_BIAS))
    q = (x_TBV / torch.exp2(exp)).to(FP8_DTYPE).reshape(T, H)
    sf = torch.full((T, cols), UE8M0_BIAS, dtype=torch.uint8, device=x_TH.device)
    sf[:, : H // MX_BLOCK] = (exp.reshape(T, H // MX_BLOCK) + UE8M0_BIAS).to(torch.uint8)
    return q.contiguous(), sf


def dequantize_mxfp8(q_TH: torch.Tensor, sf_TC: torch.Tensor) -> torch.Tensor:
    T, H = q_TH.shape
    exp = sf_TC[:, : H // MX_BLOCK].view(torch.uint8).float() - UE8M0_BIAS
    return q_TH.float() * torch.exp2(exp).repeat_interleave(MX_BLOCK, dim=1)


def quantize_fp8_block(x_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e4m3 [T, H], fp32 [T, H/128])``."""
    T, H = x_TH.shape
    x_TBV = x_TH.float().reshape(T, H // FP8_BLOCK, FP8_BLOCK)
    scale = x_TBV.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (x_TBV / scale).to(FP8_DTYPE).reshape(T, H)
    return q.contiguous(), scale.reshape(T, H // FP8_BLOCK).contiguous()


def dequantize_fp8_block(q_TH: torch.Tensor, sf_TB: torch.Tensor) -> torch.Tensor:
    return q_TH.float() * sf_TB.float().repeat_interleave(FP8_BLOCK, dim=1)


def prepare_deepseek_fp8_x_sf(x: torch.Tensor, x_sf: Optional[torch.Tensor]) -> torch.Tensor:
    """Check DeepSeek blockwise fp8 activations and return their scales as the TRT-LLM kernel
    takes them (BlockMajorK): fp32 ``[K/128, M]``, contiguous.

    Parameters
    ----------
    x : torch.Tensor
        ``[M, K]`` float8_e4m3fn, K divisible by 128.
    x_sf : torch.Tensor or None
        fp32 ``[M, K/128]``.

    Raises
    ------
    RuntimeError
        ``x_sf`` is None (the kernel cannot run without precomputed scales).
    ValueError
        Wrong dtype or shape of either tensor.
    """
    if x_sf is None:
        raise RuntimeError("TRT-LLM FP8 experts require precomputed activation scales")
    if x.dtype != FP8_DTYPE:
        raise ValueError(f"DeepSeekFp8 activations must use the E4M3 dtype {FP8_DTYPE}; got {x.dtype}")
    if x.dim() != 2 or x.size(1) % FP8_BLOCK:
        raise ValueError(f"DeepSeekFp8 activations must be [M, K] with K divisible by {FP8_BLOCK}; "
                         f"got {tuple(x.shape)}")
    expected = (x.size(0), x.size(1) // FP8_BLOCK)
    if x_sf.dtype != torch.float32 or tuple(x_sf.shape) != expected:
        raise ValueError(f"DeepSeekFp8 activation scales must be fp32 [M, K/128] = {list(expected)}; "
                         f"got dtype={x_sf.dtype}, shape={tuple(x_sf.shape)}")
    return x_sf.t().contiguous()
