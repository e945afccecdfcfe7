# Excerpt of FlashInfer 0.7.0 (fused_moe/core.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from ..tllm_enums import ActivationType

class TrtllmMoERoutingMetadataSlot:
    ...

class TrtllmMoERoutingMetadata:
    ...

class TRTLLMCanonicalRouting:
    ...

class TrtllmDaBodyCaptureStream:
    ...

def _device_support_moe_pdl():
    ...

def _get_trtllm_da_body_capture_stream():
    ...

def _get_trtllm_da_body_capture_lock():
    ...

class TrtllmDaBodyWorkspace:
    ...

class TrtllmDaProfileWorkspace:
    ...

class TrtllmDaResources:
    ...

class TrtllmDaSwitchCaptureState:
    ...
_TRTLLM_MOE_OUTPUT_HIDDEN_ALIGNMENT = None

def _round_up():
    ...

def _infer_trtllm_moe_output_hidden_size():
    ...

def _trtllm_moe_output_width():
    ...

def _check_valid_hidden_size_supports_finalize():
    ...

def is_trtllm_moe_supported():
    ...

def _maybe_get_cached_w3_w1_permute_indices():
    ...

def get_w2_permute_indices_with_cache():
    ...

def get_reorder_rows_for_gated_act_gemm_row_indices():
    ...

def reorder_rows_for_gated_act_gemm(x: torch.Tensor) -> torch.Tensor:
    return permute(x)

def convert_to_block_layout(input_tensor: torch.Tensor, blockK: int) -> torch.Tensor:
    return input_tensor.view(M, K // blockK, blockK).permute(1, 0, 2).contiguous()

def get_cutlass_fused_moe_module():
    ...

def cutlass_fused_moe():
    ...

def cutlass_fused_moe_workspace_size():
    ...

def _enabled_trtllm_da_config():
    ...

def get_trtllm_moe_sm100_module():
    ...

def _get_trtllm_moe_sm100_module_impl():
    ...

def _torch_view_of_ffi_tensor():
    ...

def _routing_metadata_slots_from_flat_tensors():
    ...

def trtllm_moe_allocate_routing_metadata_multi_tile():
    ...

def trtllm_moe_allocate_routing_metadata():
    ...

def populate_trtllm_moe_routing_metadata_():
    ...

def allocate_trtllm_moe_canonical_routing():
    ...

def canonicalize_trtllm_moe_routing_():
    ...

class TrtllmDaRuntime:
    ...

def _validate_routing_replay_out():
    ...

def _validate_fused_shared_experts():
    ...

def _validate_fp8_block_scale_gemm1_activation_params():
    ...

@flashinfer_api(trace=trtllm_bf16_moe_trace)
def trtllm_bf16_moe(routing_logits: torch.Tensor, routing_bias: Optional[torch.Tensor], hidden_states: torch.Tensor, gemm1_weights: torch.Tensor, gemm2_weights: torch.Tensor, num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float]=None, routing_method_type: int=0, use_shuffled_weight: bool=True, weight_layout: int=WeightLayout.BlockMajorK, do_finalize: bool=True, enable_pdl: bool=True, tune_max_num_tokens: int=8192, activation_type: int=ActivationType.Swiglu.value, norm_topk_prob: bool=True, routing_replay_out: Optional[torch.Tensor]=None, gemm1_alpha: Optional[torch.Tensor]=None, gemm1_beta: Optional[torch.Tensor]=None, gemm1_clamp_limit: Optional[torch.Tensor]=None, output: Optional[torch.Tensor]=None) -> Union[List[torch.Tensor], torch.Tensor]:
    return result[0]
    return result

def _split_precomputed_routing():
    ...

@flashinfer_api(trace=trtllm_bf16_routed_moe_trace)
def trtllm_bf16_routed_moe(topk_ids: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]], hidden_states: torch.Tensor, gemm1_weights: torch.Tensor, gemm2_weights: torch.Tensor, num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float]=None, routing_method_type: int=0, use_shuffled_weight: bool=True, weight_layout: int=WeightLayout.BlockMajorK, do_finalize: bool=True, enable_pdl: bool=True, gemm1_lora_delta: Optional[torch.Tensor]=None, tune_max_num_tokens: int=8192, activation_type: int=ActivationType.Swiglu.value, routing_replay_out: Optional[torch.Tensor]=None, gemm1_alpha: Optional[torch.Tensor]=None, gemm1_beta: Optional[torch.Tensor]=None, gemm1_clamp_limit: Optional[torch.Tensor]=None, output: Optional[torch.Tensor]=None) -> Union[torch.Tensor, List[torch.Tensor]]:
    return result[0]
    return result

def trtllm_fp8_per_tensor_scale_moe():
    ...

def trtllm_fp8_per_tensor_scale_routed_moe():
    ...

def trtllm_fp8_per_channel_scale_moe():
    ...

def trtllm_fp8_per_channel_scale_routed_moe():
    ...

def trtllm_fp8_block_scale_moe():
    ...

@flashinfer_api(trace=trtllm_fp8_block_scale_routed_moe_trace)
def trtllm_fp8_block_scale_routed_moe(topk_ids: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]], routing_bias: Optional[torch.Tensor], hidden_states: torch.Tensor, hidden_states_scale: torch.Tensor, gemm1_weights: torch.Tensor, gemm1_weights_scale: torch.Tensor, gemm2_weights: torch.Tensor, gemm2_weights_scale: torch.Tensor, num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float], routing_method_type: int=0, use_shuffled_weight: bool=False, weight_layout: int=0, do_finalize: bool=True, enable_pdl: Optional[bool]=None, gemm1_lora_delta: Optional[torch.Tensor]=None, output: Optional[torch.Tensor]=None, tune_max_num_tokens: int=8192, fp8_quantization_type: Fp8QuantizationType=Fp8QuantizationType.DeepSeekFp8, activation_type: int=ActivationType.Swiglu.value, gemm1_alpha: Optional[torch.Tensor]=None, gemm1_beta: Optional[torch.Tensor]=None, gemm1_clamp_limit: Optional[torch.Tensor]=None, valid_hidden_size: Optional[int]=None, valid_intermediate_size: Optional[int]=None) -> Union[List[torch.Tensor], torch.Tensor]:
    return result[0]
    return result

def trtllm_fp4_block_scale_moe():
    ...

@flashinfer_api(trace=trtllm_fp4_block_scale_routed_moe_trace)
def trtllm_fp4_block_scale_routed_moe(topk_ids: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]], routing_bias: Optional[torch.Tensor], hidden_states: torch.Tensor, hidden_states_scale: Optional[torch.Tensor], gemm1_weights: torch.Tensor, gemm1_weights_scale: torch.Tensor, gemm1_bias: Optional[torch.Tensor], gemm1_alpha: Optional[torch.Tensor], gemm1_beta: Optional[torch.Tensor], gemm1_clamp_limit: Optional[torch.Tensor], gemm2_weights: torch.Tensor, gemm2_weights_scale: torch.Tensor, gemm2_bias: Optional[torch.Tensor], output1_scale_scalar: Optional[torch.Tensor], output1_scale_gate_scalar: Optional[torch.Tensor], output2_scale_scalar: Optional[torch.Tensor], num_experts: int, top_k: int, n_group: Optional[int], topk_group: Optional[int], intermediate_size: int, local_expert_offset: int, local_num_experts: int, routed_scaling_factor: Optional[float], routing_method_type: int=0, do_finalize: bool=True, enable_pdl: Optional[bool]=None, activation_type: int=ActivationType.Swiglu.value, per_token_scale: Optional[torch.Tensor]=None, output: Optional[torch.Tensor]=None, tune_max_num_tokens: int=8192, gemm1_lora_delta: Optional[torch.Tensor]=None, valid_hidden_size: Optional[int]=None, valid_intermediate_size: Optional[int]=None, num_fused_shared_experts: Optional[int]=None, hidden_states_scale_layout: Optional[SfLayout]=None) -> List[torch.Tensor]:
    return get_trtllm_moe_sm100_module().trtllm_fp4_block_scale_moe(routing_mode, None, topk_ids_tensor, topk_weights, routing_bias, hidden_states, hidden_states_scale, gemm1_weights, gemm1_weights_scale, gemm1_bias, gemm1_lora_delta, gemm1_alpha, gemm1_beta, gemm1_clamp_limit, gemm2_weights, gemm2_weights_scale, gemm2_bias, output1_scale_scalar, output1_scale_gate_scalar, output2_scale_scalar, per_token_scale, num_experts, top_k, _nfse, n_group, topk_group, intermediate_size, local_expert_offset, local_num_experts, routed_scaling_factor, routing_method_type, do_finalize, enable_pdl, activation_type, output, tune_max_num_tokens, True, None, valid_hidden_size, valid_intermediate_size, hidden_states_scale_layout)

def trtllm_mxint4_block_scale_moe():
    ...

def trtllm_mxint4_block_scale_routed_moe():
    ...
