"""Fake ``flashinfer.quantization.fp8_quantization``: ``mxfp8_quantize``, the device path
(``mxfp8_quantize_sm100``: e4m3 values ``[M, K padded to alignment]``, one ue8m0 scale per 32,
flat, linear or in the 128x4 swizzle; the 8x4 swizzle fails loudly). 0.7.4 adds the ``auto``
backend and the keyword-only ``batch_invariant``."""

import torch

from fakes.flashinfer import profiles
from fakes.flashinfer._check import check_contiguous
from fakes.flashinfer.quantization import block_quant
from fakes.flashinfer.quantization.fp4_quantization import _one_of
from fakes.flashinfer.tllm_enums import SfLayout


def _mxfp8_quantize(input, is_sf_swizzled_layout, alignment, backend, sf_swizzle_layout, backends):
    sf_vec_size = 32
    assert input.shape[-1] % sf_vec_size == 0
    assert backend in backends, f"backend must be {_one_of(backends)}, got '{backend}'"
    if backend == "cute-dsl":
        raise RuntimeError("CuTe-DSL backend requested but CuTe-DSL is not available. "
                           "Please install nvidia-cutlass-dsl package.")
    if sf_swizzle_layout is None:
        sf_swizzle_layout = SfLayout.layout_128x4 if is_sf_swizzled_layout else SfLayout.layout_linear
    if alignment % sf_vec_size:
        raise RuntimeError(f"Check failed: alignment % SF_VEC_SIZE == 0 ({alignment % sf_vec_size} vs. 0): "
                           "alignment must be divisible by SF_VEC_SIZE = 32")
    if input.dtype not in (torch.float16, torch.bfloat16):
        raise NotImplementedError("mxfp8_quantize only supports input tensor with dtypes fp16/bf16.")
    check_contiguous(input, "input")
    if input.dim() < 2:
        raise RuntimeError(f"Check failed: rank >= 2 ({input.dim()} vs. 2): Input should be >=2D tensor.")
    if sf_swizzle_layout == SfLayout.layout_8x4:
        raise NotImplementedError("the CPU fake implements the 128x4 and linear scale layouts, not 8x4")
    if sf_swizzle_layout not in (SfLayout.layout_128x4, SfLayout.layout_linear):
        raise ValueError(f"Invalid sf_swizzle_layout value: {sf_swizzle_layout}")
    k = input.shape[-1]
    padded_k = (k + alignment - 1) // alignment * alignment
    x_q, sf = block_quant.mxfp8(input.reshape(-1, k), padded_k, sf_swizzle_layout == SfLayout.layout_128x4)
    return x_q.reshape(*input.shape[:-1], padded_k), sf


def _mxfp8_quantize_0_6_3(input, is_sf_swizzled_layout: bool = True, alignment: int = 32, enable_pdl=None):
    # 0.6.3 .. 0.6.6 return the pair as a tuple expression (the contract compares return forms).
    x_q, sf = _mxfp8_quantize(input, is_sf_swizzled_layout, alignment, "cuda", None, ("cuda",))
    return x_q, sf


def _mxfp8_quantize_0_6(input, is_sf_swizzled_layout: bool = True, alignment: int = 32, enable_pdl=None,
                        backend: str = "cuda", sf_swizzle_layout=None):
    return _mxfp8_quantize(input, is_sf_swizzled_layout, alignment, backend, sf_swizzle_layout, ("cuda", "cute-dsl"))


def _mxfp8_quantize_0_7_4(input, is_sf_swizzled_layout: bool = True, alignment: int = 32, enable_pdl=None,
                          backend: str = "auto", sf_swizzle_layout=None, *, batch_invariant: bool = False):
    if batch_invariant:
        if backend != "auto":
            raise ValueError(f"mxfp8_quantize: batch_invariant=True requires backend='auto' (got backend={backend!r})")
        raise NotImplementedError("the CPU fake does not implement the batch-invariant mxfp8_quantize")
    return _mxfp8_quantize(input, is_sf_swizzled_layout, alignment, "cuda" if backend == "auto" else backend,
                           sf_swizzle_layout, ("auto", "cuda", "cute-dsl"))


for _fn in (_mxfp8_quantize_0_6_3, _mxfp8_quantize_0_6, _mxfp8_quantize_0_7_4):
    _fn.__name__ = _fn.__qualname__ = "mxfp8_quantize"
# (backend= and sf_swizzle_layout= from 0.6.7)
_MXFP8_QUANTIZE = {"0.6.6": _mxfp8_quantize_0_6_3, "0.6.8": _mxfp8_quantize_0_6, "0.7.4": _mxfp8_quantize_0_7_4}


def __getattr__(name: str):
    if name == "mxfp8_quantize":
        return profiles.pick(_MXFP8_QUANTIZE)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"mxfp8_quantize"})
