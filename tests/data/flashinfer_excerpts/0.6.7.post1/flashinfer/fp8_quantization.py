# Excerpt of FlashInfer 0.6.7.post1 (fp8_quantization.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .quantization.fp8_quantization import mxfp8_quantize
__all__ = ['mxfp8_quantize', 'mxfp8_dequantize_host', 'get_mxfp8_quantization_sm100_module', '_compute_swizzled_layout_sf_size']
