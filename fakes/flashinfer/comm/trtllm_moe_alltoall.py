"""Fake ``flashinfer.comm.trtllm_moe_alltoall``: the one-sided MoE all-to-all on CPU ranks.

``MoeAlltoAll``, ``moe_a2a_dispatch`` and ``moe_a2a_combine`` resolve to the active version
profile's variant (``fakes.flashinfer.profiles``), so their signatures and return forms
are those of that FlashInfer release. The data path lives in ``moe_a2a_kernels``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Optional, Sequence

from typing_extensions import deprecated

import torch

from fakes import observe
from fakes.flashinfer import profiles
from fakes.flashinfer.comm import moe_a2a_kernels as kernels
from fakes.flashinfer.comm.mapping import Mapping
from fakes.flashinfer.comm import mnnvl
from fakes.flashinfer.comm.mnnvl import MnnvlConfig, _MnnvlMemory, on_scenario_end

if _TYPE_CHECKING:
    from fakes.flashinfer.comm.mnnvl import CommBackend
from fakes.flashinfer.tllm_enums import SfLayout

_DEPRECATION = ("MoeAlltoAll is deprecated; use flashinfer.moe_ep.NVLinkOneSidedAlltoAll "
               "(CakeAlltoAll for backend='cake'). Its implementation will move into those classes.")


def _active_rank_mask(active_ranks: Sequence[int], ep_size: int) -> torch.Tensor:
    """CPU ``uint64 [MOE_A2A_RANK_MASK_WORDS]`` mask with bit ``i`` set per active rank ``i``."""
    mask = 0
    for rank in active_ranks:
        rank = int(rank)
        assert 0 <= rank < ep_size, f"rank {rank} out of range [0, {ep_size})"
        mask |= 1 << rank
    words = [(mask >> (64 * w)) & 0xFFFFFFFFFFFFFFFF for w in range(profiles.active().rank_mask_words)]
    # torch cannot build uint64 from Python ints >= 2**63; go through int64 bits.
    signed = [w - (1 << 64) if w >= 1 << 63 else w for w in words]
    return torch.tensor(signed, dtype=torch.int64).view(torch.uint64)


def _workspace_size(ep_size, max_num_tokens, dispatch_bytes, combine_bytes, eplb_stats_num_experts=0):
    """Workspace bytes per rank: padded aux region + dispatch region + combine region."""
    aux = kernels.metainfo_offsets(
        ep_size, max_num_tokens, eplb_stats_num_experts, profiles.active().k_max_top_k
    )[kernels.PAYLOAD_DATA]
    return (
        kernels.align(aux)
        + kernels.align(ep_size * max_num_tokens * dispatch_bytes)
        + kernels.align(ep_size * max_num_tokens * combine_bytes)
    )


def _initialize(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts=0):
    return kernels.initialize(
        workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts, profiles.active()
    )


def _sanitize(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id):
    return kernels.sanitize_expert_ids(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id,
                                       profiles.active())


def _metainfo_index_pairs():
    fields = kernels.metainfo_fields(profiles.active())
    names = [f"MOE_A2A_{f}_OFFSET_INDEX" for f in fields] + ["MOE_A2A_NUM_METAINFO_FIELDS"]
    return names, list(range(len(fields) + 1))


def _ops() -> SimpleNamespace:
    """The compiled module's host ops that need no dispatch state."""
    return SimpleNamespace(
        moe_a2a_initialize=_initialize,
        moe_a2a_sanitize_expert_ids=lambda ids, ws, meta, rank, invalid, enable_pdl: _sanitize(
            ids, ws, meta, rank, invalid),
        moe_a2a_get_metainfo_index_pairs=_metainfo_index_pairs,
        moe_a2a_get_aux_data_size=lambda ep_size, max_num_tokens, eplb_stats_num_experts=0: kernels.metainfo_offsets(
            ep_size, max_num_tokens, eplb_stats_num_experts, profiles.active().k_max_top_k)[kernels.PAYLOAD_DATA],
    )


def moe_a2a_wrap_payload_tensor_in_workspace(
    workspace: torch.Tensor, leading_shape: list[int], slice_start: int, slice_end: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """View bytes ``[slice_start, slice_end)`` (absolute, inside one rank's row) as ``dtype``."""
    if workspace.ndim == 1:
        workspace = workspace.unsqueeze(0)
    base = workspace.view(dtype=torch.uint8)
    assert workspace.ndim == 2, "workspace must be shape [ep_size, size_per_rank]"
    assert slice_end - slice_start <= base.shape[1], "slice_end - slice_start must belong to a single rank"
    rank = slice_start // base.stride(0)
    start = slice_start % base.stride(0)
    end = start + slice_end - slice_start
    assert end <= base.shape[1], "slice must fall within the workspace size per rank"
    return base[rank, start:end].view(dtype=dtype).view(*leading_shape, -1)


def _dispatch(ids, payloads, workspace, metainfo, rtm, ep_rank, ep_size, top_k, num_experts,
              eplb_local_stats=None, enable_rank_mask=False, active_rank_mask=None, recv_view_cache=None):
    offsets, sizes, combine_offset, eplb_offset, n_eplb = kernels.dispatch(
        ids, list(payloads), workspace, metainfo, rtm, ep_rank, ep_size, top_k, num_experts,
        eplb_local_stats, enable_rank_mask, active_rank_mask, profiles.active(),
    )
    # 0.7.0 on: a cache bound to one workspace hands back the same view objects for the same
    # (ep_size, runtime max, offset, size, dtype); a view onto the workspace still sees this
    # dispatch's bytes. A cache carried over from another workspace is cleared first.
    if recv_view_cache is not None and recv_view_cache.get("_workspace") is not workspace:
        recv_view_cache.clear()
        recv_view_cache["_workspace"] = workspace
    views = []
    for p, o, s in zip(payloads, offsets, sizes):
        key = (ep_size, rtm, int(o), int(s), p.dtype)
        view = None if recv_view_cache is None else recv_view_cache.get(key)
        if view is None:
            view = moe_a2a_wrap_payload_tensor_in_workspace(workspace, [ep_size, rtm], o, o + s, p.dtype)
            if recv_view_cache is not None:
                recv_view_cache[key] = view
        views.append(view)
    stats = None
    if eplb_offset >= 0:
        stats = moe_a2a_wrap_payload_tensor_in_workspace(
            workspace, [ep_size], eplb_offset, eplb_offset + ep_size * n_eplb * 4, torch.int32
        )
    return views, combine_offset, stats


def _combine(payload, local_num_tokens, workspace, metainfo, rtm, ep_rank, ep_size, top_k,
             combine_payload_offset, payload_in_workspace=False, output_dtype=None,
             output_scales=None, use_low_precision=False, enable_rank_mask=False,
             active_rank_mask=None, output=None):
    if output is not None:
        # The real check is `output.is_cuda`; the fake's device is the payload's.
        if output.device != payload.device:
            raise ValueError(f"output must be a CUDA tensor, got device={output.device}")
        if not output.is_contiguous():
            raise ValueError(f"output must be contiguous, got stride={output.stride()}")
    return kernels.combine(
        payload, local_num_tokens, workspace, metainfo, rtm, ep_rank, ep_size, top_k,
        combine_payload_offset, payload_in_workspace, output_dtype, output_scales,
        use_low_precision, enable_rank_mask, active_rank_mask, output, profiles.active(),
    )


def _check_backend(backend: str) -> None:
    if backend == "cake":
        raise ValueError(
            'backend="cake" requires compute capability 10.0 or 10.3, got the CPU fake '
            '(it emulates backend="trtllm" only)'
        )
    if backend != "trtllm":
        raise ValueError(f"Unknown MoE all-to-all backend {backend!r}; expected 'trtllm' or 'cake'")


# Function forms, per release.

def _moe_a2a_dispatch_0_6(token_selected_experts, input_payloads, workspace, metainfo,
                          runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts):
    views, offset, _ = _dispatch(token_selected_experts, input_payloads, workspace, metainfo,
                                 runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts)
    return views, offset


def _moe_a2a_dispatch_0_6_16(token_selected_experts, input_payloads, workspace, metainfo,
                             runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts,
                             enable_pdl=None, eplb_local_stats=None, enable_rank_mask=False,
                             active_rank_mask=None):
    views, offset, stats = _dispatch(token_selected_experts, input_payloads, workspace, metainfo,
                                     runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts,
                                     eplb_local_stats, enable_rank_mask, active_rank_mask)
    return views, offset, stats


def _moe_a2a_dispatch_0_7_0(token_selected_experts, input_payloads, workspace, metainfo,
                            runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts,
                            enable_pdl=None, eplb_local_stats=None, enable_rank_mask=False,
                            active_rank_mask=None, recv_view_cache=None):
    views, offset, stats = _dispatch(token_selected_experts, input_payloads, workspace, metainfo,
                                     runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts,
                                     eplb_local_stats, enable_rank_mask, active_rank_mask, recv_view_cache)
    return views, offset, stats


def _moe_a2a_dispatch_0_7(token_selected_experts, input_payloads, workspace, metainfo,
                          runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts,
                          enable_pdl=None, eplb_local_stats=None, enable_rank_mask=False,
                          active_rank_mask=None, *, backend="trtllm", recv_view_cache=None):
    _check_backend(backend)
    views, offset, stats = _dispatch(token_selected_experts, input_payloads, workspace, metainfo,
                                     runtime_max_tokens_per_rank, ep_rank, ep_size, top_k, num_experts,
                                     eplb_local_stats, enable_rank_mask, active_rank_mask, recv_view_cache)
    return views, offset, stats


def _moe_a2a_combine_0_6_8(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                           ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace=False):
    return _combine(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                    ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace)


def _moe_a2a_combine_0_6_14(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                            ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace=False,
                            output_dtype=None, output_scales=None, output_scalar_scale=1.0,
                            sf_layout=SfLayout.layout_linear):
    return _combine(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                    ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace,
                    output_dtype, output_scales)


def _moe_a2a_combine_0_6_16(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                            ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace=False,
                            output_dtype=None, output_scales=None, output_scalar_scale=1.0,
                            sf_layout=SfLayout.layout_linear, output=None, *, use_low_precision=False,
                            enable_pdl=None, enable_rank_mask=False, active_rank_mask=None):
    return _combine(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                    ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace,
                    output_dtype, output_scales, use_low_precision, enable_rank_mask,
                    active_rank_mask, output)


def _moe_a2a_combine_0_7(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                         ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace=False,
                         output_dtype=None, output_scales=None, output_scalar_scale=1.0,
                         sf_layout=SfLayout.layout_linear, output=None, *, use_low_precision=False,
                         enable_pdl=None, enable_rank_mask=False, active_rank_mask=None,
                         backend="trtllm"):
    _check_backend(backend)
    return _combine(payload, local_num_tokens, workspace, metainfo, runtime_max_tokens_per_rank,
                    ep_rank, ep_size, top_k, combine_payload_offset, payload_in_workspace,
                    output_dtype, output_scales, use_low_precision, enable_rank_mask,
                    active_rank_mask, output)


def _get_moe_alltoall_module_0_6():
    return _ops()


def _get_moe_alltoall_module_0_7(backend="trtllm"):
    _check_backend(backend)
    return _ops()


def _moe_a2a_initialize_0_6(workspace, ep_rank, ep_size, max_num_tokens):
    return _initialize(workspace, ep_rank, ep_size, max_num_tokens)


def _moe_a2a_initialize_0_6_16(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts=0):
    return _initialize(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts)


def _moe_a2a_initialize_0_7(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts=0,
                            *, backend="trtllm"):
    _check_backend(backend)
    return _initialize(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts)


def _moe_a2a_get_workspace_size_per_rank_0_6(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                                             combine_payload_size_per_token):
    return _workspace_size(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                           combine_payload_size_per_token)


def _moe_a2a_get_workspace_size_per_rank_0_6_16(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                                                combine_payload_size_per_token, eplb_stats_num_experts=0):
    return _workspace_size(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                           combine_payload_size_per_token, eplb_stats_num_experts)


def _moe_a2a_get_workspace_size_per_rank_0_7(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                                             combine_payload_size_per_token, eplb_stats_num_experts=0,
                                             *, backend="trtllm"):
    _check_backend(backend)
    return _workspace_size(ep_size, max_num_tokens, total_dispatch_payload_size_per_token,
                           combine_payload_size_per_token, eplb_stats_num_experts)


def _moe_a2a_sanitize_expert_ids_0_6(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id):
    return _sanitize(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id)


def _moe_a2a_sanitize_expert_ids_0_6_16(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id,
                                        enable_pdl=None):
    return _sanitize(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id)


def _moe_a2a_sanitize_expert_ids_0_7(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id,
                                     enable_pdl=None, *, backend="trtllm"):
    _check_backend(backend)
    return _sanitize(expert_ids, workspace, metainfo, ep_rank, invalid_expert_id)


def _moe_a2a_active_rank_mask(active_ranks: Sequence[int], ep_size: int) -> torch.Tensor:
    return _active_rank_mask(active_ranks, ep_size)


@dataclass
class _A2AState:
    phase: str = "idle"  # idle | dispatched
    local_num_tokens: Optional[int] = None
    combine_payload_offset: Optional[int] = None
    eplb_gathered_stats: Optional[torch.Tensor] = None


class _MoeAlltoAllBase:
    """Everything but the public signatures, which the per-release subclasses give."""

    _WORKSPACE_CACHE: dict[tuple, dict] = {}

    @classmethod
    def _get_workspace(cls, workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping,
                       eplb_stats_num_experts=0) -> dict:
        profile = profiles.active()
        key = (workspace_size_per_rank, ep_rank, ep_size, max_num_tokens)
        if profile.eplb_and_rank_mask:
            key += (eplb_stats_num_experts,)
        if profile.backend_kw:
            key += ("trtllm",)
        if key not in cls._WORKSPACE_CACHE:
            mem = mnnvl.MnnvlMemory(mapping, workspace_size_per_rank)
            workspace = mem.as_torch_strided_tensor(torch.uint8)
            metainfo = _initialize(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts)
            # A peer must not publish into this rank's row before its memset is done: 0.7.x
            # barriers here; earlier releases leave it to the caller (a late memset then erases
            # a fast peer's first dispatch, see moe_a2a_kernels.Hooks.before_initialize_zero).
            if profile.init_barrier:
                _MnnvlMemory.allocated_map[mem.ptr].comm.barrier()
            cls._WORKSPACE_CACHE[key] = {
                "workspace_size_per_rank": workspace_size_per_rank,
                "max_num_tokens": max_num_tokens,
                "ep_rank": ep_rank,
                "ep_size": ep_size,
                "eplb_stats_num_experts": eplb_stats_num_experts,
                "mnnvl_mem": mem,
                "workspace": workspace,
                "metainfo": metainfo,
                "writes": observe.WriteWatch(),
            }
        return cls._WORKSPACE_CACHE[key]

    @staticmethod
    def _workspace_size_for(ep_size, top_k, max_num_tokens, hidden_size,
                            extra_payload_bytes_per_token=0, eplb_stats_num_experts=0) -> int:
        """Size for 16-bit hidden states plus ids and weights (``top_k * 4`` bytes each)."""
        dispatch = hidden_size * 2 + top_k * 4 + top_k * 4 + extra_payload_bytes_per_token
        return _workspace_size(ep_size, max_num_tokens, dispatch, hidden_size * 2, eplb_stats_num_experts)

    def _setup(self, mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank,
               hidden_size, mnnvl_config, eplb_stats_num_experts=0, enable_rank_mask=False):
        self.eplb_stats_num_experts = eplb_stats_num_experts
        self.enable_eplb = eplb_stats_num_experts > 0
        self.enable_rank_mask = enable_rank_mask
        if workspace_size_per_rank is None:
            assert hidden_size is not None, (
                "hidden_size must be provided if workspace_size_per_rank is not provided"
            )
            workspace_size_per_rank = self._workspace_size_for(
                mapping.moe_ep_size, top_k, max_num_tokens, hidden_size,
                eplb_stats_num_experts=eplb_stats_num_experts,
            )
        _MnnvlMemory.initialize()
        if mnnvl_config:
            _MnnvlMemory.set_comm_from_config(mapping, mnnvl_config)
        self.workspace_size_per_rank = workspace_size_per_rank
        self.max_num_tokens = max_num_tokens
        self.ep_size = mapping.moe_ep_size
        self.ep_rank = mapping.moe_ep_rank
        self.top_k = top_k
        self.num_experts = num_experts
        if not isinstance(self.top_k, int) or self.top_k <= 0:
            raise ValueError("top_k must be a positive int")
        if not isinstance(self.num_experts, int) or self.num_experts <= 0:
            raise ValueError("num_experts must be a positive int")
        self._WORKSPACE = self._get_workspace(
            workspace_size_per_rank, self.ep_rank, self.ep_size, max_num_tokens, mapping,
            eplb_stats_num_experts,
        )
        assert self._WORKSPACE["workspace_size_per_rank"] == workspace_size_per_rank, "Workspace size mismatch"
        assert self._WORKSPACE["max_num_tokens"] == self.max_num_tokens, "Max tokens mismatch"
        assert self._WORKSPACE["ep_rank"] == self.ep_rank, "EP rank mismatch"
        assert self._WORKSPACE["ep_size"] == self.ep_size, "EP size mismatch"
        self.mnnvl_mem = self._WORKSPACE["mnnvl_mem"]
        self.workspace = self._WORKSPACE["workspace"]
        self.metainfo = self._WORKSPACE["metainfo"]
        self._state = _A2AState()
        # Instance-owned, so the views cannot outlive the workspace this object keeps alive.
        self._recv_view_cache = {"_workspace": self.workspace} if profiles.active().recv_view_cache else None
        observe.emit("moe_alltoall_built", alltoall=self)

    def _check_mask_allowed(self, active_rank_mask) -> None:
        if active_rank_mask is not None and not self.enable_rank_mask:
            raise ValueError(
                "active_rank_mask requires the instance to have been constructed "
                "with enable_rank_mask=True"
            )

    def _dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                  invalid_token_expert_id=None, expert_id_payload_index=None,
                  eplb_local_stats=None, active_rank_mask=None) -> list[torch.Tensor]:
        observe.emit("moe_alltoall_dispatch", alltoall=self, runtime_max=runtime_max_tokens_per_rank,
                     tokens=token_selected_experts.size(0))
        self._WORKSPACE["writes"].round_begins(self.workspace, self)
        if not _MnnvlMemory.allocated_map[self.mnnvl_mem.ptr].mapped:
            raise RuntimeError("MNNVL handles are unmapped")
        assert self._state.phase == "idle", "dispatch called twice without combine"
        assert runtime_max_tokens_per_rank <= self.max_num_tokens, (
            "runtime_max_tokens_per_rank exceeds max_num_tokens"
        )
        if eplb_local_stats is not None:
            assert self.enable_eplb, (
                "eplb_local_stats provided but instance was constructed with eplb_stats_num_experts=0"
            )
            assert eplb_local_stats.dim() == 1, "eplb_local_stats must be a 1D tensor"
            assert eplb_local_stats.size(0) == self.eplb_stats_num_experts, (
                "eplb_local_stats size must match eplb_stats_num_experts"
            )
        self._check_mask_allowed(active_rank_mask)
        recv, combine_offset, stats = _dispatch(
            token_selected_experts, input_payloads, self.workspace, self.metainfo,
            runtime_max_tokens_per_rank, self.ep_rank, self.ep_size, self.top_k, self.num_experts,
            eplb_local_stats, self.enable_rank_mask, active_rank_mask, self._recv_view_cache,
        )
        self._state.local_num_tokens = token_selected_experts.size(0)
        self._state.combine_payload_offset = combine_offset
        self._state.eplb_gathered_stats = stats
        self._state.phase = "dispatched"
        observe.emit("moe_alltoall_dispatched", alltoall=self, combine_offset=int(combine_offset))
        if invalid_token_expert_id is not None:
            assert expert_id_payload_index is not None, (
                "expert_id_payload_index required when invalid_token_expert_id is set"
            )
            _sanitize(recv[expert_id_payload_index], self.workspace, self.metainfo, self.ep_rank,
                      invalid_token_expert_id)
        return recv

    def _combine(self, payload, runtime_max_tokens_per_rank, payload_in_workspace=False,
                 output_dtype=None, output_scales=None, output=None, use_low_precision=False,
                 active_rank_mask=None) -> torch.Tensor:
        observe.emit("moe_alltoall_combine", alltoall=self, output=output is not None,
                     runtime_max=runtime_max_tokens_per_rank, resident=bool(payload_in_workspace))
        if not _MnnvlMemory.allocated_map[self.mnnvl_mem.ptr].mapped:
            raise RuntimeError("MNNVL handles are unmapped")
        assert self._state.phase == "dispatched", "combine called before successful dispatch"
        assert runtime_max_tokens_per_rank <= self.max_num_tokens, (
            "runtime_max_tokens_per_rank exceeds max_num_tokens"
        )
        self._check_mask_allowed(active_rank_mask)
        result = _combine(
            payload, self._state.local_num_tokens, self.workspace, self.metainfo,
            runtime_max_tokens_per_rank, self.ep_rank, self.ep_size, self.top_k,
            self._state.combine_payload_offset, payload_in_workspace, output_dtype, output_scales,
            use_low_precision, self.enable_rank_mask, active_rank_mask, output,
        )
        self._state = _A2AState()
        self._WORKSPACE["writes"].round_ended(self.workspace)
        return result

    def get_combine_payload_tensor_in_workspace(self, runtime_max_tokens_per_rank, hidden_size, dtype):
        """``[ep_size, runtime_max_tokens_per_rank, hidden_size]`` view of this rank's combine region."""
        if not _MnnvlMemory.allocated_map[self.mnnvl_mem.ptr].mapped:
            raise RuntimeError("MNNVL handles are unmapped")
        if self._state.phase != "dispatched":
            raise RuntimeError(
                "get_combine_payload_tensor_in_workspace called before successful dispatch"
            )
        item = torch.tensor([], dtype=dtype).element_size()
        start = self._state.combine_payload_offset
        return moe_a2a_wrap_payload_tensor_in_workspace(
            self.workspace[self.ep_rank, :], [self.ep_size, runtime_max_tokens_per_rank], start,
            start + self.ep_size * runtime_max_tokens_per_rank * hidden_size * item, dtype,
        )

    @classmethod
    def _forget_scenario(cls) -> None:
        cls._WORKSPACE_CACHE.clear()


on_scenario_end(_MoeAlltoAllBase._forget_scenario)


class _MoeAlltoAll_0_6_8(_MoeAlltoAllBase):
    @classmethod
    def get_workspace(cls, workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping) -> dict:
        return cls._get_workspace(workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping)

    @staticmethod
    def get_moe_workspace_size_per_rank(ep_size, top_k, max_num_tokens, hidden_size,
                                        extra_payload_bytes_per_token=0) -> int:
        return _MoeAlltoAllBase._workspace_size_for(ep_size, top_k, max_num_tokens, hidden_size,
                                                    extra_payload_bytes_per_token)

    def __init__(self, mapping: Mapping, max_num_tokens: int, top_k: int, num_experts: int,
                 workspace_size_per_rank: int = None, hidden_size: int = None,
                 mnnvl_config: Optional[MnnvlConfig] = None):
        self._setup(mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank,
                    hidden_size, mnnvl_config)

    def dispatch(self, token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor],
                 runtime_max_tokens_per_rank: int, invalid_token_expert_id: Optional[int] = None,
                 expert_id_payload_index: Optional[int] = None) -> list[torch.Tensor]:
        return self._dispatch(token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                              invalid_token_expert_id, expert_id_payload_index)

    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int,
                payload_in_workspace: bool = False) -> torch.Tensor:
        return self._combine(payload, runtime_max_tokens_per_rank, payload_in_workspace)


class _MoeAlltoAll_0_6_14(_MoeAlltoAll_0_6_8):
    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int,
                payload_in_workspace: bool = False, output_dtype: Optional[torch.dtype] = None,
                output_scales: Optional[torch.Tensor] = None, output_scalar_scale: float = 1.0,
                sf_layout: SfLayout = SfLayout.layout_linear) -> torch.Tensor:
        return self._combine(payload, runtime_max_tokens_per_rank, payload_in_workspace,
                             output_dtype, output_scales)


class _Checkpoint:
    """``checkpoint_prepare`` / ``checkpoint_restore`` (0.6.15 on)."""

    def checkpoint_prepare(self) -> None:
        """Unmap MNNVL handles for checkpointing; repeated calls are no-ops."""
        record = _MnnvlMemory.allocated_map[self.mnnvl_mem.ptr]
        if not record.mapped:
            return
        if self._state.phase != "idle":
            raise RuntimeError("Cannot unmap MNNVL handles during an active all-to-all phase")
        record.comm.barrier()
        record.mapped = False
        record.comm.barrier()

    def checkpoint_restore(self, comm_backend: CommBackend) -> None:
        """Remap MNNVL handles after restore (initialize zeroes this rank's row again);
        repeated calls are no-ops."""
        record = _MnnvlMemory.allocated_map[self.mnnvl_mem.ptr]
        if record.mapped:
            return
        comm_size, comm_rank = comm_backend.Get_size(), comm_backend.Get_rank()
        if comm_size != record.comm_size or comm_rank != record.comm_rank:
            raise RuntimeError(
                "Cannot remap MNNVL handles because the communicator does not match the "
                f"graph-visible allocation layout: rank/size {comm_rank}/{comm_size} != "
                f"{record.comm_rank}/{record.comm_size}"
            )
        record.comm = _MnnvlMemory.comm = comm_backend
        record.mapped = True
        refreshed = _initialize(self.workspace, self.ep_rank, self.ep_size, self.max_num_tokens,
                                       self.eplb_stats_num_experts)
        if not torch.equal(refreshed, self.metainfo):
            raise RuntimeError("MoeAlltoAll metainfo changed during MNNVL handle remap; "
                               "existing CUDA graphs are not safe to replay")
        comm_backend.barrier()
        self._state = _A2AState()
        self._WORKSPACE["writes"].round_ended(self.workspace)  # its own re-initialization


class _MoeAlltoAll_0_6_15(_Checkpoint, _MoeAlltoAll_0_6_14):
    pass


class _MoeAlltoAll_0_6_16(_Checkpoint, _MoeAlltoAll_0_6_14):
    @classmethod
    def get_workspace(cls, workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping,
                      eplb_stats_num_experts=0) -> dict:
        return cls._get_workspace(workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping,
                                  eplb_stats_num_experts)

    @staticmethod
    def get_moe_workspace_size_per_rank(ep_size, top_k, max_num_tokens, hidden_size,
                                        extra_payload_bytes_per_token=0, eplb_stats_num_experts=0) -> int:
        return _MoeAlltoAllBase._workspace_size_for(ep_size, top_k, max_num_tokens, hidden_size,
                                                    extra_payload_bytes_per_token, eplb_stats_num_experts)

    @property
    def eplb_gathered_stats(self) -> Optional[torch.Tensor]:
        return self._state.eplb_gathered_stats

    def __init__(self, mapping: Mapping, max_num_tokens: int, top_k: int, num_experts: int,
                 workspace_size_per_rank: int = None, hidden_size: int = None,
                 mnnvl_config: Optional[MnnvlConfig] = None, eplb_stats_num_experts: int = 0,
                 enable_rank_mask: bool = False):
        self._setup(mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank,
                    hidden_size, mnnvl_config, eplb_stats_num_experts, enable_rank_mask)

    def dispatch(self, token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor],
                 runtime_max_tokens_per_rank: int, invalid_token_expert_id: Optional[int] = None,
                 expert_id_payload_index: Optional[int] = None,
                 eplb_local_stats: Optional[torch.Tensor] = None,
                 active_rank_mask: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
        return self._dispatch(token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                              invalid_token_expert_id, expert_id_payload_index, eplb_local_stats,
                              active_rank_mask)

    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int,
                payload_in_workspace: bool = False, output_dtype: Optional[torch.dtype] = None,
                output_scales: Optional[torch.Tensor] = None, output_scalar_scale: float = 1.0,
                sf_layout: SfLayout = SfLayout.layout_linear, output: Optional[torch.Tensor] = None,
                *, use_low_precision: bool = False,
                active_rank_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self._combine(payload, runtime_max_tokens_per_rank, payload_in_workspace,
                             output_dtype, output_scales, output, use_low_precision,
                             active_rank_mask)


class _MoeAlltoAll_0_7_1(_MoeAlltoAll_0_6_16):
    @classmethod
    def get_workspace(cls, workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping,
                      eplb_stats_num_experts=0, *, backend="trtllm") -> dict:
        _check_backend(backend)
        return cls._get_workspace(workspace_size_per_rank, ep_rank, ep_size, max_num_tokens, mapping,
                                  eplb_stats_num_experts)

    @staticmethod
    def get_moe_workspace_size_per_rank(ep_size, top_k, max_num_tokens, hidden_size,
                                        extra_payload_bytes_per_token=0, eplb_stats_num_experts=0,
                                        *, backend="trtllm") -> int:
        _check_backend(backend)
        return _MoeAlltoAllBase._workspace_size_for(ep_size, top_k, max_num_tokens, hidden_size,
                                                    extra_payload_bytes_per_token, eplb_stats_num_experts)

    def __init__(self, mapping: Mapping, max_num_tokens: int, top_k: int, num_experts: int,
                 workspace_size_per_rank: int = None, hidden_size: int = None,
                 mnnvl_config: Optional[MnnvlConfig] = None, eplb_stats_num_experts: int = 0,
                 enable_rank_mask: bool = False, *, backend: str = "trtllm"):
        _check_backend(backend)
        self._setup(mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank,
                    hidden_size, mnnvl_config, eplb_stats_num_experts, enable_rank_mask)



# 0.7.2 deprecates the class in favour of flashinfer.moe_ep, with typing_extensions.deprecated:
# a DeprecationWarning where the class itself is instantiated or subclassed.
_MoeAlltoAll_0_7_2 = deprecated(_DEPRECATION)(type("MoeAlltoAll", (_MoeAlltoAll_0_7_1,), {"__module__": __name__}))

_COMMON = {"moe_a2a_wrap_payload_tensor_in_workspace": moe_a2a_wrap_payload_tensor_in_workspace}
_0_6 = {
    **_COMMON,
    "get_moe_alltoall_module": _get_moe_alltoall_module_0_6,
    "moe_a2a_initialize": _moe_a2a_initialize_0_6,
    "moe_a2a_get_workspace_size_per_rank": _moe_a2a_get_workspace_size_per_rank_0_6,
    "moe_a2a_sanitize_expert_ids": _moe_a2a_sanitize_expert_ids_0_6,
    "moe_a2a_dispatch": _moe_a2a_dispatch_0_6,
}
_0_6_16 = {
    **_COMMON,
    "MOE_A2A_RANK_MASK_WORDS": profiles.PROFILES["0.6.16"].rank_mask_words,
    "get_moe_alltoall_module": _get_moe_alltoall_module_0_6,
    "moe_a2a_active_rank_mask": _moe_a2a_active_rank_mask,
    "moe_a2a_initialize": _moe_a2a_initialize_0_6_16,
    "moe_a2a_get_workspace_size_per_rank": _moe_a2a_get_workspace_size_per_rank_0_6_16,
    "moe_a2a_sanitize_expert_ids": _moe_a2a_sanitize_expert_ids_0_6_16,
    "moe_a2a_dispatch": _moe_a2a_dispatch_0_6_16,
    "moe_a2a_combine": _moe_a2a_combine_0_6_16,
    "MoeAlltoAll": _MoeAlltoAll_0_6_16,
}
# Each release's public names; ``__all__`` is the release's own list, which in 0.6.16 omits
# moe_a2a_active_rank_mask although the module defines it.
_BY_PROFILE = {
    "0.6.8": {**_0_6, "moe_a2a_combine": _moe_a2a_combine_0_6_8, "MoeAlltoAll": _MoeAlltoAll_0_6_8},
    "0.6.14": {**_0_6, "moe_a2a_combine": _moe_a2a_combine_0_6_14, "MoeAlltoAll": _MoeAlltoAll_0_6_14},
    "0.6.15": {**_0_6, "moe_a2a_combine": _moe_a2a_combine_0_6_14, "MoeAlltoAll": _MoeAlltoAll_0_6_15},
    "0.6.16": _0_6_16,
    "0.7.0": {**_0_6_16, "moe_a2a_dispatch": _moe_a2a_dispatch_0_7_0, "MoeAlltoAll": _MoeAlltoAll_0_6_16},
    "0.7.1": {
        **_0_6_16,
        "get_moe_alltoall_module": _get_moe_alltoall_module_0_7,
        "moe_a2a_initialize": _moe_a2a_initialize_0_7,
        "moe_a2a_get_workspace_size_per_rank": _moe_a2a_get_workspace_size_per_rank_0_7,
        "moe_a2a_sanitize_expert_ids": _moe_a2a_sanitize_expert_ids_0_7,
        "moe_a2a_dispatch": _moe_a2a_dispatch_0_7,
        "moe_a2a_combine": _moe_a2a_combine_0_7,
        "MoeAlltoAll": _MoeAlltoAll_0_7_1,
    },
}
_BY_PROFILE["0.7.2"] = {**_BY_PROFILE["0.7.1"], "MoeAlltoAll": _MoeAlltoAll_0_7_2}
for _names in _BY_PROFILE.values():
    for _name, _obj in _names.items():
        if callable(_obj):
            _obj.__name__ = _obj.__qualname__ = _name
_NOT_IN_ALL = {"MOE_A2A_RANK_MASK_WORDS", "get_moe_alltoall_module"}
_ALL = {"0.6.16": sorted(set(_0_6_16) - _NOT_IN_ALL - {"moe_a2a_active_rank_mask"}),
        "0.7.1": sorted(set(_BY_PROFILE["0.7.1"]) - _NOT_IN_ALL)}
__fake_only__ = ("custom_moe_alltoall",)


def custom_moe_alltoall(combine, base: str | None = None) -> type:
    """A ``MoeAlltoAll`` whose ``combine`` is ``combine(self, ...)``, to give capability probes
    a signature no release has (e.g. ``**kwargs`` only). ``combine`` reaches the data path
    through ``self._combine(payload, runtime_max_tokens_per_rank, payload_in_workspace=False,
    output_dtype=None, output_scales=None, output=None, use_low_precision=False,
    active_rank_mask=None)``.
    """
    parent = profiles.pick(_BY_PROFILE, profiles.resolve(base) if base else None)["MoeAlltoAll"]
    with warnings.catch_warnings():  # the testbed's subclass, not a caller's: no deprecation to report
        warnings.simplefilter("ignore", DeprecationWarning)
        return type("MoeAlltoAll", (parent,), {"combine": combine})


def _names() -> dict:
    try:
        return profiles.pick(_BY_PROFILE)
    except KeyError:
        raise profiles.removed_module(__name__) from None


def __getattr__(name: str):
    if name == "__all__":
        try:
            return profiles.pick(_ALL)
        except KeyError:
            return sorted(set(_names()) - _NOT_IN_ALL)
    if name in _names():
        return _names()[name]
    if name in _from_mnnvl():  # imported from .mnnvl, as the real module does
        return getattr(mnnvl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_FROM_MNNVL = {"0.6.8": ("MnnvlMemory",), "0.6.15": ("CommBackend", "MnnvlMemory")}  # what it imports from .mnnvl


def _from_mnnvl() -> tuple[str, ...]:
    try:
        return profiles.pick(_FROM_MNNVL)
    except KeyError:  # a release without the module
        return ()


def __dir__() -> list[str]:
    try:
        own = set(profiles.pick(_BY_PROFILE))
    except KeyError:
        own = set()
    return sorted(set(globals()) | own | set(_from_mnnvl()))
