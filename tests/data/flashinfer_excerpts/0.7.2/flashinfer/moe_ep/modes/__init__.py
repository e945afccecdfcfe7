# Excerpt of FlashInfer 0.7.2 (moe_ep/modes/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from ..backends.split.comm import NVLinkOneSidedConfig, NVLinkTwoSidedConfig
__all__ = ['CakeAlltoAllConfig', 'FusedMoeKernelConfig', 'IdentityConfig', 'MegaConfig', 'MoEEpMegaLayer', 'MoEEpMegaWorkspace', 'MoEEpSplitGraphState', 'MoEEpSplitLayer', 'NCCLEPConfig', 'NVLinkOneSidedConfig', 'NVLinkTwoSidedConfig', 'NcclEpConfig', 'NvepConfig', 'SplitConfig', 'SplitKernelContext', 'kernel_requires_weights', 'run_split_kernel']
