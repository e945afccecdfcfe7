# Excerpt of FlashInfer 0.6.6 (__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .fp4_quantization import SfLayout, block_scale_interleave, nvfp4_block_scale_interleave, fp4_quantize, shuffle_matrix_a, shuffle_matrix_sf_a
from .fp8_quantization import mxfp8_quantize
from .fused_moe import ActivationType, RoutingMethodType, reorder_rows_for_gated_act_gemm, trtllm_bf16_moe, trtllm_bf16_routed_moe, trtllm_fp4_block_scale_routed_moe, trtllm_fp8_block_scale_routed_moe
