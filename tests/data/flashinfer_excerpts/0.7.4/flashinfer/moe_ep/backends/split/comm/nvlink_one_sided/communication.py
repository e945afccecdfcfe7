# Excerpt of FlashInfer 0.7.4 (moe_ep/backends/split/comm/nvlink_one_sided/communication.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .....core.comm.communication import MoEEpCommunication
logger = None
_MAX_TIMEOUT_SEC = None
_CFT_MIN_DRIVER_BRANCH = None
_CFT_ALIGNMENT_BYTES = None
_SUPPORTED_TOP_K = None
_LAMPORT_FORMATS = None
_LAMPORT_MIN_DEFAULT_MAX_TOKENS = None
_LAMPORT_MAX_DEFAULT_REGION_BYTES = None

def _driver_branch():
    ...

def _cft_unsupported_reason():
    ...

def _probe_cft_support():
    ...

class _LamportRow:
    ...

def _lamport_row():
    ...

def _probe_lamport_support():
    ...

def _lamport_unsupported_reason():
    ...

def _default_lamport_max_tokens():
    ...

def _lamport_request():
    ...

def _log_unavailable():
    ...

@register_communication('nvlink_one_sided')
class NVLinkOneSidedAlltoAll(MoEEpCommunication):
    _WORKSPACES: ClassVar[dict[tuple, dict[str, Any]]] = {}
    _CFT_WORKSPACE_KEY: ClassVar[Optional[tuple]] = None

    def __init__(self, bootstrap: 'BootstrapConfig', params: MoEEpCommParams, config: Optional[NVLinkOneSidedConfig]=None) -> None:
        self._enable_pdl = None
        self._index = None
        self._lamport_format = None
        self._lamport_row = None
        self._lamport_workspace_bytes = None
        self._module = None
        self._rank_bytes = None
        self._round = None
        self._state = None
        self.config = None
        self.lamport_max_tokens = None
        self.metainfo = None
        self.workspace = None

    def _acquire_workspace(self, mapping: Any, comm: 'CommBackend', metainfo: 'torch.Tensor', cft_capable: bool) -> dict[str, Any]:
        return state

    def _bind_cft(self, key: tuple, comm: 'CommBackend', mnnvl_mem: Any, workspace: 'torch.Tensor', size: int) -> bool:
        return False
        return False
        return False
        return True

    def _create_cft_endpoints(self, comm: 'CommBackend', mnnvl_mem: Any, workspace: 'torch.Tensor', size: int) -> bool:
        return False
        return True

    def _cft_endpoint_ids(self) -> 'torch.Tensor':
        return ids

    @classmethod
    def is_platform_supported(cls) -> bool:
        return nvlink_platform_supported()

    @property
    def _cft_enabled(self) -> bool:
        return self._state is not None and self._state['cft_ready']

    def active_rank_mask(self, active_ranks: Sequence[int]) -> 'torch.Tensor':
        return torch.tensor([mask >> 64 * word & 18446744073709551615 for word in range(words)], dtype=torch.uint64)

    def _workspace_view(self, offset: int, dtype: 'torch.dtype', shape: tuple[int, ...]) -> 'torch.Tensor':
        return view

    @property
    def lamport_enabled(self) -> bool:
        return self._state is not None and self.lamport_max_tokens > 0

    def _lamport_carries(self, tokens_per_rank: int, hidden_states: 'torch.Tensor', hidden_states_scale: 'torch.Tensor | None', topk_weights: 'torch.Tensor | None', eplb_local_stats: 'torch.Tensor | None') -> bool:
        return False
        return False
        return False
        return False
        return topk_weights is None or (topk_weights.dim() == 2 and (topk_weights.shape[1], topk_weights.element_size()) == (self.params.top_k, 4))

    def _dispatch_transports(self, tokens_per_rank: int, payloads: 'Sequence[torch.Tensor]', hidden_states: 'torch.Tensor', hidden_states_scale: 'torch.Tensor | None', topk_weights: 'torch.Tensor | None', eplb_local_stats: 'torch.Tensor | None') -> tuple[bool, bool]:
        return (use_lamport, use_cft)

    def _use_cft(self, tokens_per_rank: int, max_tokens: int) -> bool:
        return False
        return self.config.cft is True or tokens_per_rank <= max_tokens

    def _combine_uses_cft(self, tokens_per_rank: int, hidden: int, element_size: int) -> bool:
        return self._use_cft(tokens_per_rank, self.config.cft_max_tokens_for_combine) and wire_bytes % _CFT_ALIGNMENT_BYTES == 0

    def _check_rank_mask(self, active_rank_mask: 'torch.Tensor | None') -> None:
        return

    def dispatch(self, hidden_states: 'torch.Tensor', topk_ids: 'torch.Tensor', topk_weights: 'torch.Tensor | None'=None, *, hidden_states_scale: 'torch.Tensor | None'=None, runtime_max_tokens_per_rank: Optional[int]=None, eplb_local_stats: 'torch.Tensor | None'=None, active_rank_mask: 'torch.Tensor | None'=None) -> MoEEpDispatchResult:
        self._round = None
        return MoEEpDispatchResult(hidden_states=recv[0], hidden_states_scale=recv[1] if hidden_states_scale is not None else None, topk_ids=recv[expert_id_index], topk_weights=recv[expert_id_index + 1] if topk_weights is not None else None, tokens_per_rank=tokens_per_rank, eplb_gathered_stats=eplb_gathered_stats)

    def get_combine_input_buffer(self, dtype: 'torch.dtype') -> 'torch.Tensor':
        return self._workspace_view(self._round['combine_offset'], dtype, (rows, self.params.hidden_size))

    def combine(self, expert_output: 'torch.Tensor', *, output: 'torch.Tensor | None'=None, active_rank_mask: 'torch.Tensor | None'=None) -> 'torch.Tensor':
        self._round = None
        return output

    def checkpoint_prepare(self) -> None:
        ...

    def checkpoint_restore(self, comm_backend: 'CommBackend') -> None:
        self._round = None
        return
        return

    def destroy(self) -> None:
        self._rank_bytes = None
        self._round = None
        self._state = None
        self.metainfo = None
        self.workspace = None
        return
        return
