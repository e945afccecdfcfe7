"""Fake ``flashinfer.quantization.fp4_quantization``: the row shuffle and the 128x4 scale
interleave users prepare TRT-LLM weights with (re-exported by ``flashinfer`` itself, not by
``flashinfer.fused_moe``), and ``fp4_quantize``, the NVFP4 activation quantizer (the MXFP4
recipe and the 8x4 layout fail loudly: the fake does not implement them).
``block_scale_interleave`` takes ``out=`` from 0.7.x; ``nvfp4_block_scale_interleave`` is the
same function, as in every release."""

import os

import torch

from fakes.flashinfer import profiles, tllm_enums
from fakes.flashinfer._check import check_contiguous, check_input_type, icheck
from fakes.flashinfer.fused_moe.layouts import interleave_128x4, shuffle_indices
from fakes.flashinfer.quantization import block_quant


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


class _Unset:
    """``nvfp4_4over6``'s default: read the FLASHINFER_NVFP4_4OVER6* environment."""

    def __repr__(self) -> str:
        return "_UNSET"


_UNSET = _Unset()


def _fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                  is_global_scale_inversed, backend, nvfp4_4over6, backends, converts_scale=True, pads_sf_cols=True):
    """What every release's ``fp4_quantize`` does before and in ``fp4_quantize_sm100``
    (``fp4Quantize.cpp``); ``converts_scale``: the release casts the global scale to fp32
    first (0.6.14 on; 0.6.8's C++ refuses another dtype); ``pads_sf_cols``: a swizzled scale
    tensor is shaped ``[-1, K/16 rounded up to 4]`` (0.6.8 on; before, ``[-1, K/16]``, which
    splits each padded row of the swizzle where K/16 is not a multiple of 4)."""
    if sf_vec_size != 16 and sf_vec_size != 32:
        raise NotImplementedError("sf_vec_size can only be 16 or 32")
    is_mxfp4 = sf_vec_size != 16 or sf_use_ue8m0
    if is_mxfp4 and nvfp4_4over6 is not _UNSET and nvfp4_4over6 is not None:
        raise ValueError("nvfp4_4over6 applies to NVFP4 only (sf_vec_size=16, "
                         f"sf_use_ue8m0=False); got sf_vec_size={sf_vec_size}, sf_use_ue8m0={sf_use_ue8m0}.")
    if backend not in backends:
        raise ValueError(f"Unknown backend: {backend}. Must be {_one_of(backends)}.")
    if backend == "cute-dsl":
        raise RuntimeError("the cute-dsl fp4_quantize needs an SM100 GPU; the fake machine has none")
    if is_mxfp4:
        raise NotImplementedError("the CPU fake implements fp4_quantize's NVFP4 recipe (sf_vec_size=16, e4m3 "
                                  "scales) only, not MXFP4")
    env_4over6 = nvfp4_4over6 is _UNSET and os.environ.get("FLASHINFER_NVFP4_4OVER6", "0") not in ("", "0")
    if env_4over6 or nvfp4_4over6 not in (_UNSET, None):
        raise NotImplementedError("the CPU fake does not implement the NVFP4 4over6 scale search")
    if input.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError(f"the CPU fake quantizes fp16/bf16 to fp4, got {input.dtype}")
    if is_sf_swizzled_layout and is_sf_8x4_layout:
        raise NotImplementedError("the CPU fake implements the 128x4 scale swizzle, not 8x4")
    if global_scale is not None and converts_scale:
        global_scale = global_scale.to(torch.float32)
    column_major = input.stride(-2) == 1 and input.size(-1) > 1  # as the real one: 1-D input fails here
    if column_major:
        input = input.transpose(-2, -1)
    assert input.shape[-1] % sf_vec_size == 0
    check_contiguous(input, "self")
    lead, K = input.shape[:-1], input.shape[-1]
    M = input.numel() // K
    icheck(global_scale is not None, "globalScale.has_value()", "globalScale is required when sfUseUE8M0 is false")
    check_input_type(global_scale, torch.float32, "globalScale.value()")
    icheck(global_scale.numel() in (1, M), "globalScale.value().numel() == 1 || globalScale.value().numel() == m",
           "globalScale should have shape [1] or [num_tokens]")
    gs_M = global_scale.reshape(-1).expand(M) if global_scale.numel() == 1 else global_scale.reshape(-1)
    if is_global_scale_inversed:
        gs_M = 1.0 / gs_M
    x_q, sf = block_quant.nvfp4(input.reshape(-1, K), gs_M, is_sf_swizzled_layout)
    x_q = x_q.reshape(*lead, K // 2)
    sf = sf.reshape(-1, -(-(K // 16) // 4) * 4) if is_sf_swizzled_layout and pads_sf_cols else sf.reshape(-1, K // 16)
    if column_major:
        x_q, sf = x_q.transpose(-2, -1), sf.transpose(-2, -1)
    return x_q, sf


def _fp4_quantize_0_6_3(input, global_scale=None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                        is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False, enable_pdl=None):
    # 0.6.3 .. 0.6.7 return the pair as a tuple expression (the contract compares return forms).
    x_q, sf = _fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                            False, "cuda", None, ("cuda",), converts_scale=False, pads_sf_cols=False)
    return x_q, sf


def _fp4_quantize_0_6_8(input, global_scale=None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                        is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False,
                        enable_pdl=None, backend: str = "cuda"):
    return _fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                         False, backend, None, ("cuda", "cute-dsl"), converts_scale=False)


def _fp4_quantize_0_6_14(input, global_scale=None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                         is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False,
                         is_global_scale_inversed: bool = False, enable_pdl=None, backend: str = "cuda"):
    return _fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                         is_global_scale_inversed, backend, None, ("cuda", "cute-dsl"))


def _fp4_quantize_0_7_2(input, global_scale=None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                        is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False,
                        is_global_scale_inversed: bool = False, enable_pdl=None, backend: str = "cuda",
                        nvfp4_4over6=_UNSET):
    return _fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                         is_global_scale_inversed, backend, nvfp4_4over6, ("cuda", "cute-dsl"))


def _fp4_quantize_0_7_4(input, global_scale=None, sf_vec_size: int = 16, sf_use_ue8m0: bool = False,
                        is_sf_swizzled_layout: bool = True, is_sf_8x4_layout: bool = False,
                        is_global_scale_inversed: bool = False, enable_pdl=None, backend: str = "auto",
                        nvfp4_4over6=_UNSET, *, batch_invariant: bool = False):
    if batch_invariant:
        if backend != "auto":
            raise ValueError(f"fp4_quantize: batch_invariant=True requires backend='auto' (got backend={backend!r})")
        raise NotImplementedError("the CPU fake does not implement the batch-invariant fp4_quantize")
    return _fp4_quantize(input, global_scale, sf_vec_size, sf_use_ue8m0, is_sf_swizzled_layout, is_sf_8x4_layout,
                         is_global_scale_inversed, "cuda" if backend == "auto" else backend, nvfp4_4over6,
                         ("auto", "cuda", "cute-dsl"))


def _one_of(names) -> str:
    """``'a', 'b' or 'c'``, as the releases' messages list their backends."""
    quoted = [repr(n) for n in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


for _fn in (_block_scale_interleave_0_6, _block_scale_interleave_0_7):
    _fn.__name__ = _fn.__qualname__ = "block_scale_interleave"
for _fn in (_fp4_quantize_0_6_3, _fp4_quantize_0_6_8, _fp4_quantize_0_6_14, _fp4_quantize_0_7_2, _fp4_quantize_0_7_4):
    _fn.__name__ = _fn.__qualname__ = "fp4_quantize"
# (backend= from 0.6.8, is_global_scale_inversed= from 0.6.11, nvfp4_4over6= from 0.7.1)
_FP4_QUANTIZE = {"0.6.7": _fp4_quantize_0_6_3, "0.6.8": _fp4_quantize_0_6_8, "0.6.11": _fp4_quantize_0_6_14, "0.7.1": _fp4_quantize_0_7_2,
                 "0.7.4": _fp4_quantize_0_7_4}
_PER_RELEASE = ("SfLayout", "block_scale_interleave", "nvfp4_block_scale_interleave", "fp4_quantize")


def __getattr__(name: str):
    if name in ("block_scale_interleave", "nvfp4_block_scale_interleave"):
        return _block_scale_interleave_0_7 if profiles.active().interleave_out else _block_scale_interleave_0_6
    if name == "fp4_quantize":
        return profiles.pick(_FP4_QUANTIZE)
    if name == "SfLayout":  # imported from tllm_enums, as the real module does
        return tllm_enums.SfLayout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PER_RELEASE))
