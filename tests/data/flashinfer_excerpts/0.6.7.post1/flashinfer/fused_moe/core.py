# Excerpt of FlashInfer 0.6.7.post1 (fused_moe/core.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from ..tllm_enums import *

def is_trtllm_moe_supported():
    ...

def _maybe_get_cached_w3_w1_permute_indices():
    ...

def get_w2_permute_indices_with_cache():
    ...

def get_reorder_rows_for_gated_act_gemm_row_indices():
    ...

def reorder_rows_for_gated_act_gemm(x):
    return permute(x)

def convert_to_block_layout(input_tensor: torch.Tensor, blockK: int) -> torch.Tensor:
    return input_tensor.view(M, K // blockK, blockK).permute(1, 0, 2).contiguous()

def get_cutlass_fused_moe_module():
    ...

def cutlass_fused_moe():
    ...

def get_trtllm_moe_sm100_module():
    ...

@flashinfer_api
def trtllm_bf16_moe(routing_logits: torch.Tensor, routing_bias: Optional[torch.Tensor], hidden_states: torch.Tensor, gemm1_weights: torch.Tensor, gemm2_weights: torch.Tensor, num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float]=None, routing_method_type: int=0, use_shuffled_weight: bool=True, weight_layout: int=WeightLayout.BlockMajorK, do_finalize: bool=True, enable_pdl: bool=True, tune_max_num_tokens: int=8192) -> Union[List[torch.Tensor], torch.Tensor]:
    return result[0]
    return result

@flashinfer_api
def trtllm_bf16_routed_moe(topk_ids: torch.Tensor, hidden_states: torch.Tensor, gemm1_weights: torch.Tensor, gemm2_weights: torch.Tensor, num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float]=None, routing_method_type: int=0, use_shuffled_weight: bool=True, weight_layout: int=WeightLayout.BlockMajorK, do_finalize: bool=True, enable_pdl: bool=True, tune_max_num_tokens: int=8192) -> List[torch.Tensor]:
    return result[0]
    return result

def trtllm_fp8_per_tensor_scale_moe():
    ...

def trtllm_fp8_block_scale_moe():
    ...

@flashinfer_api
def trtllm_fp8_block_scale_routed_moe(topk_ids: torch.Tensor, routing_bias: Optional[torch.Tensor], hidden_states: torch.Tensor, hidden_states_scale: torch.Tensor, gemm1_weights: torch.Tensor, gemm1_weights_scale: torch.Tensor, gemm2_weights: torch.Tensor, gemm2_weights_scale: torch.Tensor, num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float], routing_method_type: int=0, use_shuffled_weight: bool=False, weight_layout: int=0, do_finalize: bool=True, enable_pdl: Optional[bool]=None, output: Optional[torch.Tensor]=None, tune_max_num_tokens: int=8192, fp8_quantization_type: Fp8QuantizationType=Fp8QuantizationType.DeepSeekFp8, activation_type: int=ActivationType.Swiglu.value) -> Union[List[torch.Tensor], torch.Tensor]:
    return result[0]
    return result

def trtllm_fp4_block_scale_moe():
    ...

@flashinfer_api
def trtllm_fp4_block_scale_routed_moe(topk_ids: torch.Tensor, routing_bias: Optional[torch.Tensor], hidden_states: torch.Tensor, hidden_states_scale: Optional[torch.Tensor], gemm1_weights: torch.Tensor, gemm1_weights_scale: torch.Tensor, gemm1_bias: Optional[torch.Tensor], gemm1_alpha: Optional[torch.Tensor], gemm1_beta: Optional[torch.Tensor], gemm1_clamp_limit: Optional[torch.Tensor], gemm2_weights: torch.Tensor, gemm2_weights_scale: torch.Tensor, gemm2_bias: Optional[torch.Tensor], output1_scale_scalar: Optional[torch.Tensor], output1_scale_gate_scalar: Optional[torch.Tensor], output2_scale_scalar: Optional[torch.Tensor], num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float], routing_method_type: int=0, do_finalize: bool=True, enable_pdl: Optional[bool]=None, activation_type: int=ActivationType.Swiglu.value, output: Optional[torch.Tensor]=None, tune_max_num_tokens: int=8192) -> List[torch.Tensor]:
    return get_trtllm_moe_sm100_module().trtllm_fp4_block_scale_moe(None, topk_ids, None, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm1_bias, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, gemm2_weights, gemm2_weights_scale, gemm2_bias, output1_scale_scalar, output1_scale_gate_scalar, output2_scale_scalar, num_experts, top_k, n_group, topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor, routing_method_type, do_finalize, enable_pdl, activation_type, output, tune_max_num_tokens)

def trtllm_mxint4_block_scale_moe():
    ...
