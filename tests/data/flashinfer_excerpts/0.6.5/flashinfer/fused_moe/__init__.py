# Excerpt of FlashInfer 0.6.5 (fused_moe/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .core import ActivationType, Fp8QuantizationType, RoutingMethodType, WeightLayout, convert_to_block_layout, reorder_rows_for_gated_act_gemm, trtllm_fp4_block_scale_routed_moe, trtllm_fp8_block_scale_routed_moe, trtllm_bf16_moe, trtllm_bf16_routed_moe
_cute_dsl_available = None
_cute_dsl_available = None
__all__ = ['ActivationType', 'Fp8QuantizationType', 'RoutingMethodType', 'WeightLayout', 'convert_to_block_layout', 'cutlass_fused_moe', 'gen_cutlass_fused_moe_sm120_module', 'gen_cutlass_fused_moe_sm103_module', 'gen_cutlass_fused_moe_sm100_module', 'gen_cutlass_fused_moe_sm90_module', 'gen_trtllm_gen_fused_moe_sm100_module', 'reorder_rows_for_gated_act_gemm', 'trtllm_bf16_moe', 'trtllm_bf16_routed_moe', 'trtllm_fp4_block_scale_moe', 'trtllm_fp4_block_scale_routed_moe', 'trtllm_fp8_block_scale_moe', 'trtllm_fp8_block_scale_routed_moe', 'trtllm_fp8_per_tensor_scale_moe', 'trtllm_mxint4_block_scale_moe', 'fused_topk_deepseek']
