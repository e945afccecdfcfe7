"""Fake 0.7.4 ``flashinfer.moe_ep`` NVLink backends: ``NVLinkOneSidedAlltoAll`` over its own
kernels (``one_sided_ops``: the 33-field workspace layout, shared by instances of the same
layout, the barrier after initialize built in, ``sanitize`` always on) and
``NVLinkTwoSidedAlltoAll`` with ``runtime_max_tokens_per_rank``.

The fake machine has no CFT counted writes and no Lamport kernels (a Hopper-class box):
asking for them logs why they are off, as on such a machine, and every step takes the fence
transport.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

import torch

from fakes import observe
from fakes.flashinfer.comm.mnnvl import on_scenario_end
from fakes.flashinfer.moe_ep import one_sided_ops as ops
from fakes.flashinfer.moe_ep import nvlink
from fakes.flashinfer.moe_ep.communication import MoEEpCommParams, MoEEpCommunication_0_7_4, register_communication
from fakes.flashinfer.moe_ep.nvlink import (
    TwoSidedRows,
    dispatch_payloads,
    dispatch_result,
    mnnvl_mapping_and_config,
    nvlink_platform_supported,
    rank_major,
)

logger = logging.getLogger("flashinfer.moe_ep.backends.split.comm.nvlink_one_sided.communication")

SUPPORTED_TOP_K = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 22)  # _SUPPORTED_TOP_K
MAX_TIMEOUT_S = ops.MAX_TIMEOUT_S


@dataclass
class NVLinkOneSidedConfig(nvlink.NVLinkOneSidedConfig):
    """Options of :class:`NVLinkOneSidedAlltoAll` (0.7.4): 0.7.2's, plus the CFT and Lamport
    transport choices, the wait timeout (seconds; a wait past it traps) and PDL."""

    cft: Optional[bool] = None
    cft_max_tokens_for_dispatch: int = 128
    cft_max_tokens_for_combine: int = 128
    lamport: Optional[bool] = None
    lamport_max_tokens: Optional[int] = None
    timeout_sec: int = 300
    enable_pdl: Optional[bool] = None


def _check_config(config: NVLinkOneSidedConfig, params: MoEEpCommParams) -> None:
    """The constructor's checks after the collective platform check, in the real order."""
    if config.extra_payload_bytes_per_token < 0:
        raise ValueError("extra_payload_bytes_per_token must be non-negative")
    if not 0 <= config.eplb_stats_num_experts <= params.num_experts:
        raise ValueError("eplb_stats_num_experts must be in [0, num_experts]")
    if isinstance(config.timeout_sec, bool) or not isinstance(config.timeout_sec, int):
        raise TypeError("timeout_sec must be an integer number of seconds")
    if not 0 < config.timeout_sec <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_sec must be in 1..{MAX_TIMEOUT_S}")
    if config.cft_max_tokens_for_dispatch < 0 or config.cft_max_tokens_for_combine < 0:
        raise ValueError("CFT token-count limits must be non-negative")
    if config.lamport_max_tokens is not None and (
            isinstance(config.lamport_max_tokens, bool) or not isinstance(config.lamport_max_tokens, int)
            or config.lamport_max_tokens <= 0):
        raise ValueError("lamport_max_tokens must be a positive integer or None")
    if params.top_k not in SUPPORTED_TOP_K:
        raise ValueError(f"NVLinkOneSidedAlltoAll supports top_k in {SUPPORTED_TOP_K}, got {params.top_k}")


@register_communication("nvlink_one_sided")
class NVLinkOneSidedAlltoAll(MoEEpCommunication_0_7_4):
    """Rank-major dispatch/combine with the NVLink one-sided put/get kernels; received rows
    beyond each source rank's token count get ``invalid_expert_id`` routing."""

    # Workspaces shared by instances with the same layout, keyed by (ep_rank, ep_size, layout).
    _WORKSPACES: ClassVar[dict[tuple, dict[str, Any]]] = {}

    def __init__(self, bootstrap, params: MoEEpCommParams, config: Optional[NVLinkOneSidedConfig] = None) -> None:
        from fakes.flashinfer.comm.mnnvl import MnnvlMemory

        self.config = config = NVLinkOneSidedConfig() if config is None else config
        if config.lamport is True and config.cft is True:
            raise ValueError("lamport=True and cft=True both ask for every eligible step; "
                             "set one of them to None or False")
        mapping, mnnvl_config = mnnvl_mapping_and_config(bootstrap, config.comm_backend)
        super().__init__(bootstrap, params)
        _check_config(config, params)
        self._module = ops.module()
        self._index = index = ops.layout_constants()
        if self.ep_size > index.MAX_RANKS:
            raise ValueError(f"NVLinkOneSidedAlltoAll supports at most {index.MAX_RANKS} EP ranks, "
                             f"got {self.ep_size}")
        MnnvlMemory.initialize()
        MnnvlMemory.set_comm_from_config(mapping, mnnvl_config)
        comm = MnnvlMemory.get_comm(mapping)
        self._enable_pdl = True if config.enable_pdl is None else config.enable_pdl  # compute capability 9.0
        # Every rank votes on the transports (one collective, as on the real machine); here
        # none can take CFT (compute capability) or Lamport (no kernels for the GPU).
        votes = comm.allgather((False, False, 0, config.lamport_max_tokens))
        if len({v[3] for v in votes}) > 1:
            raise ValueError("lamport_max_tokens must be the same on every EP rank, got "
                             + ", ".join(sorted({repr(v[3]) for v in votes})))
        lamport = False if config.lamport is None and config.cft is True else config.lamport
        if lamport is False and config.lamport is None:
            logger.info("NVLink one-sided Lamport transport off: cft=True keeps every step for CFT counted writes")
        for transport, requested, reason in (
                ("CFT counted writes", config.cft, "compute capability 9.0 is below 10.0"),
                ("Lamport transport", lamport, "the kernel module has no Lamport kernels for this GPU")):
            if requested is not False:
                (logger.warning if requested else logger.info)("NVLink one-sided %s disabled: %s", transport, reason)
        tokens = self.ep_size * params.max_tokens_per_rank
        dispatch_bytes = (tokens * (params.dispatch_bytes_per_token + 2 * params.top_k * 4
                                    + config.extra_payload_bytes_per_token)
                          + index.MAX_PAYLOADS * index.WORKSPACE_ALIGNMENT)
        combine_input_bytes = tokens * params.hidden_size * max(params.token_dtype.itemsize, 2)
        metainfo = torch.empty(index.NUM_METAINFO_FIELDS, dtype=torch.int64)
        self._module.moe_a2a_get_workspace_layout(self.ep_size, params.max_tokens_per_rank, params.top_k,
                                                  dispatch_bytes, combine_input_bytes, 0,
                                                  config.eplb_stats_num_experts, False, metainfo)
        self.lamport_max_tokens = 0
        self._state = self._acquire_workspace(mapping, comm, metainfo)
        self.workspace: Optional[torch.Tensor] = self._state["workspace"]
        self.metainfo: Optional[torch.Tensor] = self._state["metainfo"]
        self._round: Optional[dict[str, Any]] = None

    def _acquire_workspace(self, mapping, comm, metainfo: torch.Tensor) -> dict[str, Any]:
        from fakes.flashinfer.comm.mnnvl import MnnvlMemory

        key = (self.ep_rank, self.ep_size, tuple(metainfo.tolist()))
        state = self._WORKSPACES.get(key)
        if state is None:
            memory = MnnvlMemory(mapping, int(metainfo[self._index.WORKSPACE_SIZE_INDEX]))
            workspace = memory.as_torch_strided_tensor(torch.uint8)
            self._module.moe_a2a_initialize(workspace, metainfo, self.ep_rank, self.ep_size)
            comm.barrier()  # no peer may publish into this workspace before every rank cleared its slice
            state = {"key": key, "mnnvl_mem": memory, "workspace": workspace, "metainfo": metainfo,
                     "views": {}, "refcount": 0, "round_owner": None, "writes": observe.WriteWatch()}
            self._WORKSPACES[key] = state
        state["refcount"] += 1
        return state

    @classmethod
    def is_platform_supported(cls) -> bool:
        return nvlink_platform_supported()

    @property
    def lamport_enabled(self) -> bool:
        """Whether the Lamport transport is available to this instance's steps (never, here)."""
        return self._state is not None and self.lamport_max_tokens > 0

    def active_rank_mask(self, active_ranks: Sequence[int]) -> torch.Tensor:
        """CPU ``uint64`` bitmask of ``active_ranks`` for ``active_rank_mask``."""
        mask = 0
        for rank in active_ranks:
            rank = int(rank)
            if not 0 <= rank < self.ep_size:
                raise ValueError(f"rank {rank} out of range [0, {self.ep_size})")
            mask |= 1 << rank
        words = (self._index.MAX_RANKS + 63) // 64
        return torch.tensor([(mask >> (64 * w)) & 0xFFFFFFFFFFFFFFFF for w in range(words)], dtype=torch.uint64)

    def _check_rank_mask(self, active_rank_mask) -> None:
        if not self.config.enable_rank_mask and active_rank_mask is not None:
            raise ValueError("active_rank_mask requires enable_rank_mask=True")

    def _view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """Cached ``shape`` view of this rank's workspace bytes at ``offset`` (the same tensor
        object on every call, as there)."""
        views, key = self._state["views"], (offset, dtype, shape)
        if key not in views:
            numel = 1
            for extent in shape:
                numel *= extent
            views[key] = self.workspace[self.ep_rank].narrow(0, offset, numel * dtype.itemsize).view(dtype).view(shape)
        return views[key]

    def _launch(self) -> None:
        """A kernel on the workspace between ``checkpoint_prepare`` and ``checkpoint_restore``
        reads unmapped memory: the CUDA context dies, for good."""
        from fakes.flashinfer.comm import moe_a2a_kernels as kernels
        from fakes.flashinfer.comm.mnnvl import _MnnvlMemory

        kernels._check_alive()
        if not _MnnvlMemory.allocated_map[self._state["mnnvl_mem"].ptr].mapped:
            kernels.Trap.reason = ("an NVLinkOneSidedAlltoAll kernel ran between checkpoint_prepare and "
                                   "checkpoint_restore, on unmapped workspace memory")
            raise RuntimeError(f"CUDA error: an illegal memory access was encountered ({kernels.Trap.reason})")

    def dispatch(self, hidden_states, topk_ids, topk_weights=None, *, hidden_states_scale=None,
                 runtime_max_tokens_per_rank=None, eplb_local_stats=None, active_rank_mask=None):
        if self._state is None:
            raise RuntimeError("NVLinkOneSidedAlltoAll has been destroyed")
        owner = self._state["round_owner"]
        if owner is self:
            raise RuntimeError("dispatch called twice without an intervening combine")
        if owner is not None:
            raise RuntimeError(f"another {type(self).__name__} sharing this workspace has a dispatch awaiting its "
                               "combine; instances that share a workspace must run their rounds one after another")
        self._check_rank_mask(active_rank_mask)
        self._state["writes"].round_begins(self.workspace, self)
        params = self.params
        tokens_per_rank = self._resolve_runtime_max_tokens_per_rank(runtime_max_tokens_per_rank)
        payloads, ids_at = dispatch_payloads(hidden_states, hidden_states_scale, topk_ids, topk_weights)
        self._launch()
        recv_offsets, combine_offset, eplb_offset = self._module.moe_a2a_dispatch(
            payloads[ids_at], payloads, self.workspace, self.metainfo, tokens_per_rank, self.ep_rank, self.ep_size,
            params.top_k, params.num_experts, eplb_local_stats, False, -1, params.invalid_expert_id, False,
            self.config.enable_rank_mask, active_rank_mask, self.config.timeout_sec, self._enable_pdl)
        recv = [self._view(int(offset), p.dtype, (self.ep_size, tokens_per_rank, p.shape[1]))
                for offset, p in zip(recv_offsets, payloads, strict=True)]
        self._module.moe_a2a_sanitize_expert_ids(recv[ids_at], self.workspace, self.metainfo, self.ep_rank,
                                                 params.invalid_expert_id, self._enable_pdl)
        eplb_gathered_stats = None
        if eplb_local_stats is not None:
            eplb_gathered_stats = self._view(int(eplb_offset), torch.int32, (self.ep_size, eplb_local_stats.shape[0]))
        self._round = {"tokens_per_rank": tokens_per_rank, "local_num_tokens": topk_ids.shape[0],
                       "combine_offset": int(combine_offset)}
        self._state["round_owner"] = self
        return dispatch_result(recv, ids_at, hidden_states_scale is not None, topk_weights is not None,
                               tokens_per_rank, eplb_gathered_stats)

    def get_combine_input_buffer(self, dtype: torch.dtype) -> torch.Tensor:
        """``[ep_size * tokens_per_rank, hidden_size]`` view of this rank's combine input region."""
        if self._round is None:
            raise RuntimeError("get_combine_input_buffer called before dispatch")
        rows = self.ep_size * self._round["tokens_per_rank"]
        nbytes = rows * self.params.hidden_size * dtype.itemsize
        capacity = int(self.metainfo[self._index.COMBINE_INPUT_SIZE_INDEX])
        if nbytes > capacity:
            raise ValueError(f"a {dtype} combine input needs {nbytes} bytes, more than the "
                             f"{capacity}-byte combine region")
        return self._view(self._round["combine_offset"], dtype, (rows, self.params.hidden_size))

    def combine(self, expert_output, *, output=None, active_rank_mask=None):
        state = self._round
        if state is None:
            raise RuntimeError("combine called before dispatch")
        self._check_rank_mask(active_rank_mask)
        tokens_per_rank = state["tokens_per_rank"]
        payload = rank_major(expert_output, self.ep_size, tokens_per_rank)
        if output is None:
            output = torch.empty(state["local_num_tokens"], payload.shape[-1], dtype=payload.dtype)
        self._launch()
        self._module.moe_a2a_combine(
            payload, state["local_num_tokens"], self.workspace, self.metainfo, tokens_per_rank, self.ep_rank,
            self.ep_size, self.params.top_k, state["combine_offset"], False, self.config.use_low_precision_combine,
            False, self.config.enable_rank_mask, active_rank_mask, output, self.config.timeout_sec,
            self._enable_pdl, False)
        self._round = None
        self._state["round_owner"] = None
        self._state["writes"].round_ended(self.workspace)
        return output

    def checkpoint_prepare(self) -> None:
        """Release the workspace's memory before a process checkpoint (collective, between rounds)."""
        from fakes.flashinfer.comm.mnnvl import _MnnvlMemory

        state = self._state
        if state is None:
            raise RuntimeError("NVLinkOneSidedAlltoAll has been destroyed")
        if state["round_owner"] is not None:
            raise RuntimeError("checkpoint_prepare called between dispatch and combine")
        record = _MnnvlMemory.allocated_map[state["mnnvl_mem"].ptr]
        if not record.mapped:
            return
        record.comm.barrier()
        record.mapped = False
        record.comm.barrier()

    def checkpoint_restore(self, comm_backend) -> None:
        """Back the workspace with memory again and re-initialize it (collective over ``comm_backend``)."""
        from fakes.flashinfer.comm.mnnvl import _MnnvlMemory

        state = self._state
        if state is None:
            raise RuntimeError("NVLinkOneSidedAlltoAll has been destroyed")
        record = _MnnvlMemory.allocated_map[state["mnnvl_mem"].ptr]
        if record.mapped:
            return
        if comm_backend.Get_size() != record.comm_size or comm_backend.Get_rank() != record.comm_rank:
            raise RuntimeError("Cannot remap MNNVL memory over a communicator with rank/size "
                               f"{comm_backend.Get_rank()}/{comm_backend.Get_size()}; it was allocated over "
                               f"{record.comm_rank}/{record.comm_size}")
        record.comm = _MnnvlMemory.comm = comm_backend
        record.mapped = True
        self._module.moe_a2a_initialize(self.workspace, self.metainfo, self.ep_rank, self.ep_size)
        comm_backend.barrier()
        self._round = None
        self._state["writes"].round_ended(self.workspace)  # its own re-initialization

    def destroy(self) -> None:
        """Release this instance's share of the workspace; the last one frees it."""
        state = self._state
        if state is None:
            return
        if state["round_owner"] is self:
            state["round_owner"] = None
        self._state = self._round = self.workspace = self.metainfo = None
        state["refcount"] -= 1
        if state["refcount"] == 0:
            from fakes.flashinfer.comm.mnnvl import _MnnvlMemory

            self._WORKSPACES.pop(state["key"], None)
            _MnnvlMemory.close_mnnvl_memory(state["mnnvl_mem"].ptr)


@register_communication("nvlink_two_sided")
class NVLinkTwoSidedAlltoAll(TwoSidedRows, MoEEpCommunication_0_7_4):
    """Rank-major dispatch/combine with the two-sided all-to-all-v; needs
    ``num_experts % 4 == 0``; weights travel as float32."""

    def dispatch(self, hidden_states, topk_ids, topk_weights=None, *, hidden_states_scale=None,
                 runtime_max_tokens_per_rank=None, eplb_local_stats=None):
        if self._workspace is None:
            raise RuntimeError("NVLinkTwoSidedAlltoAll has been destroyed")
        if self._state is not None:
            raise RuntimeError("dispatch called twice without an intervening combine")
        return self._dispatch_rows(hidden_states, topk_ids, topk_weights, hidden_states_scale,
                                   self._resolve_runtime_max_tokens_per_rank(runtime_max_tokens_per_rank),
                                   eplb_local_stats)


on_scenario_end(NVLinkOneSidedAlltoAll._WORKSPACES.clear)
