# Excerpt of FlashInfer 0.7.2 (moe_ep/config.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
class EpAlgorithm:
    ...

class EpLayout:
    ...

class QuantType:
    ...

@dataclass(frozen=True)
class BootstrapConfig:
    world_size: int
    rank: int
    stream: int = 0
    auto_bootstrap: bool = True
    device: Optional[int] = field(default=None, kw_only=True)
    nccl_comm: Optional[int] = None
    process_group: Optional['torch.distributed.ProcessGroup'] = field(default=None, compare=False, hash=False)
    tcp_store: Optional['torch.distributed.TCPStore'] = None

    def __post_init__(self) -> None:
        ...

class FleetParams:
    ...

class HandleParams:
    ...

class DispatchInputParams:
    ...

class DispatchOutput:
    ...

class CombineInputParams:
    ...

class CombineOutput:
    ...
