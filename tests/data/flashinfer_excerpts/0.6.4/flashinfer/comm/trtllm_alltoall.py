# Excerpt of FlashInfer 0.6.4 (comm/trtllm_alltoall.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .mapping import Mapping
from .mnnvl import MnnvlMemory, MnnvlConfig

def get_comm_alltoall_module():
    ...

def moe_comm_prepare_indices(gathered_target_rank_ids: torch.Tensor, real_rank_token_count_cum_sum: Optional[torch.Tensor], max_token_count_per_rank: int, expert_count: int, top_k: int, ep_rank: int, ep_size: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return get_comm_alltoall_module().moe_comm_prepare_indices(gathered_target_rank_ids, real_rank_token_count_cum_sum, max_token_count_per_rank, expert_count, top_k, ep_rank, ep_size)

def moe_local_gather(recv_rank_cum_sum: torch.Tensor, local_gather_indices: torch.Tensor, gathered_expert_ids: torch.Tensor, gathered_scales: torch.Tensor, local_expert_ids: torch.Tensor, local_scales: torch.Tensor, max_token_count_per_rank: int, expert_count: int, top_k: int, ep_rank: int, ep_size: int) -> None:
    ...

def moe_comm(input: torch.Tensor, send_rank_cum_sum: torch.Tensor, send_indices: torch.Tensor, output: torch.Tensor, recv_rank_cum_sum: torch.Tensor, recv_indices: torch.Tensor, all_workspaces: torch.Tensor, ep_rank: int, ep_size: int) -> None:
    ...

def set_moe_max_usable_sm_count():
    ...

def get_moe_commworkspace_size_per_rank(ep_size: int) -> int:
    return get_comm_alltoall_module().get_moe_commworkspace_size_per_rank(ep_size)

def get_moe_prepare_workspace_size_per_rank(ep_size: int) -> int:
    return get_comm_alltoall_module().get_moe_prepare_workspace_size_per_rank(ep_size)

def moe_prepare(experts_ids: torch.Tensor, scales: Optional[torch.Tensor], experts_statics: Optional[torch.Tensor], workspace: torch.Tensor, max_token_count_per_rank: int, ep_rank: int, ep_size: int, expert_count: int, slot_count: int, top_k: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return get_comm_alltoall_module().moe_prepare(experts_ids, scales, experts_statics, workspace, max_token_count_per_rank, ep_rank, ep_size, expert_count, slot_count, top_k)

@dataclass
class MoEAlltoallInfo:
    local_gather_indices: torch.Tensor
    send_rank_count_cumsum: torch.Tensor
    send_rank_local_indices: torch.Tensor
    recv_rank_count_cumsum: torch.Tensor
    recv_rank_local_indices: torch.Tensor
    backward_recv_rank_local_indices: torch.Tensor
    local_token_allocation_count: int

class MnnvlMoe:
    moe_workspace: MnnvlMemory = None
    moe_prepare_workspace: MnnvlMemory = None
    moe_workspace_tensor: torch.Tensor = None
    moe_prepare_workspace_tensor: torch.Tensor = None
    moe_mapping: Mapping = None

    @staticmethod
    def get_moe_workspaces(mapping: Mapping, config: Optional[MnnvlConfig]=None):
        return MnnvlMoe.moe_workspace_tensor
        return MnnvlMoe.moe_workspace_tensor

    @staticmethod
    def get_moe_prepare_workspace(mapping: Mapping, config: Optional[MnnvlConfig]=None):
        return MnnvlMoe.moe_prepare_workspace_tensor
        return MnnvlMoe.moe_prepare_workspace_tensor

    @staticmethod
    def compute_target_rank_id(token_selected_experts: torch.Tensor, expert_count: int, ep_size: int):
        return token_target_rank_ids

    @staticmethod
    def mnnvl_moe_alltoallv_prepare_without_allgather(expert_ids: torch.Tensor, scales: torch.Tensor, expert_statics: Optional[torch.Tensor], workspace: torch.Tensor, max_token_count_per_rank: int, ep_rank: int, ep_size: int, expert_count: int, slot_count: int, top_k: int):
        return (alltoall_info, prepared_local_experts, prepared_local_scales, gathered_expert_statics)

    @staticmethod
    def mnnvl_moe_alltoallv_prepare(gathered_target_rank_ids: torch.Tensor, real_rank_token_count_cumsum: torch.Tensor, gathered_expert_ids: torch.Tensor, gathered_scales: torch.Tensor, max_token_count_per_rank: int, expert_count: int, top_k: int, ep_rank: int, ep_size: int):
        return (alltoall_info, local_expert_ids, local_scales)

    @staticmethod
    def mnnvl_moe_alltoallv(x: torch.Tensor, alltoall_info: MoEAlltoallInfo, workspace: torch.Tensor, ep_rank: int, ep_size: int):
        return output_tensor

    @staticmethod
    def mnnvl_moe_alltoallv_combine(x: torch.Tensor, alltoall_info: MoEAlltoallInfo, workspace: torch.Tensor, ep_rank: int, ep_size: int, top_k: int, token_count: int):
        return torch.sum(output_tensor.reshape(token_count, top_k, x.shape[1]), dim=1, keepdim=False)
