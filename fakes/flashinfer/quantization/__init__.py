"""Fake ``flashinfer.quantization``: of the real package's quantizers and weight-layout
helpers, those the fake imitates, re-exported from its modules as the real ``__init__`` does."""

from fakes.flashinfer._reexport import forwarding

_FP4 = "quantization.fp4_quantization"
__all__ = ["SfLayout", "block_scale_interleave", "fp4_quantize", "mxfp8_quantize", "nvfp4_block_scale_interleave",
           "shuffle_matrix_a", "shuffle_matrix_sf_a"]
__getattr__, __dir__ = forwarding(__name__, {**dict.fromkeys(__all__, _FP4),
                                             "mxfp8_quantize": "quantization.fp8_quantization"})
