"""Fake ``flashinfer.comm.trtllm_alltoall``: the two-sided MoE all-to-all-v (``MnnvlMoe``).

What the integration sees is reproduced: the index tensors ``moe_prepare`` returns and their
layout (tokens grouped by target rank, received tokens packed in source-rank order,
backward indices ``token * top_k + first lane`` that route combine results back), the
``slot_count`` marking of experts a rank does not own, and the kernels' checks. The
transport is not: the real kernels stream through FIFOs in the MNNVL workspace, an
internal the caller never touches; the fake moves the same rows over the workspace's
communicator (an all-gather), which needs every rank to call, as the real kernels do.
Slots past what a rank received hold ``slot_count`` ids, NaN scales and -1 indices (the
real buffers are uninitialised): code that reads them gets caught.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Optional

import torch
from typing_extensions import deprecated

from fakes.flashinfer import profiles
from fakes.flashinfer._check import check_input_type, icheck, icheck_eq
from fakes.flashinfer.comm.mapping import Mapping
from fakes.flashinfer.comm import mnnvl
from fakes.flashinfer.comm.mnnvl import MnnvlConfig, _MnnvlMemory, on_scenario_end

_MAX_TOP_K = 32
_FIFO_BYTES = 256 << 10  # per peer and direction; the size is the fake's, the role is real


def get_moe_commworkspace_size_per_rank(ep_size: int) -> int:
    return 2 * _FIFO_BYTES * ep_size


def get_moe_prepare_workspace_size_per_rank(ep_size: int) -> int:
    return _FIFO_BYTES * ep_size


def _comm_of(workspace: torch.Tensor):
    for record in _MnnvlMemory.allocated_map.values():
        if record.segment.data_ptr() == workspace.data_ptr():
            return record.comm
    raise RuntimeError("workspace is not an MNNVL allocation of this scenario (use _MnnvlMoe.get_moe_workspaces)")


def _wire(t: Optional[torch.Tensor]):
    """``t`` as the communicator carries it: a NumPy array of its bytes (a pickled tensor costs a
    ``torch.save`` per storage, and not every dtype has a NumPy one), None as None."""
    return None if t is None else t.contiguous().view(torch.uint8).numpy()


def _unwire(a, dtype: torch.dtype, shape: tuple[int, ...]) -> Optional[torch.Tensor]:
    return None if a is None else torch.from_numpy(a).view(dtype).reshape(shape)


def _fill(n: int, values: torch.Tensor, pad) -> torch.Tensor:
    out = torch.full((n,) + tuple(values.shape[1:]), pad, dtype=values.dtype)
    out[: values.size(0)] = values
    return out


def moe_prepare(experts_ids, scales, experts_statics, workspace, max_token_count_per_rank,
                ep_rank, ep_size, expert_count, slot_count, top_k):
    """Exchange routing metadata. Returns ``(prepared_local_experts [M*ep, K] int32,
    prepared_local_scales [M*ep, K] fp32 | None, send_rank_count_cumsum [ep],
    send_rank_local_indices [M*max(ep,K)], recv_rank_count_cumsum [ep],
    recv_rank_local_indices [M*ep], backward_recv_rank_local_indices [M*max(ep,K)],
    gathered_expert_statics [ep, E] | None)``."""
    check_input_type(experts_ids, torch.int32, "expertsIds")
    icheck_eq(expert_count % 4, 0, "expertCount % 4", "0", "expertCount must be divisible by 4")
    icheck_eq(slot_count % 4, 0, "slotCount % 4", "0", "slotCount must be divisible by 4")
    if not 1 <= top_k <= _MAX_TOP_K:
        raise RuntimeError("Only 1 <= topK <= 32 is supported now.")
    T, M = experts_ids.size(0), max_token_count_per_rank
    if T > M:  # stricter: the kernel would overrun its index buffers
        raise RuntimeError(f"token count {T} exceeds max_token_count_per_rank {M}")
    if scales is not None:
        icheck(scales.dtype == torch.float32, "scales.dtype() == dl_float32", "scales must be float32")
    comm = _comm_of(workspace)
    if comm.Get_size() != ep_size:  # the kernel would read peers' rows the mapping never mapped
        raise RuntimeError(f"the workspace is mapped over {comm.Get_size()} ranks, but ep_size is {ep_size}: "
                           "its MNNVL communicator must span the EP group")
    me, K = ep_rank, top_k
    rank_TK = experts_ids.long() // (expert_count // ep_size)
    per_rank_slots = slot_count // ep_size
    lanes = torch.arange(K)
    outgoing, send_idx, backward = [], [], []
    for r in range(ep_size):
        hit_TK = rank_TK == r
        tok = hit_TK.any(1).nonzero().flatten()
        first_lane = torch.where(hit_TK[tok], lanes, K).min(1).values
        ids = experts_ids[tok].clone()
        ids[ids.long() // per_rank_slots != r] = slot_count
        outgoing.append((_wire(ids), None if scales is None else _wire(scales[tok])))
        send_idx.append(tok)
        backward.append(tok * K + first_lane)
    gathered = comm.allgather((outgoing, _wire(experts_statics), M))
    counts_M = [g[2] for g in gathered]
    if len(set(counts_M)) > 1:  # stricter: the kernel would lay out its peers' rows with the wrong stride
        raise RuntimeError(f"max_token_count_per_rank differs across the EP group: {counts_M} "
                           "(every rank must pass the same value)")
    incoming = [(_unwire(ids, torch.int32, (-1, K)), _unwire(sc, torch.float32, (-1, K)))
                for ids, sc in (gathered[src][0][me] for src in range(ep_size))]
    send_counts = torch.tensor([t.numel() for t in send_idx], dtype=torch.int32)
    recv_counts = torch.tensor([ids.size(0) for ids, _ in incoming], dtype=torch.int32)
    wide = M * max(ep_size, K)
    recv_total = int(recv_counts.sum())
    ids_in = torch.cat([ids for ids, _ in incoming]) if recv_total else torch.empty(0, K, dtype=torch.int32)
    prepared_ids = _fill(M * ep_size, ids_in, slot_count)
    prepared_scales = None
    if scales is not None:
        sc_in = torch.cat([sc for _, sc in incoming]) if recv_total else torch.empty(0, K)
        prepared_scales = _fill(M * ep_size, sc_in, float("nan"))
    statics = None
    if experts_statics is not None:
        statics = torch.stack([_unwire(gathered[src][1], experts_statics.dtype, experts_statics.shape)
                               for src in range(ep_size)])
    return (
        prepared_ids,
        prepared_scales,
        send_counts.cumsum(0).to(torch.int32),
        _fill(wide, torch.cat(send_idx).to(torch.int32), -1),
        recv_counts.cumsum(0).to(torch.int32),
        _fill(M * ep_size, torch.arange(recv_total, dtype=torch.int32), -1),
        _fill(wide, torch.cat(backward).to(torch.int32), -1),
        statics,
    )


def moe_comm(input, send_rank_cum_sum, send_indices, output, recv_rank_cum_sum, recv_indices,
             all_workspaces, ep_rank, ep_size) -> None:
    """Send ``input`` rows ``send_indices[range of r]`` to each rank ``r``; write what
    arrives from ``src`` at ``output[recv_indices[range of src]]``."""
    icheck_eq(input.dim(), 2, "input.ndim()", "2", "input must be a 2D tensor")
    icheck_eq(output.dim(), 2, "output.ndim()", "2", "output must be a 2D tensor")
    icheck_eq(input.size(1), output.size(1), "input.size(1)", "output.size(1)",
              "input and output must have the same number of columns")
    icheck_eq(send_rank_cum_sum.size(0), ep_size, "sendRankCumSum.size(0)", "epSize", "sendRankCumSum must have epSize elements")
    icheck_eq(recv_rank_cum_sum.size(0), ep_size, "recvRankCumSum.size(0)", "epSize", "recvRankCumSum must have epSize elements")
    icheck_eq(all_workspaces.size(0), ep_size, "allWorkspaces.size(0)", "epSize", "allWorkspaces must have epSize elements")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize", "epRank must be in the range [0, epSize)")
    per_u64 = 8 // input.element_size()
    icheck_eq(input.size(1) % (per_u64 * 2), 0, "input.size(1) % (eltCountPerU64 * 2)", "0",
              "input.size(1) must be aligned to 16 bytes")
    comm = _comm_of(all_workspaces)
    bounds = [0] + send_rank_cum_sum.tolist()
    outgoing = [_wire(input[send_indices[bounds[r]:bounds[r + 1]].long()]) for r in range(ep_size)]
    gathered = comm.allgather(outgoing)
    rbounds = [0] + recv_rank_cum_sum.tolist()
    for src in range(ep_size):
        rows = _unwire(gathered[src][ep_rank], output.dtype, (-1, output.size(1)))
        icheck_eq(rows.size(0), rbounds[src + 1] - rbounds[src], "received rows", "recvRankCumSum range",
                  f"rank {src} sent a different token count than prepare announced")
        at = recv_indices[rbounds[src]:rbounds[src + 1]].long()
        # Stricter than the kernel, which writes wherever the index points.
        if at.numel() and not 0 <= int(at.min()) <= int(at.max()) < output.size(0):
            raise RuntimeError(
                f"rows from rank {src} go to indices up to {int(at.max())} of an output of {output.size(0)} "
                "rows: the real kernel does not check and would write outside it (top_k or token_count "
                "differs from moe_prepare's)")
        output[at] = rows


def _segment(r: int, M: int, cumsum) -> range:
    """Rows of the gathered arrays that hold rank ``r``'s tokens: all ``M`` of its block, or
    ``[cs[r-1], cs[r])`` with an inclusive count cumsum (a negative span is no tokens)."""
    if cumsum is None:
        return range(r * M, r * M + M)
    start = 0 if r == 0 else cumsum[r - 1]
    return range(start, max(cumsum[r], start))


def moe_comm_prepare_indices(gathered_target_rank_ids, real_rank_token_count_cum_sum,
                             max_token_count_per_rank, expert_count, top_k, ep_rank, ep_size):
    """Send and receive index lists from every rank's gathered target ranks ``[N, K]`` int32
    (rank-major; without a cumsum every one of a rank's ``M`` rows counts as a token, padding
    included). Returns six int32 vectors, -1 past their valid prefix: ``local_gather_indices
    [M*W]`` (global gathered rows received, by source then token), ``send_rank_count_cum_sum
    [W]`` and ``recv_rank_count_cum_sum [W]`` (inclusive), ``send_rank_local_indices [M*S]``
    (local token indices by destination), ``recv_rank_local_indices [M*W]`` (0, 1, ...) and
    ``backward_recv_rank_local_indice [M*S]`` (``i*K + k`` of the lowest lane on that
    destination), ``S = max(W, K)``."""
    M, W, K, R = max_token_count_per_rank, ep_size, top_k, ep_rank
    T = gathered_target_rank_ids
    icheck_eq(T.dtype, torch.int32, "gatheredTargetRankIds.dtype()", "dl_int32",
              "Inconsistency of Tensor type: gatheredTargetRankIds")
    icheck_eq(T.dim(), 2, "gatheredTargetRankIds.ndim()", "2", "gatheredTargetRankIds must be a 2D tensor")
    icheck_eq(T.size(1), K, "gatheredTargetRankIds.size(1)", "topK", "gatheredTargetRankIds must have topK columns")
    cumsum = None
    if real_rank_token_count_cum_sum is not None:
        cs = real_rank_token_count_cum_sum
        icheck_eq(cs.dim(), 1, "realRankTokenCountCumSum.value().ndim()", "1",
                  "realRankTokenCountCumSum must be a 1D tensor")
        icheck_eq(cs.dtype, torch.int32, "realRankTokenCountCumSum.value().dtype()", "dl_int32",
                  "Inconsistency of Tensor type: realRankTokenCountCumSum.value()")
        icheck_eq(cs.size(0), W, "realRankTokenCountCumSum.value().size(0)", "epSize",
                  "realRankTokenCountCumSum must have epSize elements")
        cumsum = cs.tolist()
    else:
        icheck_eq(T.size(0), W * M, "gatheredTargetRankIds.size(0)", "epSize * maxTokenCountPerRank",
                  "gatheredTargetRankIds should have shape (epSize * maxTokenCountPerRank, topK)")
    icheck(M > 0, "maxTokenCountPerRank > 0", "maxTokenCountPerRank must be greater than 0")
    icheck(expert_count > 0, "expertCount > 0", "expertCount must be greater than 0")
    icheck(K > 0, "topK > 0", "topK must be greater than 0")
    icheck(K <= expert_count, "topK <= expertCount", "topK must be less than or equal to expertCount")
    icheck(0 <= R < W, "epRank >= 0 && epRank < epSize", "epRank must be in the range [0, epSize)")
    if W > 1024:
        raise RuntimeError("Only worldInfo.epSize less than or equal to 1024 supported now.")
    if K > 32:
        raise RuntimeError("Only topK less than or equal to 32 supported now.")
    S = max(W, K)
    mine = _segment(R, M, cumsum)
    send_idx, backward, send_counts = [], [], []
    for r in range(W):
        for i, row in enumerate(mine):
            lanes = (T[row] == r).nonzero().flatten()
            if lanes.numel():
                send_idx.append(i)
                backward.append(i * K + int(lanes[0]))
        send_counts.append(len(send_idx))
    gather, recv_counts = [], []
    for r in range(W):
        gather.extend(row for row in _segment(r, M, cumsum) if bool((T[row] == R).any()))
        recv_counts.append(len(gather))
    as_i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return (
        _fill(M * W, as_i32(gather), -1),
        as_i32(send_counts),
        _fill(M * S, as_i32(send_idx), -1),
        as_i32(recv_counts),
        _fill(M * W, torch.arange(len(gather), dtype=torch.int32), -1),
        _fill(M * S, as_i32(backward), -1),
    )


def moe_local_gather(recv_rank_cum_sum, local_gather_indices, gathered_expert_ids, gathered_scales,
                     local_expert_ids, local_scales, max_token_count_per_rank, expert_count, top_k,
                     ep_rank, ep_size) -> None:
    """Rows below the received count copy the gathered ids and scales of their source row
    (ids stay global, every lane); the rest get ``expert_count`` and 0.0. In place."""
    for name, t, dt in (("recvRankCumSum", recv_rank_cum_sum, torch.int32),
                        ("localGatherIndices", local_gather_indices, torch.int32),
                        ("gatheredExpertIds", gathered_expert_ids, torch.int32),
                        ("gatheredScales", gathered_scales, torch.float32),
                        ("localExpertIds", local_expert_ids, torch.int32),
                        ("localScales", local_scales, torch.float32)):
        icheck_eq(t.dtype, dt, f"{name}.dtype()", str(dt), f"Inconsistency of Tensor type: {name}")
    icheck(max_token_count_per_rank > 0, "maxTokenCountPerRank > 0", "maxTokenCountPerRank must be greater than 0")
    icheck(expert_count > 0, "expertCount > 0", "expertCount must be greater than 0")
    icheck(top_k > 0, "topK > 0", "topK must be greater than 0")
    icheck(top_k <= expert_count, "topK <= expertCount", "topK must be less than or equal to expertCount")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize", "epRank must be in the range [0, epSize)")
    icheck_eq(recv_rank_cum_sum.dim(), 1, "recvRankCumSum.ndim()", "1", "recvRankCumSum must be a 1D tensor")
    icheck_eq(recv_rank_cum_sum.size(0), ep_size, "recvRankCumSum.size(0)", "epSize",
              "recvRankCumSum must have epSize elements")
    icheck_eq(local_gather_indices.dim(), 1, "localGatherIndices.ndim()", "1", "localGatherIndices must be a 1D tensor")
    for name, t in (("gatheredExpertIds", gathered_expert_ids), ("gatheredScales", gathered_scales),
                    ("localExpertIds", local_expert_ids), ("localScales", local_scales)):
        icheck_eq(t.dim(), 2, f"{name}.ndim()", "2", f"{name} must be a 2D tensor")
    for name, t in (("gatheredExpertIds", gathered_expert_ids), ("gatheredScales", gathered_scales),
                    ("localExpertIds", local_expert_ids), ("localScales", local_scales)):
        icheck_eq(t.size(1), top_k, f"{name}.size(1)", "topK", f"{name} must have topK columns")
    L = local_gather_indices.size(0)
    icheck_eq(local_expert_ids.size(0), L, "localExpertIds.size(0)", "localMaxTokenCount",
              "localExpertIds must have localMaxTokenCount rows")
    icheck_eq(local_scales.size(0), L, "localScales.size(0)", "localMaxTokenCount",
              "localScales must have localMaxTokenCount rows")
    if top_k > 32:
        raise RuntimeError("Only topK less than or equal to 32 supported now.")
    n = min(int(recv_rank_cum_sum[-1]), L)
    rows = local_gather_indices[:n].long()
    local_expert_ids.fill_(expert_count)
    local_scales.zero_()
    local_expert_ids[:n] = gathered_expert_ids[rows]
    local_scales[:n] = gathered_scales[rows]


_DEPRECATION = ("MnnvlMoe is deprecated; use flashinfer.moe_ep.NVLinkTwoSidedAlltoAll. "
               "Its implementation will move into that class.")


@dataclass
class MoEAlltoallInfo:
    local_gather_indices: torch.Tensor
    send_rank_count_cumsum: torch.Tensor
    send_rank_local_indices: torch.Tensor
    recv_rank_count_cumsum: torch.Tensor
    recv_rank_local_indices: torch.Tensor
    backward_recv_rank_local_indices: torch.Tensor
    local_token_allocation_count: int


class _MnnvlMoe:
    """NVLink two-sided MoE all-to-all-v over MNNVL workspaces (static methods only)."""

    moe_workspace: _MnnvlMemory = None
    moe_prepare_workspace: _MnnvlMemory = None
    moe_workspace_tensor: torch.Tensor = None
    moe_prepare_workspace_tensor: torch.Tensor = None
    moe_mapping: Mapping = None

    @staticmethod
    def get_moe_workspaces(mapping: Mapping, config: Optional[MnnvlConfig] = None):
        if _MnnvlMoe.moe_workspace is not None:
            assert mapping == _MnnvlMoe.moe_mapping, "only one moe mapping supported now"
            return _MnnvlMoe.moe_workspace_tensor
        _MnnvlMoe.moe_mapping = mapping
        if config:
            _MnnvlMemory.set_comm_from_config(mapping, config)
        _MnnvlMoe.moe_workspace = mnnvl.MnnvlMemory(mapping, get_moe_commworkspace_size_per_rank(mapping.tp_size))
        _MnnvlMoe.moe_workspace_tensor = _MnnvlMoe.moe_workspace.as_torch_strided_tensor(torch.uint64)
        return _MnnvlMoe.moe_workspace_tensor

    @staticmethod
    def get_moe_prepare_workspace(mapping: Mapping, config: Optional[MnnvlConfig] = None):
        if _MnnvlMoe.moe_prepare_workspace_tensor is not None:
            assert mapping == _MnnvlMoe.moe_mapping, "only one moe mapping supported now"
            return _MnnvlMoe.moe_prepare_workspace_tensor
        if config:
            _MnnvlMemory.set_comm_from_config(mapping, config)
        _MnnvlMoe.moe_prepare_workspace = mnnvl.MnnvlMemory(
            mapping, get_moe_prepare_workspace_size_per_rank(mapping.tp_size)
        )
        _MnnvlMoe.moe_prepare_workspace_tensor = _MnnvlMoe.moe_prepare_workspace.as_torch_strided_tensor(torch.uint64)
        return _MnnvlMoe.moe_prepare_workspace_tensor

    @staticmethod
    def compute_target_rank_id(token_selected_experts: torch.Tensor, expert_count: int, ep_size: int):
        assert expert_count % ep_size == 0, "expert_count should be divisible by ep_size"
        return token_selected_experts // (expert_count // ep_size)

    @staticmethod
    def mnnvl_moe_alltoallv_prepare(gathered_target_rank_ids, real_rank_token_count_cumsum,
                                    gathered_expert_ids, gathered_scales, max_token_count_per_rank,
                                    expert_count, top_k, ep_rank, ep_size):
        """The routing exchange when the caller all-gathered the routing itself."""
        (gather, send_cumsum, send_idx, recv_cumsum, recv_idx, backward) = moe_comm_prepare_indices(
            gathered_target_rank_ids, real_rank_token_count_cumsum, max_token_count_per_rank,
            expert_count, top_k, ep_rank, ep_size)
        rows = max_token_count_per_rank * ep_size
        local_expert_ids = torch.empty(rows, top_k, dtype=torch.int32)
        local_scales = torch.empty(rows, top_k, dtype=torch.float32)
        moe_local_gather(recv_cumsum, gather, gathered_expert_ids, gathered_scales, local_expert_ids,
                         local_scales, max_token_count_per_rank, expert_count, top_k, ep_rank, ep_size)
        info = MoEAlltoallInfo(gather, send_cumsum, send_idx, recv_cumsum, recv_idx, backward, rows)
        return info, local_expert_ids, local_scales

    @staticmethod
    def mnnvl_moe_alltoallv_prepare_without_allgather(expert_ids, scales, expert_statics, workspace,
                                                      max_token_count_per_rank, ep_rank, ep_size,
                                                      expert_count, slot_count, top_k):
        (ids, local_scales, send_cumsum, send_idx, recv_cumsum, recv_idx, backward,
         statics) = moe_prepare(expert_ids, scales, expert_statics, workspace, max_token_count_per_rank,
                                ep_rank, ep_size, expert_count, slot_count, top_k)
        info = MoEAlltoallInfo(None, send_cumsum, send_idx, recv_cumsum, recv_idx, backward,
                               max_token_count_per_rank * ep_size)
        return info, ids, local_scales, statics

    @staticmethod
    def mnnvl_moe_alltoallv(x, alltoall_info: MoEAlltoallInfo, workspace, ep_rank, ep_size):
        assert x.dim() == 2, "only 2D tensor supported, please reshape."
        # Uninitialised in the real op: NaN (or all ones for integers) exposes reads of empty slots.
        pad = float("nan") if x.dtype.is_floating_point else -1
        output = torch.full((alltoall_info.local_token_allocation_count, x.shape[1]), pad, dtype=x.dtype)
        moe_comm(x, alltoall_info.send_rank_count_cumsum, alltoall_info.send_rank_local_indices,
                 output, alltoall_info.recv_rank_count_cumsum, alltoall_info.recv_rank_local_indices,
                 workspace, ep_rank, ep_size)
        return output

    @staticmethod
    def mnnvl_moe_alltoallv_combine(x, alltoall_info: MoEAlltoallInfo, workspace, ep_rank, ep_size,
                                    top_k, token_count):
        assert x.dim() == 2, "2D tensor supported, please reshape."
        output = torch.zeros(token_count * top_k, x.shape[1], dtype=x.dtype)
        moe_comm(x, alltoall_info.recv_rank_count_cumsum, alltoall_info.recv_rank_local_indices, output,
                 alltoall_info.send_rank_count_cumsum, alltoall_info.backward_recv_rank_local_indices,
                 workspace, ep_rank, ep_size)
        return torch.sum(output.reshape(token_count, top_k, x.shape[1]), dim=1, keepdim=False)

    @staticmethod
    def _forget_scenario() -> None:
        _MnnvlMoe.moe_workspace = _MnnvlMoe.moe_prepare_workspace = None
        _MnnvlMoe.moe_workspace_tensor = _MnnvlMoe.moe_prepare_workspace_tensor = None
        _MnnvlMoe.moe_mapping = None


on_scenario_end(_MnnvlMoe._forget_scenario)


_MnnvlMoe.__name__ = _MnnvlMoe.__qualname__ = "MnnvlMoe"


def _copy(fn: types.FunctionType) -> types.FunctionType:
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__annotations__ = fn.__qualname__, dict(fn.__annotations__)
    return copy

# 0.7.2 deprecates MnnvlMoe in favour of flashinfer.moe_ep (typing_extensions.deprecated). The
# class is never instantiated, so its workspace getters, which every caller goes through
# first, carry the decorator too.
# (typing_extensions marks the function it wraps too: each getter is wrapped as a copy.)
_MnnvlMoe_deprecated = deprecated(_DEPRECATION)(type("MnnvlMoe", (_MnnvlMoe,), {
    "__module__": __name__, "__doc__": _MnnvlMoe.__doc__,
    **{n: staticmethod(deprecated(_DEPRECATION)(_copy(vars(_MnnvlMoe)[n].__func__)))
       for n in ("get_moe_workspaces", "get_moe_prepare_workspace")}}))


def __getattr__(name: str):
    if name == "MnnvlMoe":
        if "comm.trtllm_alltoall" in profiles.active().absent_modules:
            raise profiles.removed_module(__name__)
        return _MnnvlMoe_deprecated if profiles.active().comm_deprecated else _MnnvlMoe
    if name == "MnnvlMemory":  # imported from .mnnvl, as the real module does
        return mnnvl.MnnvlMemory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"MnnvlMoe", "MnnvlMemory"})
