# Excerpt of FlashInfer 0.6.16.post2 (moe_ep/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
__all__ = ['AlgoKnob', 'BootstrapConfig', 'CombineInputParams', 'CombineOutput', 'DeepGemmMegaMoeConfig', 'DispatchInputParams', 'DispatchOutput', 'EpAlgorithm', 'EpLayout', 'Fleet', 'FleetAlgoKnobAllocator', 'FleetAlgoKnobNumChannelsPerRank', 'FleetAlgoKnobNumQpsPerRank', 'FleetAlgoKnobQuantization', 'FleetAlgoKnobRdmaBufferSize', 'FleetAlgoKnobTopologyCapacity', 'FleetParams', 'FusedMoeKernelConfig', 'Handle', 'HandleAlgoKnobNumReceivedTokens', 'HandleAlgoKnobSplitOperation', 'HandleAlgoKnobTopKWeights', 'HandleAlgoKnobUserStream', 'HandleParams', 'IdentityConfig', 'MegaConfig', 'MoEEpArchError', 'MoEEpConfigError', 'MoEEpLayer', 'MoEEpMegaLayer', 'MoEEpNotBuiltError', 'MoEEpSplitLayer', 'MoEEpTensors', 'MoEWeightPack', 'Mxfp8CutedslMegaMoeConfig', 'NCCLEPConfig', 'NcclEpConfig', 'Nvfp4CutedslMegaMoeConfig', 'NvepConfig', 'QuantType', 'SplitConfig', 'SplitKernelContext', 'available_backends', 'bootstrap_comm_group', 'bootstrap_ep_rank_world', 'bootstrap_ep_world_size', 'bootstrap_moe_ep_runtime', 'create_fleet', 'dummy_moe_weights', 'ensure_bootstrap_dist_validated', 'ensure_moe_ep_cuda_device', 'finalize_moe_ep_runtime', 'have_nccl_ep', 'have_nixl_ep', 'kernel_requires_weights', 'preprocess_mega_weights', 'preprocess_mxfp8_cutedsl_mega_weights', 'preprocess_nvfp4_cutedsl_mega_weights', 'run_split_kernel', 'validate_arch_for_backend', 'validate_bootstrap_process_group_ready', 'validate_bootstrap_world_size', 'validate_fleet_params', 'validate_fleet_weights', 'validate_mega_arch', 'validate_mega_fleet_params', 'validate_mega_forward_inputs', 'validate_split_forward_inputs']
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

def _require_built():
    ...
_set_build_flags = None
