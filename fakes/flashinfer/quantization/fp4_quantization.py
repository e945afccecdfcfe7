"""Fake ``flashinfer.quantization.fp4_quantization``: the row shuffle and the 128x4 scale
interleave users prepare TRT-LLM weights with (re-exported by ``flashinfer`` itself, not by
``flashinfer.fused_moe``). ``block_scale_interleave`` takes ``out=`` from 0.7.x."""

import torch

from fakes.flashinfer import profiles
from fakes.flashinfer.fused_moe.layouts import interleave_128x4, shuffle_indices


def shuffle_matrix_a(input_tensor, epilogue_tile_m: int):
    return input_tensor[shuffle_indices(input_tensor.shape[0], epilogue_tile_m)]


def _interleave(unswizzled_sf):
    """Linear ``[rows, cols]`` (or ``[E, rows, cols]``) scales -> the flat 128x4 buffer."""
    assert unswizzled_sf.dtype in (torch.uint8, torch.bfloat16), (
        f"Input dtype must be uint8 or bfloat16, got {unswizzled_sf.dtype}")
    if unswizzled_sf.dim() == 3:
        return torch.cat([interleave_128x4(s) for s in unswizzled_sf])
    return interleave_128x4(unswizzled_sf)


def _block_scale_interleave_0_6(unswizzled_sf):
    return _interleave(unswizzled_sf)


def _block_scale_interleave_0_7(unswizzled_sf, *, out=None):
    flat = _interleave(unswizzled_sf)
    if out is None:
        return flat
    if (out.device != unswizzled_sf.device or out.dtype != unswizzled_sf.dtype
            or out.shape != flat.shape or not out.is_contiguous()):
        raise ValueError(
            "block_scale_interleave out must be a contiguous flat tensor "
            f"of shape ({flat.numel()},), dtype {unswizzled_sf.dtype}, on {unswizzled_sf.device}")
    out.copy_(flat)
    return out


def shuffle_matrix_sf_a(input_tensor, epilogue_tile_m: int, num_elts_per_sf: int = 16):
    """Row-shuffle linear scales for the epilogue tile, then interleave them 128x4."""
    assert input_tensor.shape[0] % 128 == 0
    return _interleave(shuffle_matrix_a(input_tensor, epilogue_tile_m))


for _fn in (_block_scale_interleave_0_6, _block_scale_interleave_0_7):
    _fn.__name__ = _fn.__qualname__ = "block_scale_interleave"


def __getattr__(name: str):
    if name == "block_scale_interleave":
        return _block_scale_interleave_0_7 if profiles.active().backend_kw else _block_scale_interleave_0_6
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"block_scale_interleave"})
