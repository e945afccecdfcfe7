# Excerpt of FlashInfer 0.6.7.post2 (quantization/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .fp8_quantization import mxfp8_quantize
from .fp4_quantization import SfLayout, block_scale_interleave, nvfp4_block_scale_interleave, fp4_quantize, shuffle_matrix_a, shuffle_matrix_sf_a
_cute_dsl_available = None
_cute_dsl_available = None
__all__ = ['packbits', 'segment_packbits', 'gen_quantization_module', 'mxfp8_quantize', 'mxfp8_dequantize_host', 'SfLayout', 'block_scale_interleave', 'nvfp4_block_scale_interleave', 'e2m1_and_ufp8sf_scale_to_float', 'fp4_quantize', 'mxfp4_dequantize_host', 'mxfp4_dequantize', 'mxfp4_quantize', 'nvfp4_quantize', 'nvfp4_batched_quantize', 'shuffle_matrix_a', 'shuffle_matrix_sf_a', 'scaled_fp4_grouped_quantize', 'get_fp4_quantization_module']
