# Excerpt of FlashInfer 0.6.8.post1 (__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .quantization.fp4_quantization import block_scale_interleave, shuffle_matrix_a, shuffle_matrix_sf_a
from .fused_moe import reorder_rows_for_gated_act_gemm
