# Excerpt of FlashInfer 0.7.2 (moe_ep/core/comm/communication.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
def _ceil_div():
    ...

@dataclass(frozen=True)
class MoEEpCommParams:
    num_experts: int
    top_k: int
    max_tokens_per_rank: int
    hidden_size: int
    dtype: 'torch.dtype | None' = None
    dispatch_format: 'QuantFormat | None' = None
    invalid_expert_id: int = -1

    def __post_init__(self) -> None:
        ...

    @property
    def token_dtype(self) -> 'torch.dtype':
        return torch.bfloat16 if self.dtype is None else self.dtype

    @property
    def dispatch_bytes_per_token(self) -> int:
        return self.hidden_size * self.token_dtype.itemsize
        return _DISPATCH_BYTES_PER_TOKEN[self.dispatch_format.name](self.hidden_size)

@dataclass(frozen=True)
class MoEEpDispatchResult:
    hidden_states: 'torch.Tensor'
    topk_ids: 'torch.Tensor'
    topk_weights: 'torch.Tensor | None'
    tokens_per_rank: int
    hidden_states_scale: 'torch.Tensor | None' = None
    eplb_gathered_stats: 'torch.Tensor | None' = None

class MoEEpCommunication(ABC):
    backend_name: ClassVar[str]
    supports_cuda_graph: ClassVar[bool] = True

    def __init__(self, bootstrap: 'BootstrapConfig', params: MoEEpCommParams) -> None:
        self.bootstrap = None
        self.ep_rank = None
        self.ep_size = None
        self.num_local_experts = None
        self.params = None

    @classmethod
    @abstractmethod
    def is_platform_supported(cls) -> bool:
        ...

    def is_workload_feasible(self, max_tokens_per_rank: int) -> bool:
        return max_tokens_per_rank <= self.params.max_tokens_per_rank

    @abstractmethod
    def dispatch(self, hidden_states: 'torch.Tensor', topk_ids: 'torch.Tensor', topk_weights: 'torch.Tensor | None'=None, *, hidden_states_scale: 'torch.Tensor | None'=None, max_tokens_per_rank: Optional[int]=None, eplb_local_stats: 'torch.Tensor | None'=None) -> MoEEpDispatchResult:
        ...

    @abstractmethod
    def combine(self, expert_output: 'torch.Tensor', *, output: 'torch.Tensor | None'=None) -> 'torch.Tensor':
        ...

    def get_combine_input_buffer(self, dtype: 'torch.dtype') -> 'torch.Tensor | None':
        return None

    def destroy(self) -> None:
        ...

def register_communication(name: str) -> Callable[[type[MoEEpCommunication]], type[MoEEpCommunication]]:
    return decorator

def communication_backend_name():
    ...

def is_communication_backend():
    ...

def available_communication_backends() -> list[str]:
    return sorted((name for name, cls in _COMMUNICATION_REGISTRY.items() if cls.is_platform_supported()))

def create_communication(bootstrap: 'BootstrapConfig', params: MoEEpCommParams, backend: Any, **options: Any) -> MoEEpCommunication:
    return cls(bootstrap, params, **options)
