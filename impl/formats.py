"""Activation formats the all-to-all carries, and the bytes per token each puts on the wire.

:func:`dispatch_layout` is the one place those byte counts are computed: the manager sizes
the workspace from it and the quantizers in :mod:`impl.quant` must produce exactly that many
bytes (a disagreement is historical bug 5: the wrong scale width or alignment).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

FP8_DTYPE = torch.float8_e4m3fn
NVFP4_BLOCK = 16  # values per e4m3 scale
MX_BLOCK = 32  # values per ue8m0 scale
FP8_BLOCK = 128  # DeepSeek 1x128 activation blocks
UNQUANTIZED_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class QuantConfig:
    """The activation-quantization fields of vLLM's ``FusedMoEQuantConfig`` that dispatch reads.

    ``quant_dtype``: None (no quantization), ``"nvfp4"``, ``"mxfp8"`` or
    ``torch.float8_e4m3fn`` (with ``block_shape=(128, 128)``: DeepSeek blockwise fp8).
    ``a1_gscale``: the nvfp4 per-tensor global scale (``448 * 6 / amax``), a 0-d fp32 tensor.
    ``mx_alignment``: pad the mxfp8 scale columns to cover ``hidden`` rounded up to it.
    """

    quant_dtype: Union[None, str, torch.dtype] = None
    block_shape: Optional[tuple[int, int]] = None
    per_act_token_quant: bool = False
    mx_alignment: int = 0
    a1_gscale: Optional[torch.Tensor] = field(default=None, compare=False)

    @property
    def use_fp8_w8a8(self) -> bool:
        return self.quant_dtype == FP8_DTYPE


class ActivationFormat(enum.Enum):
    UNQUANTIZED = "unquantized"  # bf16 / fp16 as given
    NVFP4 = "nvfp4"  # e2m1 packed two per byte + e4m3 scale per 16 + global scale
    MXFP8 = "mxfp8"  # e4m3 + ue8m0 scale per 32
    FP8_BLOCK = "fp8_block"  # DeepSeek: e4m3 + fp32 scale per 1x128


def activation_format(quant_config: QuantConfig, input_dtype: torch.dtype) -> ActivationFormat:
    """Classify ``quant_config``; NotImplementedError naming the config when dispatch cannot
    carry it."""
    q = quant_config.quant_dtype
    if q is None:
        if input_dtype not in UNQUANTIZED_DTYPES:
            raise NotImplementedError(
                "flashinfer one-sided dispatch of unquantized activations supports bf16 and fp16 "
                f"inputs; got input dtype {input_dtype}"
            )
        return ActivationFormat.UNQUANTIZED
    if q == "nvfp4":
        return ActivationFormat.NVFP4
    if q == "mxfp8":
        return ActivationFormat.MXFP8
    if q == FP8_DTYPE and tuple(quant_config.block_shape or ()) == (FP8_BLOCK, FP8_BLOCK) \
            and not quant_config.per_act_token_quant:
        return ActivationFormat.FP8_BLOCK
    raise NotImplementedError(
        "flashinfer one-sided dispatch supports nvfp4, mxfp8, DeepSeek blockwise fp8 (E4M3 with "
        "fp32 1x128 scales) and bf16/fp16 (quant_dtype=None); got "
        f"quant_dtype={q!r}, block_shape={quant_config.block_shape!r}, "
        f"per_act_token_quant={quant_config.per_act_token_quant!r}"
    )


@dataclass(frozen=True)
class DispatchLayout:
    """Bytes one token's activation puts on the wire: the values and their scales (0: none)."""

    x_bytes_per_token: int
    x_sf_bytes_per_token: int


def dispatch_layout(hidden: int, quant_config: QuantConfig, input_dtype: torch.dtype) -> DispatchLayout:
    """The per-token activation payload of the one-sided dispatch.

    Parameters
    ----------
    hidden : int
        Hidden size H of the activations before quantization.
    quant_config : QuantConfig
    input_dtype : torch.dtype
        dtype of the activations handed to prepare (matters when unquantized).

    Returns
    -------
    DispatchLayout
        unquantized ``(H * itemsize, 0)``; nvfp4 ``(H/2, H/16)``; mxfp8
        ``(H, ceil(H / mx_alignment) * mx_alignment / 32)``; DeepSeek fp8 ``(H, H/128 * 4)``.

    Raises
    ------
    NotImplementedError
        An unsupported format, or DeepSeek fp8 with ``hidden % 128 != 0``.
    ValueError
        ``hidden`` that does not split into the format's scale blocks, or a bad ``mx_alignment``.
    """
    fmt = activation_format(quant_config, input_dtype)
    if hidden <= 0:
        raise ValueError(f"hidden must be positive, got {hidden}")
    if fmt is ActivationFormat.UNQUANTIZED:
        return DispatchLayout(hidden * input_dtype.itemsize, 0)
    if fmt is ActivationFormat.NVFP4:
        _require_blocks(hidden, NVFP4_BLOCK, "nvfp4")
        return DispatchLayout(hidden // 2, hidden // NVFP4_BLOCK)
    if fmt is ActivationFormat.MXFP8:
        return DispatchLayout(hidden, mx_scale_columns(hidden, quant_config.mx_alignment))
    if hidden % FP8_BLOCK:
        raise NotImplementedError(
            "flashinfer one-sided DeepSeek blockwise fp8 dispatch requires hidden divisible by "
            f"{FP8_BLOCK}; got hidden={hidden}"
        )
    return DispatchLayout(hidden, hidden // FP8_BLOCK * torch.float32.itemsize)


def mx_scale_columns(hidden: int, mx_alignment: int) -> int:
    """ue8m0 scale bytes per token of mxfp8: one per 32 values of ``hidden`` padded to
    ``mx_alignment`` (0: no padding)."""
    if mx_alignment < 0 or mx_alignment % MX_BLOCK:
        raise ValueError(f"mx_alignment must be 0 or a positive multiple of {MX_BLOCK}, got {mx_alignment}")
    _require_blocks(hidden, MX_BLOCK, "mxfp8")
    padded = -(-hidden // mx_alignment) * mx_alignment if mx_alignment else hidden
    return padded // MX_BLOCK


def _require_blocks(hidden: int, block: int, name: str) -> None:
    if hidden % block:
        raise ValueError(f"{name} needs hidden divisible by {block} (one scale per {block} values); "
                         f"got hidden={hidden}")
