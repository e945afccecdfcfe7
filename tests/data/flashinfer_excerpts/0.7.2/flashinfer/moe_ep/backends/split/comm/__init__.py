# Excerpt of FlashInfer 0.7.2 (moe_ep/backends/split/comm/__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .nvlink_one_sided.config import NVLinkOneSidedConfig
from .nvlink_two_sided.config import NVLinkTwoSidedConfig
NCCLEPConfig = None
__all__ = ['CakeAlltoAllConfig', 'NCCLEPConfig', 'NVLinkOneSidedConfig', 'NVLinkTwoSidedConfig', 'NcclEpConfig', 'NvepConfig']
