"""Fake ``flashinfer.fp8_quantization``: the real package's backwards-compatibility stub,
re-exporting ``flashinfer.quantization.fp8_quantization``."""

from fakes.flashinfer._reexport import forwarding

__all__ = ["mxfp8_quantize"]  # noqa: F822 - served by __getattr__, per release
__getattr__, __dir__ = forwarding(__name__, {"mxfp8_quantize": "quantization.fp8_quantization"})
