# Excerpt of FlashInfer 0.7.1 (moe_ep/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
Bf16CutedslMegaMoeConfig = None
DeepGemmMegaMoeConfig = None
Mxfp8CutedslMegaMoeConfig = None
Nvfp4CutedslMegaMoeConfig = None
Sm90PullFp8MegaMoeConfig = None
Sm90PushFp8MegaMoeConfig = None
__all__ = ['AlgoKnob', 'BootstrapConfig', 'CakeMxfp8MegaMoeEp16', 'CakeMxfp8MegaMoeEp16Weights', 'preprocess_cake_mxfp8_megamoe_ep16_weights', 'Bf16CutedslMegaMoeConfig', 'Sm100_Bf16_Bf16_Bf16_Cutedsl_MegaMoeConfig', 'Sm100_Bf16_Bf16_Bf16_RankMajorCuda_MegaMoeConfig', 'Sm100_Bf16_Nvfp4_Bf16_Cutedsl_MegaMoeConfig', 'CombineInputParams', 'CombineOutput', 'Sm100_Fp8_Fp4_Bf16_Deepgemm_MegaMoeConfig', 'DeepGemmMegaMoeConfig', 'Mxfp8CutedslMegaMoeConfig', 'Nvfp4CutedslMegaMoeConfig', 'Sm90PullFp8MegaMoeConfig', 'Sm90PushFp8MegaMoeConfig', 'Sm90_Fp8_Fp8_Bf16_PushCuda_MegaMoeConfig', 'DispatchInputParams', 'DispatchOutput', 'EpAlgorithm', 'EpLayout', 'Fleet', 'FleetAlgoKnobAllocator', 'FleetAlgoKnobFaultTolerance', 'FleetAlgoKnobNumChannelsPerRank', 'FleetAlgoKnobNumQpsPerRank', 'FleetAlgoKnobQuantization', 'FleetAlgoKnobRdmaBufferSize', 'FleetAlgoKnobTopologyCapacity', 'FleetParams', 'FusedMoeKernelConfig', 'Handle', 'HandleAlgoKnobNumReceivedTokens', 'HandleAlgoKnobSplitOperation', 'HandleAlgoKnobTopKWeights', 'HandleAlgoKnobUserStream', 'HandleParams', 'IdentityConfig', 'MegaConfig', 'MoEEpArchError', 'MoEEpConfigError', 'MoEEpFaultToleranceUnsupportedError', 'MoEEpLayer', 'MoEEpMegaLayer', 'MoEEpMegaWorkspace', 'MoEEpNotBuiltError', 'MoEEpRankEvictedError', 'MoEEpSplitGraphState', 'MoEEpSplitLayer', 'MoEEpTransportError', 'MoEEpTensors', 'MoEWeightPack', 'PrequantizedMoEWeights', 'UnquantizedMoEWeights', 'Sm100_Bf16_Mxfp8_Bf16_Cutedsl_MegaMoeConfig', 'Sm100_Mxfp8_Mxfp8_Bf16_Cutedsl_MegaMoeConfig', 'NCCLEPConfig', 'NcclEpConfig', 'Sm100_Nvfp4_Nvfp4_Bf16_Cutedsl_MegaMoeConfig', 'NvepConfig', 'QuantType', 'Sm107_Mxfp8_Mxfp8_Bf16_Cutedsl_MegaMoeConfig', 'Sm107_Nvfp4_Nvfp4_Bf16_Cutedsl_MegaMoeConfig', 'Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig', 'Sm120_Mxfp8_Mxfp8_Bf16_Cutedsl_MegaMoeConfig', 'SplitConfig', 'SplitKernelContext', 'available_backends', 'bootstrap_comm_group', 'bootstrap_ep_rank_world', 'bootstrap_ep_world_size', 'bootstrap_moe_ep_runtime', 'create_fleet', 'dummy_moe_weights', 'ensure_bootstrap_dist_validated', 'ensure_moe_ep_cuda_device', 'finalize_moe_ep_runtime', 'have_nccl_ep', 'have_nixl_ep', 'kernel_requires_weights', 'preprocess_mega_weights', 'preprocess_bf16_cutedsl_mega_weights', 'preprocess_bf16_rank_major_cuda_mega_weights', 'preprocess_bf16_nvfp4_cutedsl_mega_weights', 'preprocess_mxfp8_cutedsl_mega_weights', 'preprocess_nvfp4_cutedsl_mega_weights', 'preprocess_sm120_mxfp8_cutedsl_mega_weights', 'preprocess_sm107_mxfp8_mega_weights', 'preprocess_sm107_nvfp4_mega_weights', 'preprocess_sm90_pull_fp8_mega_weights', 'preprocess_sm90_push_fp8_mega_weights', 'run_split_kernel', 'supports_fault_tolerance', 'validate_arch_for_backend', 'validate_bootstrap_process_group_ready', 'validate_bootstrap_world_size', 'validate_fleet_params', 'validate_fleet_weights', 'validate_mega_arch', 'validate_mega_fleet_params', 'validate_mega_forward_inputs', 'validate_split_forward_inputs']
_pkg_dir = None
_REBUILD_HINT = None

def _nccl_libs_dir():
    ...

def _nixl_libs_dir():
    ...

def _probe_nccl_ep():
    ...

def _probe_nixl_ep():
    ...

def have_nccl_ep():
    ...

def have_nixl_ep():
    ...

def available_backends():
    ...

def supports_fault_tolerance():
    ...

def _require_built():
    ...
_set_build_flags = None
