# Excerpt of FlashInfer 0.7.2 (moe_ep/backends/split/comm/nvlink_one_sided/communication.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .....core.comm.communication import MoEEpCommunication

@register_communication('nvlink_one_sided')
class NVLinkOneSidedAlltoAll(MoEEpCommunication):
    alltoall_backend: ClassVar['MoeAlltoAllBackend'] = 'trtllm'

    def __init__(self, bootstrap: 'BootstrapConfig', params: MoEEpCommParams, config: Optional[NVLinkOneSidedConfig]=None) -> None:
        self._alltoall = None
        self._combine_buffer = None
        self._tokens_per_rank = None
        self.config = None

    @classmethod
    def is_platform_supported(cls) -> bool:
        return nvlink_platform_supported()

    @property
    def alltoall(self) -> 'MoeAlltoAll':
        return self._alltoall

    def dispatch(self, hidden_states: 'torch.Tensor', topk_ids: 'torch.Tensor', topk_weights: 'torch.Tensor | None'=None, *, hidden_states_scale: 'torch.Tensor | None'=None, max_tokens_per_rank: Optional[int]=None, eplb_local_stats: 'torch.Tensor | None'=None, active_rank_mask: 'torch.Tensor | None'=None) -> MoEEpDispatchResult:
        self._tokens_per_rank = None
        return MoEEpDispatchResult(hidden_states=recv[0], hidden_states_scale=recv[1] if hidden_states_scale is not None else None, topk_ids=recv[expert_id_index], topk_weights=recv[expert_id_index + 1] if topk_weights is not None else None, tokens_per_rank=tokens_per_rank, eplb_gathered_stats=alltoall.eplb_gathered_stats)

    def get_combine_input_buffer(self, dtype: 'torch.dtype') -> 'torch.Tensor':
        self._combine_buffer = None
        return buffer

    def combine(self, expert_output: 'torch.Tensor', *, output: 'torch.Tensor | None'=None, active_rank_mask: 'torch.Tensor | None'=None) -> 'torch.Tensor':
        self._combine_buffer = None
        self._tokens_per_rank = None
        return combined

    def destroy(self) -> None:
        self._alltoall = None
        self._combine_buffer = None
        self._tokens_per_rank = None
