"""Fake 0.7.2 ``flashinfer.moe_ep`` NVLink backends (``backends/split/comm/nvlink_*`` there):
``NVLinkOneSidedAlltoAll`` over the (deprecated) one-sided ``MoeAlltoAll`` and
``NVLinkTwoSidedAlltoAll`` over ``MnnvlMoe``, as 0.7.2 builds them: a pure-EP ``Mapping``,
the MNNVL communicator checked collectively against the bootstrap, and the payload order
``[hidden, (scale), ids, (weights)]``. The fake machine always has NVLink.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch

from fakes import observe

from fakes.flashinfer.moe_ep.communication import (
    MoEEpCommParams,
    MoEEpCommunication,
    MoEEpDispatchResult,
    register_communication,
)


@dataclass
class NVLinkOneSidedConfig:
    """Options of :class:`NVLinkOneSidedAlltoAll`; ``comm_backend`` exchanges the MNNVL
    handles (default: torch.distributed over the bootstrap's process group)."""

    backend_name: str = "nvlink_one_sided"
    extra_payload_bytes_per_token: int = 0
    eplb_stats_num_experts: int = 0
    enable_rank_mask: bool = False
    use_low_precision_combine: bool = False
    comm_backend: Optional[Any] = None


@dataclass
class NVLinkTwoSidedConfig:
    """Options of :class:`NVLinkTwoSidedAlltoAll`."""

    backend_name: str = "nvlink_two_sided"
    comm_backend: Optional[Any] = None


def dispatch_payloads(hidden_states, hidden_states_scale, topk_ids, topk_weights) -> tuple[list, int]:
    """The one-sided dispatch's payloads ``[hidden, (scale), ids (int32), (weights)]`` and the
    index of the ids among them."""
    if topk_ids.dtype != torch.int32:
        topk_ids = topk_ids.to(torch.int32)
    payloads = [hidden_states] + ([hidden_states_scale] if hidden_states_scale is not None else [])
    ids_at = len(payloads)
    return payloads + [topk_ids] + ([topk_weights] if topk_weights is not None else []), ids_at


def dispatch_result(recv, ids_at: int, has_scale: bool, has_weights: bool, tokens_per_rank: int,
                    eplb_gathered_stats) -> MoEEpDispatchResult:
    """The result over the ``[ep_size, tokens_per_rank, ...]`` receive buffers of
    :func:`dispatch_payloads`' payloads, flattened rank-major."""
    recv = [t.flatten(0, 1) for t in recv]
    return MoEEpDispatchResult(
        hidden_states=recv[0], hidden_states_scale=recv[1] if has_scale else None, topk_ids=recv[ids_at],
        topk_weights=recv[ids_at + 1] if has_weights else None, tokens_per_rank=tokens_per_rank,
        eplb_gathered_stats=eplb_gathered_stats)


def rank_major(expert_output, ep_size: int, tokens_per_rank: int):
    """``[ep_size, tokens_per_rank, hidden]`` of a combine's 2D or 3D expert output."""
    if expert_output.dim() == 2:
        return expert_output.view(ep_size, tokens_per_rank, -1)
    if expert_output.dim() == 3:
        return expert_output
    raise ValueError(f"expert_output must be 2D or 3D, got shape {tuple(expert_output.shape)}")


def nvlink_platform_supported() -> bool:
    from fakes.flashinfer.comm import mnnvl

    return bool(mnnvl.MnnvlMemory.supports_mnnvl())


def mnnvl_mapping_and_config(bootstrap, comm_backend=None):
    """The EP group as a pure-EP ``Mapping`` and the MNNVL communicator; collective: every rank
    reports whether it can run the NVLink backends and all raise if one cannot."""
    from fakes.flashinfer.comm.comm_backend import TorchDistBackend
    from fakes.flashinfer.comm.mapping import Mapping
    from fakes.flashinfer.comm.mnnvl import MnnvlConfig

    if comm_backend is None:
        comm_backend = TorchDistBackend(group=bootstrap.process_group)
    if comm_backend.Get_size() != bootstrap.world_size:
        raise ValueError(f"MNNVL communicator has {comm_backend.Get_size()} ranks but the EP "
                         f"group has world_size={bootstrap.world_size}")
    if comm_backend.Get_rank() != bootstrap.rank:
        raise ValueError(f"MNNVL communicator rank {comm_backend.Get_rank()} does not match "
                         f"the EP rank {bootstrap.rank}")
    verdicts = comm_backend.allgather(nvlink_platform_supported())
    unsupported = [rank for rank, ok in enumerate(verdicts) if not ok]
    if unsupported:
        raise RuntimeError(f"NVLink backends are not supported on EP ranks {unsupported}; see "
                           "their logs for the reason")
    ws = bootstrap.world_size
    mapping = Mapping(world_size=ws, rank=bootstrap.rank, gpus_per_node=ws, tp_size=ws, moe_ep_size=ws)
    return mapping, MnnvlConfig(comm_backend=comm_backend)


@register_communication("nvlink_one_sided")
class NVLinkOneSidedAlltoAll(MoEEpCommunication):
    """Rank-major dispatch/combine with the one-sided put/get kernels; received rows past
    each source's token count get ``invalid_expert_id`` routing."""

    alltoall_backend: ClassVar[str] = "trtllm"

    def __init__(self, bootstrap, params: MoEEpCommParams, config: Optional[NVLinkOneSidedConfig] = None) -> None:
        from fakes.flashinfer.comm import trtllm_moe_alltoall as a2a

        self.config = NVLinkOneSidedConfig() if config is None else config
        mapping, mnnvl_config = mnnvl_mapping_and_config(bootstrap, self.config.comm_backend)
        super().__init__(bootstrap, params)
        if self.config.extra_payload_bytes_per_token < 0:
            raise ValueError("extra_payload_bytes_per_token must be non-negative")
        dispatch_bytes = (params.dispatch_bytes_per_token + 2 * params.top_k * 4
                          + self.config.extra_payload_bytes_per_token)
        combine_bytes = params.hidden_size * max(params.token_dtype.itemsize, 2)
        size = a2a.moe_a2a_get_workspace_size_per_rank(
            self.ep_size, params.max_tokens_per_rank, dispatch_bytes, combine_bytes,
            self.config.eplb_stats_num_experts, backend=self.alltoall_backend)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "MoeAlltoAll is deprecated", DeprecationWarning)
            # Through the module's attribute at construction, as the real backend imports it
            # (so a class put there, as a recording subclass, is the one built).
            self._alltoall = a2a.MoeAlltoAll(
                mapping, max_num_tokens=params.max_tokens_per_rank, top_k=params.top_k,
                num_experts=params.num_experts, workspace_size_per_rank=size, mnnvl_config=mnnvl_config,
                eplb_stats_num_experts=self.config.eplb_stats_num_experts,
                enable_rank_mask=self.config.enable_rank_mask, backend=self.alltoall_backend)
        self._tokens_per_rank: Optional[int] = None
        self._combine_buffer: Optional[torch.Tensor] = None

    @classmethod
    def is_platform_supported(cls) -> bool:
        return nvlink_platform_supported()

    @property
    def alltoall(self):
        """The underlying ``MoeAlltoAll`` (checkpointing, metainfo)."""
        if self._alltoall is None:
            raise RuntimeError("NVLinkOneSidedAlltoAll has been destroyed")
        return self._alltoall

    def dispatch(self, hidden_states, topk_ids, topk_weights=None, *, hidden_states_scale=None,
                 max_tokens_per_rank=None, eplb_local_stats=None, active_rank_mask=None):
        alltoall = self.alltoall
        if self._tokens_per_rank is not None:
            raise RuntimeError("dispatch called twice without an intervening combine")
        tokens_per_rank = self._tokens_per_rank_for(max_tokens_per_rank)
        payloads, ids_at = dispatch_payloads(hidden_states, hidden_states_scale, topk_ids, topk_weights)
        recv = alltoall.dispatch(payloads[ids_at], payloads, tokens_per_rank,
                                 invalid_token_expert_id=self.params.invalid_expert_id,
                                 expert_id_payload_index=ids_at, eplb_local_stats=eplb_local_stats,
                                 active_rank_mask=active_rank_mask)
        self._tokens_per_rank = tokens_per_rank
        observe.emit("communication_dispatched", communication=self,
                     combine_offset=int(alltoall._state.combine_payload_offset))
        return dispatch_result(recv, ids_at, hidden_states_scale is not None, topk_weights is not None,
                               tokens_per_rank, alltoall.eplb_gathered_stats)

    def get_combine_input_buffer(self, dtype):
        """``[ep_size * tokens_per_rank, hidden_size]`` view of this rank's combine region."""
        if self._tokens_per_rank is None:
            raise RuntimeError("get_combine_input_buffer called before dispatch")
        buffer = self.alltoall.get_combine_payload_tensor_in_workspace(
            self._tokens_per_rank, self.params.hidden_size, dtype).flatten(0, 1)
        self._combine_buffer = buffer
        return buffer

    def combine(self, expert_output, *, output=None, active_rank_mask=None):
        alltoall = self.alltoall
        tokens_per_rank = self._tokens_per_rank
        if tokens_per_rank is None:
            raise RuntimeError("combine called before dispatch")
        payload = rank_major(expert_output, self.ep_size, tokens_per_rank)
        in_workspace = (self._combine_buffer is not None
                        and expert_output.data_ptr() == self._combine_buffer.data_ptr())
        combined = alltoall.combine(payload, tokens_per_rank, payload_in_workspace=in_workspace, output=output,
                                    use_low_precision=self.config.use_low_precision_combine,
                                    active_rank_mask=active_rank_mask)
        self._tokens_per_rank = None
        self._combine_buffer = None
        return combined

    def destroy(self) -> None:
        self._alltoall = None
        self._tokens_per_rank = None
        self._combine_buffer = None


class TwoSidedRows:
    """The two-sided all-to-all-v (``MnnvlMoe``'s kernels) both releases' backends run:
    needs ``num_experts % 4 == 0``; weights travel as float32."""

    def __init__(self, bootstrap, params: MoEEpCommParams, config: Optional[NVLinkTwoSidedConfig] = None) -> None:
        from fakes.flashinfer.comm import mnnvl
        from fakes.flashinfer.comm.trtllm_alltoall import _MnnvlMoe as MnnvlMoe

        self.config = NVLinkTwoSidedConfig() if config is None else config
        mapping, mnnvl_config = mnnvl_mapping_and_config(bootstrap, self.config.comm_backend)
        super().__init__(bootstrap, params)
        if params.num_experts % 4 != 0:
            raise ValueError(f"NVLinkTwoSidedAlltoAll requires num_experts divisible by 4, got {params.num_experts}")
        mnnvl.MnnvlMemory.initialize()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "MnnvlMoe is deprecated", DeprecationWarning)
            self._workspace = MnnvlMoe.get_moe_workspaces(mapping, mnnvl_config)
            self._prepare_workspace = MnnvlMoe.get_moe_prepare_workspace(mapping, mnnvl_config)
        self._state: Optional[dict[str, Any]] = None

    @classmethod
    def is_platform_supported(cls) -> bool:
        return nvlink_platform_supported()

    def _dispatch_rows(self, hidden_states, topk_ids, topk_weights, hidden_states_scale, tokens_per_rank,
                       eplb_local_stats) -> MoEEpDispatchResult:
        from fakes.flashinfer.comm.trtllm_alltoall import _MnnvlMoe as MnnvlMoe

        if topk_ids.dtype != torch.int32:
            topk_ids = topk_ids.to(torch.int32)
        if topk_weights is not None and topk_weights.dtype != torch.float32:
            topk_weights = topk_weights.to(torch.float32)
        E = self.params.num_experts
        info, recv_ids, recv_weights, stats = MnnvlMoe.mnnvl_moe_alltoallv_prepare_without_allgather(
            topk_ids, topk_weights, eplb_local_stats, self._prepare_workspace, tokens_per_rank,
            self.ep_rank, self.ep_size, E, E, self.params.top_k)
        if self.params.invalid_expert_id != E:
            recv_ids.masked_fill_(recv_ids == E, self.params.invalid_expert_id)
        move = lambda t: MnnvlMoe.mnnvl_moe_alltoallv(t, info, self._workspace, self.ep_rank, self.ep_size)  # noqa: E731
        recv_hidden = move(hidden_states)
        recv_scale = move(hidden_states_scale) if hidden_states_scale is not None else None
        self._state = {"alltoall_info": info, "local_num_tokens": hidden_states.shape[0]}
        return MoEEpDispatchResult(hidden_states=recv_hidden, hidden_states_scale=recv_scale, topk_ids=recv_ids,
                                   topk_weights=recv_weights, tokens_per_rank=tokens_per_rank,
                                   eplb_gathered_stats=stats)

    def combine(self, expert_output, *, output=None):
        from fakes.flashinfer.comm.trtllm_alltoall import _MnnvlMoe as MnnvlMoe

        state = self._state
        if state is None:
            raise RuntimeError("combine called before dispatch")
        if expert_output.dim() == 3:
            expert_output = expert_output.flatten(0, 1)
        combined = MnnvlMoe.mnnvl_moe_alltoallv_combine(
            expert_output, state["alltoall_info"], self._workspace, ep_rank=self.ep_rank,
            ep_size=self.ep_size, top_k=self.params.top_k, token_count=state["local_num_tokens"])
        self._state = None
        if output is not None:
            output.copy_(combined)
            return output
        return combined

    def destroy(self) -> None:
        self._workspace = None
        self._prepare_workspace = None
        self._state = None


@register_communication("nvlink_two_sided")
class NVLinkTwoSidedAlltoAll(TwoSidedRows, MoEEpCommunication):
    """Rank-major dispatch/combine with the two-sided all-to-all-v (``MnnvlMoe``); needs
    ``num_experts % 4 == 0``; weights travel as float32."""

    def dispatch(self, hidden_states, topk_ids, topk_weights=None, *, hidden_states_scale=None,
                 max_tokens_per_rank=None, eplb_local_stats=None):
        if self._state is not None:
            raise RuntimeError("dispatch called twice without an intervening combine")
        return self._dispatch_rows(hidden_states, topk_ids, topk_weights, hidden_states_scale,
                                   self._tokens_per_rank_for(max_tokens_per_rank), eplb_local_stats)
