# Excerpt of FlashInfer 0.6.13 (moe_ep/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
__all__ = ['AlgoKnob', 'BootstrapConfig', 'CombineInputParams', 'CombineOutput', 'DispatchInputParams', 'DispatchOutput', 'EpAlgorithm', 'Fleet', 'FleetAlgoKnobNumChannelsPerRank', 'FleetAlgoKnobNumQpsPerRank', 'FleetAlgoKnobQuantization', 'FleetAlgoKnobRdmaBufferSize', 'FleetAlgoKnobTopologyCapacity', 'FleetParams', 'Handle', 'HandleAlgoKnobNumReceivedTokens', 'HandleAlgoKnobSplitOperation', 'HandleAlgoKnobTopKWeights', 'HandleAlgoKnobUserStream', 'HandleParams', 'MoEEpArchError', 'MoEEpConfigError', 'MoEEpLayer', 'MoEEpNotBuiltError', 'MoEEpTensors', 'NcclEpConfig', 'NvepConfig', 'QuantType', 'available_backends', 'create_fleet', 'have_nccl_ep', 'have_nixl_ep']
_pkg_dir = None
_REBUILD_HINT = None

class MoEEpNotBuiltError:
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
