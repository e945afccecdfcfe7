# Excerpt of FlashInfer 0.7.2 (moe_ep/backends/split/comm/nvlink_one_sided/config.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
@dataclass
class NVLinkOneSidedConfig:
    backend_name: str = 'nvlink_one_sided'
    extra_payload_bytes_per_token: int = 0
    eplb_stats_num_experts: int = 0
    enable_rank_mask: bool = False
    use_low_precision_combine: bool = False
    comm_backend: Optional['CommBackend'] = None
