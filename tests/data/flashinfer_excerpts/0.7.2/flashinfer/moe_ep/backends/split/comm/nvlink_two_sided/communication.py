# Excerpt of FlashInfer 0.7.2 (moe_ep/backends/split/comm/nvlink_two_sided/communication.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .....core.comm.communication import MoEEpCommunication

@register_communication('nvlink_two_sided')
class NVLinkTwoSidedAlltoAll(MoEEpCommunication):

    def __init__(self, bootstrap: 'BootstrapConfig', params: MoEEpCommParams, config: Optional[NVLinkTwoSidedConfig]=None) -> None:
        self._prepare_workspace = None
        self._state = None
        self._workspace = None
        self.config = None

    @classmethod
    def is_platform_supported(cls) -> bool:
        return nvlink_platform_supported()

    def dispatch(self, hidden_states: 'torch.Tensor', topk_ids: 'torch.Tensor', topk_weights: 'torch.Tensor | None'=None, *, hidden_states_scale: 'torch.Tensor | None'=None, max_tokens_per_rank: Optional[int]=None, eplb_local_stats: 'torch.Tensor | None'=None) -> MoEEpDispatchResult:
        self._state = None
        return MoEEpDispatchResult(hidden_states=recv_hidden, hidden_states_scale=recv_scale, topk_ids=recv_topk_ids, topk_weights=recv_topk_weights, tokens_per_rank=tokens_per_rank, eplb_gathered_stats=gathered_stats)

    def combine(self, expert_output: 'torch.Tensor', *, output: 'torch.Tensor | None'=None) -> 'torch.Tensor':
        self._state = None
        return output
        return combined

    def destroy(self) -> None:
        self._prepare_workspace = None
        self._state = None
        self._workspace = None
