# Excerpt of FlashInfer 0.6.16 (comm/trtllm_moe_alltoall.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .mnnvl import CommBackend, MnnvlMemory, MnnvlConfig
from .mapping import Mapping
from ..tllm_enums import SfLayout
MOE_A2A_RANK_MASK_WORDS = 1

def moe_a2a_active_rank_mask(active_ranks: Sequence[int], ep_size: int) -> torch.Tensor:
    return torch.tensor(words, dtype=torch.uint64, device='cpu')

class _A2AState:
    ...

@functools.cache
def get_moe_alltoall_module():
    return SimpleNamespace(moe_a2a_initialize=moe_a2a_initialize, moe_a2a_dispatch=moe_a2a_dispatch, moe_a2a_combine=moe_a2a_combine, moe_a2a_combine_into=moe_a2a_combine_into, moe_a2a_sanitize_expert_ids=moe_a2a_sanitize_expert_ids, moe_a2a_get_metainfo_index_pairs=moe_a2a_get_metainfo_index_pairs, moe_a2a_get_aux_data_size=moe_a2a_get_aux_data_size)

@flashinfer_api
def moe_a2a_initialize(workspace: torch.Tensor, ep_rank: int, ep_size: int, max_num_tokens: int, eplb_stats_num_experts: int=0):
    return get_moe_alltoall_module().moe_a2a_initialize(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts)

@flashinfer_api
def moe_a2a_wrap_payload_tensor_in_workspace(workspace: torch.Tensor, leading_shape: list[int], slice_start: int, slice_end: int, dtype: torch.dtype) -> torch.Tensor:
    return result

@flashinfer_api
def moe_a2a_dispatch(token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor], workspace: torch.Tensor, metainfo: torch.Tensor, runtime_max_tokens_per_rank: int, ep_rank: int, ep_size: int, top_k: int, num_experts: int, enable_pdl: Optional[bool]=None, eplb_local_stats: Optional[torch.Tensor]=None, enable_rank_mask: bool=False, active_rank_mask: Optional[torch.Tensor]=None):
    return (output_payloads, combine_payload_offset, eplb_gathered_stats)

@flashinfer_api
def moe_a2a_combine(payload: torch.Tensor, local_num_tokens: int, workspace: torch.Tensor, metainfo: torch.Tensor, runtime_max_tokens_per_rank: int, ep_rank: int, ep_size: int, top_k: int, combine_payload_offset: int, payload_in_workspace: bool=False, output_dtype: Optional[torch.dtype]=None, output_scales: Optional[torch.Tensor]=None, output_scalar_scale: float=1.0, sf_layout: SfLayout=SfLayout.layout_linear, output: Optional[torch.Tensor]=None, *, use_low_precision: bool=False, enable_pdl: Optional[bool]=None, enable_rank_mask: bool=False, active_rank_mask: Optional[torch.Tensor]=None) -> torch.Tensor:
    return module.moe_a2a_combine(*args)
    return output

@flashinfer_api
def moe_a2a_sanitize_expert_ids(expert_ids: torch.Tensor, workspace: torch.Tensor, metainfo: torch.Tensor, ep_rank: int, invalid_expert_id: int, enable_pdl: Optional[bool]=None):
    return get_moe_alltoall_module().moe_a2a_sanitize_expert_ids(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id, enable_pdl)

@flashinfer_api
def moe_a2a_get_workspace_size_per_rank(ep_size: int, max_num_tokens: int, total_dispatch_payload_size_per_token: int, combine_payload_size_per_token: int, eplb_stats_num_experts: int=0):
    return pad_up(aux_data_size, 128) + pad_up(ep_size * max_num_tokens * total_dispatch_payload_size_per_token, 128) + pad_up(ep_size * max_num_tokens * combine_payload_size_per_token, 128)

class MoeAlltoAll:
    _WORKSPACE_CACHE: dict[tuple[int, int, int, int, int], dict] = {}

    @classmethod
    def get_workspace(cls, workspace_size_per_rank: int, ep_rank: int, ep_size: int, max_num_tokens: int, mapping: Mapping, eplb_stats_num_experts: int=0) -> dict:
        return cls._WORKSPACE_CACHE[key]
        return cls._WORKSPACE_CACHE[key]

    @staticmethod
    @flashinfer_api
    def get_moe_workspace_size_per_rank(ep_size: int, top_k: int, max_num_tokens: int, hidden_size: int, extra_payload_bytes_per_token: int=0, eplb_stats_num_experts: int=0) -> int:
        return moe_a2a_get_workspace_size_per_rank(ep_size, max_num_tokens, total_dispatch_payload_size_per_token, combine_payload_size_per_token, eplb_stats_num_experts)
    _METAINFO_INDEX: Optional[dict] = None

    @classmethod
    def _init_constants(cls):
        ...

    def __init__(self, mapping: Mapping, max_num_tokens: int, top_k: int, num_experts: int, workspace_size_per_rank: int=None, hidden_size: int=None, mnnvl_config: Optional[MnnvlConfig]=None, eplb_stats_num_experts: int=0, enable_rank_mask: bool=False):
        self._WORKSPACE = None
        self._state = None
        self.enable_eplb = None
        self.enable_rank_mask = None
        self.ep_rank = None
        self.ep_size = None
        self.eplb_stats_num_experts = None
        self.max_num_tokens = None
        self.metainfo = None
        self.mnnvl_mem = None
        self.num_experts = None
        self.top_k = None
        self.workspace = None
        self.workspace_size_per_rank = None

    @property
    def eplb_gathered_stats(self) -> Optional[torch.Tensor]:
        return self._state.eplb_gathered_stats

    @flashinfer_api
    def checkpoint_prepare(self) -> None:
        return

    @flashinfer_api
    def checkpoint_restore(self, comm_backend: CommBackend) -> None:
        self._state = None
        return

    def _reset_workspace(self):
        ...

    @flashinfer_api
    def dispatch(self, token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor], runtime_max_tokens_per_rank: int, invalid_token_expert_id: Optional[int]=None, expert_id_payload_index: Optional[int]=None, eplb_local_stats: Optional[torch.Tensor]=None, active_rank_mask: Optional[torch.Tensor]=None) -> list[torch.Tensor]:
        return recv_tensors

    @flashinfer_api
    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int, payload_in_workspace: bool=False, output_dtype: Optional[torch.dtype]=None, output_scales: Optional[torch.Tensor]=None, output_scalar_scale: float=1.0, sf_layout: SfLayout=SfLayout.layout_linear, output: Optional[torch.Tensor]=None, *, use_low_precision: bool=False, active_rank_mask: Optional[torch.Tensor]=None) -> torch.Tensor:
        self._state = None
        return output

    @flashinfer_api
    def get_combine_payload_tensor_in_workspace(self, runtime_max_tokens_per_rank: int, hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
        return moe_a2a_wrap_payload_tensor_in_workspace(self.workspace[self.ep_rank, :], [self.ep_size, runtime_max_tokens_per_rank], self._state.combine_payload_offset, self._state.combine_payload_offset + self.ep_size * runtime_max_tokens_per_rank * hidden_size * element_size, dtype)
__all__ = ['MoeAlltoAll', 'moe_a2a_combine', 'moe_a2a_dispatch', 'moe_a2a_get_workspace_size_per_rank', 'moe_a2a_initialize', 'moe_a2a_sanitize_expert_ids', 'moe_a2a_wrap_payload_tensor_in_workspace']
