# Excerpt of FlashInfer 0.7.2 (moe_ep/backends/split/comm/nvlink_two_sided/config.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
@dataclass
class NVLinkTwoSidedConfig:
    backend_name: str = 'nvlink_two_sided'
    comm_backend: Optional['CommBackend'] = None
