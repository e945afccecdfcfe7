"""Fake ``flashinfer.fp4_quantization``: the real package's backwards-compatibility stub,
re-exporting ``flashinfer.quantization.fp4_quantization`` (vLLM reads
``block_scale_interleave`` here)."""

from fakes.flashinfer._reexport import forwarding

_HOME = "quantization.fp4_quantization"
__all__ = [  # noqa: F822 - served by __getattr__, per release
    "block_scale_interleave", "fp4_quantize", "nvfp4_block_scale_interleave", "shuffle_matrix_a", "shuffle_matrix_sf_a",
]
__getattr__, __dir__ = forwarding(__name__, dict.fromkeys(__all__, _HOME))
