# Excerpt of FlashInfer 0.7.4 (moe_ep/backends/split/comm/nvlink_one_sided/config.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
@dataclass
class NVLinkOneSidedConfig:
    backend_name: str = 'nvlink_one_sided'
    extra_payload_bytes_per_token: int = 0
    eplb_stats_num_experts: int = 0
    enable_rank_mask: bool = False
    use_low_precision_combine: bool = False
    comm_backend: Optional['CommBackend'] = None
    cft: Optional[bool] = None
    cft_max_tokens_for_dispatch: int = 128
    cft_max_tokens_for_combine: int = 128
    lamport: Optional[bool] = None
    lamport_max_tokens: Optional[int] = None
    timeout_sec: int = 300
    enable_pdl: Optional[bool] = None
