"""What the CUDA ops of the one-sided MoE all-to-all do, on CPU, over the shared workspace.

Mirrors ``csrc/trtllm_moe_alltoall.cu`` and the kernels under
``communicationKernels/moeAlltoAllKernels.cu`` (flashinfer 0.7.2): the same byte offsets,
the same checks and messages, the same flag protocol. Rank ``r``'s memory is row ``r`` of
the ``[ep_size, size_per_rank]`` workspace; dispatch *puts* each token's payloads into the
target rank's row, combine *gets* each token's results from the expert ranks' rows.

Legend: T local tokens, K top_k, R ep ranks, S runtime max tokens per rank (slots per
source), B bytes per token of one payload, H elements per token of the combine payload.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import torch

from fakes import futex
from fakes.flashinfer._check import check_contiguous, check_input_type, icheck, icheck_eq
from fakes.flashinfer.comm import mnnvl
from fakes.flashinfer.comm.mnnvl import on_scenario_end
from fakes.flashinfer.profiles import Profile

METAINFO_FIELDS = (
    "FLAG_VAL", "LOCAL_TOKEN_COUNTER", "SEND_COUNTERS", "RECV_COUNTERS",
    "DISPATCH_COMPLETION_FLAGS", "COMBINE_COMPLETION_FLAGS", "TOPK_TARGET_RANKS",
    "TOPK_SEND_INDICES", "EPLB_GATHERED_STATS", "PAYLOAD_DATA",
)
NUM_METAINFO_FIELDS = len(METAINFO_FIELDS)
(FLAG_VAL, LOCAL_TOKEN_COUNTER, SEND_COUNTERS, RECV_COUNTERS, DISPATCH_FLAGS, COMBINE_FLAGS,
 TOPK_TARGET_RANKS, TOPK_SEND_INDICES, EPLB_GATHERED_STATS, PAYLOAD_DATA) = range(NUM_METAINFO_FIELDS)
ALIGN = 128


class Regions(NamedTuple):
    """Byte offsets, in every rank's row, of what the kernels read and write: 0.7.2's metainfo
    order (so ``regions[FLAG_VAL]`` works too); 0.7.4's layout maps onto the same names."""

    FLAG_VAL: int
    LOCAL_TOKEN_COUNTER: int
    SEND_COUNTERS: int
    RECV_COUNTERS: int
    DISPATCH_FLAGS: int
    COMBINE_FLAGS: int
    TOPK_TARGET_RANKS: int
    TOPK_SEND_INDICES: int
    EPLB_GATHERED_STATS: int
    PAYLOAD_DATA: int


def metainfo_fields(profile: Profile) -> tuple[str, ...]:
    """The metainfo tensor's fields in ``profile``'s release: before EPLB statistics (0.6.16)
    there is no ``EPLB_GATHERED_STATS`` entry."""
    if profile.eplb_and_rank_mask:
        return METAINFO_FIELDS
    return tuple(f for f in METAINFO_FIELDS if f != "EPLB_GATHERED_STATS")


def _read_metainfo(metainfo: torch.Tensor, profile: Profile) -> list[int]:
    """The offsets of all ``METAINFO_FIELDS`` from ``profile``'s metainfo tensor (a release
    without the EPLB field has an empty EPLB region where the payloads start)."""
    icheck_eq(metainfo.size(0), len(metainfo_fields(profile)), "metainfo.size(0)",
              "fi_throughput::NUM_METAINFO_FIELDS")
    values = [int(v) for v in metainfo.tolist()]
    if not profile.eplb_and_rank_mask:
        values.insert(EPLB_GATHERED_STATS, values[EPLB_GATHERED_STATS])
    return values


class SlotOrder:
    """How slots inside a source's block are assigned: ``shuffled`` stands in for the GPU's
    atomics (nothing may depend on it), ``deterministic`` is source token order.

    A shuffled order is a function of ``seed`` (the scenario's), the source rank and the
    round (the source's dispatch flag value), so a rerun of a scenario sees the same orders
    and each round and source its own."""

    mode = os.environ.get("A2A_FAKE_SLOT_ORDER", "shuffled")
    seed = 0


def send_slots(dest: torch.Tensor, counts_R: torch.Tensor, source: int, round_: int) -> torch.Tensor:
    """The slot of each send of ``source`` in ``round_`` (``dest``: its target rank, in source
    token order; ``counts_R``: sends per target): the sends to one target take the slots
    ``0..n-1`` of ``source``'s block there, in the order :class:`SlotOrder` says."""
    if SlotOrder.mode not in ("shuffled", "deterministic"):
        raise ValueError(f"slot order {SlotOrder.mode!r}: expected 'shuffled' or 'deterministic'")
    n = dest.numel()
    if SlotOrder.mode == "deterministic":
        key = torch.arange(n)
    else:
        seed = (SlotOrder.seed * 1_000_003 + source) * 104_729 + round_
        key = torch.randperm(n, generator=torch.Generator().manual_seed(seed % (1 << 63)))
    by_target = torch.argsort(dest * n + key)
    first_R = torch.cumsum(counts_R, 0) - counts_R
    slot = torch.empty_like(dest)
    slot[by_target] = torch.arange(n) - first_R[dest[by_target]]
    return slot


class Hooks:
    """Fault-injection points for tests. ``before_combine_read(workspace, ep_rank, offsets)``
    runs after a rank's combine saw every peer ready and before it reads their rows: where a
    slow GPU would be when its peers have already moved on. ``before_initialize_zero(workspace,
    ep_rank)`` runs before a rank zeroes its workspace row: a rank late to initialize, whose
    memset then erases whatever a faster peer already published into its row."""

    before_combine_read = None
    before_initialize_zero = None


def stall_until_next_dispatch(peer: int, timeout_s: float = 20.0):
    """A ``Hooks.before_combine_read`` for one combine: this rank stalls before reading its
    peers' rows until ``peer`` has written its next dispatch (its flag for the next round is
    in our dispatch flags): a GPU whose combine kernel runs late while its peers move on."""

    def hook(workspace, me, regions):
        Hooks.before_combine_read = None  # once
        current = int(_i32(workspace, me, regions.FLAG_VAL, 1)[0])
        flag = _i32(workspace, me, regions.DISPATCH_FLAGS + 4 * peer, 1)
        deadline = time.monotonic() + timeout_s
        with futex.awaiting(deadline):
            while (seen := int(flag[0])) != current + 1:
                left = deadline - time.monotonic()
                if left < 0:
                    raise TimeoutError(f"rank {peer} never started its next dispatch (stalled combine of rank {me})")
                futex.wait(flag, seen, min(left, 0.05))
    return hook


KERNELS_CU = "csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu"
FLAG_TIMEOUT_S = float(os.environ.get("A2A_FAKE_FLAG_TIMEOUT_S", "30"))


class CompletionTimeout(RuntimeError):
    """A rank waited too long for its peers' completion flags (the kernel would trap)."""


class Trap:
    """The device after a kernel trapped: the real CUDA context is dead for good, so every
    later kernel of this process fails (the scenario's end, a new process in reality, clears it)."""

    reason: str | None = None


on_scenario_end(lambda: setattr(Trap, "reason", None))


def _check_alive() -> None:
    if Trap.reason is not None:
        raise RuntimeError(f"CUDA error: unspecified launch failure (a kernel trapped earlier: {Trap.reason}); "
                           "the CUDA context is unusable until the process exits")


def align(x: int) -> int:
    return (x + ALIGN - 1) // ALIGN * ALIGN


def metainfo_offsets(ep_size: int, max_num_tokens: int, eplb_stats_num_experts: int,
                     k_max_top_k: int) -> list[int]:
    """Byte offsets of the auxiliary fields in each rank's row (``calculateOffsets``)."""
    offsets, off = [], 0
    sizes = [4, 4, 4 * ep_size, 4 * ep_size]
    for size in sizes:
        offsets.append(off)
        off += size
    for size in (4 * ep_size, 4 * ep_size, max_num_tokens * k_max_top_k * 4,
                 max_num_tokens * k_max_top_k * 4, ep_size * eplb_stats_num_experts * 4):
        off = align(off)
        offsets.append(off)
        off += size
    offsets.append(align(off))
    return offsets


def expert_to_rank(expert_ids: torch.Tensor, num_experts: int, ep_size: int) -> torch.Tensor:
    """Owning EP rank of each expert id: ranks ``[0, E % ep)`` own ``E // ep + 1`` experts. As
    the kernel's ``compute_target_rank_id`` divides, truncating toward zero: an id just below 0
    (SGLang's -1 for a padded row) goes to rank 0."""
    base, rem = divmod(num_experts, ep_size)
    ids = expert_ids.long()

    def div(a, b):
        return torch.div(a, b, rounding_mode="trunc")

    if rem == 0:
        return div(ids, base)
    split = rem * (base + 1)
    return torch.where(ids < split, div(ids, base + 1), rem + div(ids - split, max(base, 1)))


def _i32(workspace: torch.Tensor, rank: int, offset: int, count: int) -> torch.Tensor:
    return workspace[rank, offset:offset + 4 * count].view(torch.int32)


def _blocks(workspace: torch.Tensor, offset: int, rows: int, row_bytes: int) -> torch.Tensor:
    """``[R, rows, row_bytes]`` uint8 view: ``rows`` rows of ``row_bytes`` bytes at byte
    ``offset`` of every rank's row, so one indexed copy reaches every peer at once."""
    return workspace.as_strided((workspace.size(0), rows, row_bytes), (workspace.stride(0), row_bytes, 1),
                                workspace.storage_offset() + offset)


# An indexed copy through a strided view of every peer's block moves ~0.75 GB/s on CPU; one
# index_select per peer moves ~10 GB/s but costs ~10 us of Python each. One copy for all
# peers pays while it moves less than this much per peer (many peers, small rows).
_ONE_COPY_BYTES_PER_PEER = 8 << 10


def _one_indexed_copy(nbytes: int, peers: int) -> bool:
    return nbytes < _ONE_COPY_BYTES_PER_PEER * peers


def _put_i32(workspace: torch.Tensor, peers_P: torch.Tensor, offset: int, values: torch.Tensor) -> None:
    """Write int32 ``values`` (one row of ``n`` per peer, or one row for all) at byte
    ``offset`` of each row in ``peers_P``."""
    n = values.size(-1)
    workspace[peers_P, offset:offset + 4 * n] = values.to(torch.int32).contiguous().view(torch.uint8)


def _check_workspace_and_metainfo(workspace, metainfo, ep_size, profile: Profile):
    icheck(metainfo.device.type == "cpu", "metainfo.device.device_type == kDLCPU",
           "metainfo must be a CPU tensor")
    icheck(metainfo.dtype == torch.int64, "metainfo.dtype() == dl_int64", "metainfo must be int64")
    icheck_eq(metainfo.dim(), 1, "metainfo.ndim()", "1")
    offsets = _read_metainfo(metainfo, profile)
    icheck(workspace.dtype == torch.uint8, "workspace.dtype() == dl_uint8", "workspace must be uint8")
    icheck_eq(workspace.dim(), 2, "workspace.ndim()", "2")
    icheck_eq(workspace.size(0), ep_size, "workspace.size(0)", "epSize")
    return offsets


def _check_rank_mask(mask, ep_rank: int, profile: Profile) -> list[bool]:
    """``resolveActiveRankMask``: the active flag of every rank."""
    ns = "tl::" if profile.moe_ep_kernels else "tl_throughput::"
    check_contiguous(mask, "t")
    check_input_type(mask, torch.uint64, "t")
    icheck_eq(mask.dim(), 1, "t.ndim()", "1", "active_rank_mask must be a 1D tensor")
    icheck_eq(mask.size(0), profile.rank_mask_words, "t.size(0)", f"{ns}kRankMaskWords",
              f"active_rank_mask must have exactly {profile.rank_mask_words} uint64 elements")
    bits = 0
    for w, word in enumerate(mask.view(torch.int64).tolist()):
        bits |= (word & 0xFFFFFFFFFFFFFFFF) << (64 * w)
    icheck((bits >> ep_rank) & 1 == 1, "(out[epRank >> 6] >> (epRank & 63)) & 1ULL",
           f"active_rank_mask must mark the local ep_rank ({ep_rank}) as active")
    return [bool((bits >> r) & 1) for r in range(64 * profile.rank_mask_words)]


def _resolve_mask(profile, enable_rank_mask, active_rank_mask, ep_rank):
    if enable_rank_mask:
        icheck(active_rank_mask is not None, "hasActiveRankMask(maskTensor)",
               "active_rank_mask must be defined" + ("" if profile.moe_ep_kernels else " when enable_rank_mask=True"))
        return _check_rank_mask(active_rank_mask, ep_rank, profile)
    icheck(active_rank_mask is None, "!hasActiveRankMask(activeRankMask)",
           "active_rank_mask requires enable_rank_mask=True")
    return None


def _switch_top_k(top_k: int, launch: str, profile: Profile) -> None:
    """The kernels are instantiated for a fixed set of top_k (``SWITCH_TOP_K``); any other
    value that passes the kMaxTopK check fails at launch with ``FLASHINFER_CHECK``."""
    if top_k not in profile.top_k_kernels:
        raise RuntimeError(f"Error in function '{launch}' at {KERNELS_CU}: Unsupported top_k")


def _wait_flags(workspace, ep_rank, offset, peers_P, expected, phase, timeout_s):
    """Wait until every peer wrote ``expected`` into our completion flags (the kernel spins;
    here a rank sleeps on the first missing flag, see :mod:`fakes.futex`); past ``timeout_s``
    the kernel traps."""
    flags = _i32(workspace, ep_rank, offset, workspace.size(0))
    deadline = time.monotonic() + timeout_s
    with futex.awaiting(deadline):
        while True:
            missing = peers_P[flags[peers_P] != expected]
            if missing.numel() == 0:
                return
            left = deadline - time.monotonic()
            if left < 0:
                Trap.reason = (f"{phase}: rank {ep_rank} timed out after {timeout_s:g} s waiting for "
                               f"completion flag from rank(s) {missing.tolist()} (expected flag value {expected})")
                raise CompletionTimeout(Trap.reason)
            # Bounded, so a flag that changes without a wake-up (a late peer's memset) is still
            # seen and the deadline still kept.
            first = flags[int(missing[0]):int(missing[0]) + 1]
            seen = int(first.item())  # sleep only on the value that said "not yet"
            if seen != expected:
                futex.wait(first, seen, min(left, 0.05))


_DISPATCH_SLOT, _COMBINE_SLOT = 0, 2  # (flag value, runtime max) pairs in the side channel


def _announce_rtm(workspace, me, peers_P, expected, rtm, slot):
    """Tell every peer, beside the workspace, which runtime max this rank's round ``expected``
    uses (before its flags, so a peer that saw the flags sees the value)."""
    side = mnnvl.side_channel(workspace)
    if side is not None:
        side[peers_P, me, slot:slot + 2] = torch.tensor([expected, rtm], dtype=torch.int32)
    return side


def _check_same_rtm(side, me, peers_P, expected, slot, phase) -> None:
    """Stricter than the kernel: every rank of a round must pass the same
    ``runtime_max_tokens_per_rank``. The kernels size every rank's slots ``[ep_size, rtm]``
    with the caller's own value, so ranks that disagree read and write each other's slots at
    different offsets: wrong arrival counts and garbage, never an error. Every rank of the
    round sees the same values, so every rank refuses it."""
    if side is None:
        return
    seen = side[me, peers_P, slot:slot + 2].tolist()
    stale = [int(r) for r, (flag, _) in zip(peers_P.tolist(), seen) if flag != expected]
    if stale:  # each peer writes its entry before its flags: after the wait this cannot happen
        raise RuntimeError(f"{phase}: the fake's side channel has no entry for round {expected} from rank(s) {stale}, "
                           "whose flags did arrive (a fake defect)")
    values = {int(r): v for r, (_, v) in zip(peers_P.tolist(), seen)}
    if len(set(values.values())) > 1:
        named = ", ".join(f"rank {r}: {v}" for r, v in sorted(values.items()))
        raise RuntimeError(
            f"{phase}: the ranks of this round passed different runtime_max_tokens_per_rank ({named}); "
            "every rank must pass the same value (the maximum of the ranks' token counts). The real kernel "
            "does not check: each rank lays out its peers' slots with its own value, so arrival counts are "
            "wrong and the outputs garbage")


def _active_peers(active, ep_size: int) -> torch.Tensor:
    """The ranks a round exchanges flags with: every rank, or those ``active`` marks."""
    return torch.tensor([r for r in range(ep_size) if active is None or active[r]], dtype=torch.long)


def _post_flags(workspace, ep_rank, offset, peers_P, value):
    _put_i32(workspace, peers_P, offset + 4 * ep_rank, torch.tensor([value]))
    at = workspace[0, offset + 4 * ep_rank:].data_ptr()
    futex.wake(at + peer * workspace.stride(0) for peer in peers_P.tolist())


def initialize(workspace, ep_rank, ep_size, max_num_tokens, eplb_stats_num_experts, profile: Profile):
    _check_alive()
    icheck(workspace.dtype == torch.uint8, "workspace.dtype() == dl_uint8", "workspace must be uint8")
    icheck_eq(workspace.dim(), 2, "workspace.ndim()", "2", "workspace must be a 2D tensor")
    icheck_eq(workspace.size(0), ep_size, "workspace.size(0)", "epSize", "workspace first dim must equal ep_size")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize", "epRank out of range")
    icheck(eplb_stats_num_experts >= 0, "eplbStatsNumExperts >= 0", "eplb_stats_num_experts must be non-negative")
    if Hooks.before_initialize_zero is not None:
        Hooks.before_initialize_zero(workspace, ep_rank)
    workspace[ep_rank].zero_()  # only the caller's row: peers zero their own
    offsets = metainfo_offsets(ep_size, max_num_tokens, eplb_stats_num_experts, profile.k_max_top_k)
    if not profile.eplb_and_rank_mask:
        del offsets[EPLB_GATHERED_STATS]
    return torch.tensor(offsets, dtype=torch.int64)


def dispatch(ids_TK, payloads, workspace, metainfo, rtm, ep_rank, ep_size, top_k, num_experts,
             eplb_local_stats, enable_rank_mask, active_rank_mask, profile: Profile):
    """``moeA2ADispatchOp``. Returns (recv_offsets, recv_sizes, combine_payload_offset,
    eplb_gathered_stats_offset, eplb_stats_num_experts); offsets are absolute in the workspace."""
    _check_alive()
    icheck(ids_TK.is_contiguous(), "tokenSelectedExperts.IsContiguous()", "token_selected_experts must be contiguous")
    icheck(ids_TK.dtype == torch.int32, "tokenSelectedExperts.dtype() == dl_int32", "token_selected_experts must be int32")
    icheck_eq(ids_TK.dim(), 2, "tokenSelectedExperts.ndim()", "2", "token_selected_experts must be 2D")
    icheck_eq(ids_TK.size(1), top_k, "tokenSelectedExperts.size(1)", "topK", "token_selected_experts shape mismatch")
    n_payloads = len(payloads)
    icheck(n_payloads > 0, "numPayloads > 0", "At least one payload is required")
    icheck(n_payloads <= profile.k_max_payloads, "numPayloads <= tl_throughput::kMaxPayloads",
           f"Too many payloads: {n_payloads} > {profile.k_max_payloads}")
    T = ids_TK.size(0)
    for i, p in enumerate(payloads):
        icheck(p.is_contiguous(), "payload.IsContiguous()", "payload must be contiguous")
        icheck_eq(p.dim(), 2, "payload.ndim()", "2", f"payload {i} must be 2D")
        icheck_eq(p.size(0), T, "payload.size(0)", "localNumTokens", f"payload {i} first dimension must match local_num_tokens")
    offsets = _check_workspace_and_metainfo(workspace, metainfo, ep_size, profile)
    icheck(0 < ep_size <= profile.k_max_ranks, "epSize > 0 && epSize <= tl_throughput::kMaxRanks",
           f"epSize must be in the range (0, {profile.k_max_ranks}]")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize")
    icheck(rtm > 0, "runtimeMaxTokensPerRank > 0")
    if profile.experts_divisible:
        icheck(num_experts >= ep_size and num_experts % ep_size == 0,
               "numExperts >= epSize && numExperts % epSize == 0", "num_experts must be divisible by ep_size")
    else:
        icheck(num_experts >= ep_size, "numExperts >= epSize", "num_experts must be >= ep_size")
    icheck(0 < top_k <= profile.k_max_top_k, "topK > 0 && topK <= tl_throughput::kMaxTopK")
    _switch_top_k(top_k, "moe_a2a_dispatch_launch", profile)
    n_eplb = 0
    if eplb_local_stats is not None:
        icheck(eplb_local_stats.dtype == torch.int32, "localStats.dtype() == dl_int32", "eplb_local_stats must be int32")
        icheck_eq(eplb_local_stats.dim(), 1, "localStats.ndim()", "1", "eplb_local_stats must be a 1D tensor")
        n_eplb = eplb_local_stats.size(0)
        icheck(n_eplb > 0, "eplbStatsNumExperts > 0", "eplb_local_stats must not be empty")
        icheck(n_eplb <= num_experts, "eplbStatsNumExperts <= numExperts", "eplb_local_stats size must be <= num_experts")
        icheck(offsets[EPLB_GATHERED_STATS] + ep_size * n_eplb * 4 <= offsets[PAYLOAD_DATA],
               "gatheredEnd <= offsets[fi_throughput::PAYLOAD_DATA_OFFSET_INDEX]",
               f"eplb_local_stats size ({n_eplb}) exceeds the eplb_stats_num_experts reserved at initialize time")
    sizes, total = [], 0
    for i, p in enumerate(payloads):
        item = p.element_size()
        sizes.append(ep_size * rtm * p.size(1) * item)
        total += sizes[-1]
        icheck(total % item == 0, "totalBytesNeeded % elementSize == 0",
               f"Misaligned payload buffer {i} with element size {item}. "
               "Consider reordering payloads by largest to smallest element size")
    size_per_rank = workspace.size(1)
    required = offsets[PAYLOAD_DATA] + total
    icheck(size_per_rank >= required, "sizePerRank >= requiredSize",
           f"workspace size per rank insufficient, need {required} bytes but has {size_per_rank}")
    active = _resolve_mask(profile, enable_rank_mask, active_rank_mask, ep_rank)
    # The kernel reads any id and writes to the rank its division gives: an id outside
    # [0, num_experts) that still divides to a rank (-1, SGLang's padded rows) is sent there as
    # on a GPU; one that divides to no rank would write outside the workspace.
    if T:
        ranks = expert_to_rank(ids_TK, num_experts, ep_size)
        if int(ranks.min()) < 0 or int(ranks.max()) >= ep_size:
            lo, hi = int(ids_TK.min()), int(ids_TK.max())
            raise RuntimeError(
                f"token_selected_experts holds expert ids in [{lo}, {hi}], outside [0, {num_experts}), that the "
                f"kernel's division sends to ranks outside [0, {ep_size}): the real kernel does not check and would "
                "write outside the workspace"
            )
    if T > rtm:
        raise RuntimeError(
            f"local_num_tokens ({T}) exceeds runtime_max_tokens_per_rank ({rtm}): the real kernel "
            "does not check and would overwrite the next source rank's slots"
        )

    local_offsets, off = [], offsets[PAYLOAD_DATA]
    for size in sizes:
        local_offsets.append(off)
        off += size
    put(ids_TK, payloads, workspace, Regions(*offsets), local_offsets, rtm, ep_rank, ep_size, num_experts,
        eplb_local_stats, active, recv_parity=None, timeout_s=FLAG_TIMEOUT_S)
    base = ep_rank * workspace.stride(0)
    eplb_offset = base + offsets[EPLB_GATHERED_STATS] if n_eplb else -1
    return [base + o for o in local_offsets], sizes, align(off), eplb_offset, n_eplb


def _recv_counters_at(regions: "Regions", ep_size: int, parity: int | None) -> int:
    """Byte offset of the received-count array: one ``[ep_size]`` array before 0.7.4, then
    one per round parity (``[2][ep_size]``)."""
    return regions.RECV_COUNTERS + (0 if parity is None else 4 * ep_size * parity)


def put(ids_TK, payloads, workspace, regions: "Regions", recv_offsets, rtm, me, ep_size, num_experts,
        eplb_local_stats, active, recv_parity, timeout_s, invalid_ids_route_nowhere=False):
    """``moeA2APrepareDispatchKernel`` and ``moeA2ADispatchKernel`` after the op's checks:
    put each token's payloads into the rows of the ranks owning its experts (payload ``i`` of
    source ``me`` at ``recv_offsets[i]`` of the target's row, ``[ep_size, rtm, bytes]``), post
    the counts and flags, wait for every peer's. ``recv_parity``: which of 0.7.4's two count
    arrays this round writes (None before 0.7.4); ``invalid_ids_route_nowhere``: 0.7.4's
    kernel sends a lane whose id is outside ``[0, num_experts)`` nowhere (earlier kernels
    have no such check: their ops refuse such ids before this). Returns the round's flag value."""
    T, top_k = ids_TK.shape
    flag = _i32(workspace, me, regions.FLAG_VAL, 1)
    flag += 1
    expected = int(flag.item())
    peers_P = _active_peers(active, ep_size)

    # moeA2ADispatchKernel: one send per unique target rank, the first lane wins.
    expert_TK = (ids_TK >= 0) & (ids_TK < num_experts) if invalid_ids_route_nowhere else torch.ones_like(
        ids_TK, dtype=torch.bool)
    target_TK = torch.where(expert_TK, expert_to_rank(ids_TK.clamp(0, num_experts - 1), num_experts, ep_size), -1)
    lanes = torch.arange(top_k)
    dup_TK = ((target_TK[:, :, None] == target_TK[:, None, :]) & (lanes[None, :] < lanes[:, None])[None]).any(-1)
    valid_TK = ~dup_TK & expert_TK
    if active is not None:
        valid_TK &= torch.tensor(active[:ep_size])[target_TK.clamp(min=0)]
    tok, lane = valid_TK.nonzero(as_tuple=True)
    dest = target_TK[tok, lane]
    counts_R = torch.bincount(dest, minlength=ep_size)
    slot = send_slots(dest, counts_R, me, expected)

    send_TK = torch.full((T, top_k), -1, dtype=torch.int32)
    send_TK[tok, lane] = slot.to(torch.int32)
    tgt_TK = torch.where(valid_TK, target_TK, -1).to(torch.int32)
    _i32(workspace, me, regions.TOPK_TARGET_RANKS, T * top_k)[:] = tgt_TK.flatten()
    _i32(workspace, me, regions.TOPK_SEND_INDICES, T * top_k)[:] = send_TK.flatten()
    _i32(workspace, me, regions.SEND_COUNTERS, ep_size)[:] = counts_R.to(torch.int32)

    # is_contiguous() ignores the strides of size-1 and empty dims (the kernel only needs the
    # row-major bytes); view() does not: read each payload through its row-major strides.
    blocks = []
    for p, at in zip(payloads, recv_offsets):
        B = p.size(1) * p.element_size()
        data_TB = p.as_strided(p.shape, (p.size(1), 1)).view(torch.uint8).reshape(T, B)
        blocks.append((data_TB, _blocks(workspace, at + me * rtm * B, rtm, B)))
    if _one_indexed_copy(tok.numel() * sum(data.size(1) for data, _ in blocks), int((counts_R > 0).sum())):
        for data_TB, block_RSB in blocks:
            block_RSB[dest, slot] = data_TB[tok]
    else:  # one index_select per target, straight into its block
        tok_by_slot = tok[torch.argsort(dest * rtm + slot)]
        first_R = (torch.cumsum(counts_R, 0) - counts_R).tolist()
        for r, n in enumerate(counts_R.tolist()):
            if n:
                for data_TB, block_RSB in blocks:
                    torch.index_select(data_TB, 0, tok_by_slot[first_R[r]:first_R[r] + n], out=block_RSB[r, :n])
    recv_at = _recv_counters_at(regions, ep_size, recv_parity)
    _put_i32(workspace, peers_P, recv_at + 4 * me, counts_R[peers_P, None])
    if eplb_local_stats is not None and eplb_local_stats.size(0):
        n_eplb = eplb_local_stats.size(0)
        _put_i32(workspace, peers_P, regions.EPLB_GATHERED_STATS + 4 * me * n_eplb, eplb_local_stats[None])
    side = _announce_rtm(workspace, me, peers_P, expected, rtm, _DISPATCH_SLOT)
    _post_flags(workspace, me, regions.DISPATCH_FLAGS, peers_P, expected)
    _wait_flags(workspace, me, regions.DISPATCH_FLAGS, peers_P, expected, "dispatch", timeout_s)
    _check_same_rtm(side, me, peers_P, expected, _DISPATCH_SLOT, "dispatch")
    return expected


_COMBINE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)


def combine(payload_RSH, T, workspace, metainfo, rtm, ep_rank, ep_size, top_k, combine_offset,
            payload_in_workspace, output_dtype, output_scales, use_low_precision,
            enable_rank_mask, active_rank_mask, output, profile: Profile):
    """``moeA2ACombineOp`` / ``moeA2ACombineIntoOp``: ``[T, H]``, written into ``output`` if given."""
    _check_alive()
    icheck(payload_RSH.is_contiguous(), "payload.IsContiguous()", "payload must be contiguous")
    icheck_eq(payload_RSH.dim(), 3, "payload.ndim()", "3", "payload must be [ep_size, runtime_max_tokens_per_rank, hidden]")
    icheck_eq(payload_RSH.size(0), ep_size, "payload.size(0)", "epSize")
    icheck_eq(payload_RSH.size(1), rtm, "payload.size(1)", "runtimeMaxTokensPerRank")
    icheck(0 < ep_size <= profile.k_max_ranks, "epSize > 0 && epSize <= tl_throughput::kMaxRanks",
           f"epSize must be in the range (0, {profile.k_max_ranks}]")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize")
    icheck(0 < top_k <= profile.k_max_top_k, "topK > 0 && topK <= tl_throughput::kMaxTopK")
    _switch_top_k(top_k, "moe_a2a_combine_launch", profile)
    icheck(T >= 0, "localNumTokens >= 0")
    offsets = _check_workspace_and_metainfo(workspace, metainfo, ep_size, profile)
    me, H = ep_rank, payload_RSH.size(2)
    payload_bytes = payload_RSH.numel() * payload_RSH.element_size()
    size_per_rank = workspace.size(1)
    icheck(combine_offset >= 0 and combine_offset + payload_bytes <= size_per_rank,
           "combinePayloadOffset >= 0 && combinePayloadOffset + payloadBytes <= sizePerRank",
           "workspace insufficient for combine payload region")
    region_start = workspace[me, combine_offset:]
    if payload_in_workspace:
        icheck(payload_RSH.data_ptr() == region_start.data_ptr(), "payload.data_ptr() == expectedPtr",
               f"payload_in_workspace is True but tensor pointer mismatch: {hex(payload_RSH.data_ptr())} "
               f"!= {hex(region_start.data_ptr())}")
    # toNvDataType: fp8 payloads from 0.6.14 on (the release that added quantized combine).
    if payload_RSH.dtype not in _COMBINE_DTYPES or (
            payload_RSH.dtype == torch.float8_e4m3fn and not profile.combine_quant_kws):
        raise TypeError("Unsupported dtype for MoE combine")
    if output_dtype is not None and output_dtype != payload_RSH.dtype or output_scales is not None:
        raise NotImplementedError(
            "quantized combine output (output_dtype/output_scales) needs SM>=100 kernels; "
            "the CPU fake does not emulate it"
        )
    # Low precision moves fp8 and upcasts to a bf16 output whatever the payload dtype (the
    # fp16/bf16-only rule is for quantized outputs, which the fake does not emulate).
    out_dtype = torch.bfloat16 if use_low_precision else payload_RSH.dtype
    if output is not None:
        icheck_eq(output.dim(), 2, "output.ndim()", "2", "output must be a 2D tensor")
        icheck_eq(output.size(0), T, "output.size(0)", "output_shape[0]")
        icheck_eq(output.size(1), H, "output.size(1)", "output_shape[1]")
        icheck(output.dtype == out_dtype, "output.dtype() == outputDtype",
               f"output dtype must match {'bf16 (use_low_precision)' if use_low_precision else 'payload dtype'} "
               f"(expected {out_dtype}, got {output.dtype})")
    active = _resolve_mask(profile, enable_rank_mask, active_rank_mask, ep_rank)
    return get(payload_RSH, T, workspace, Regions(*offsets), combine_offset, me, ep_size, top_k,
               payload_in_workspace, use_low_precision, active, output, out_dtype, recv_parity=None,
               timeout_s=FLAG_TIMEOUT_S)


def get(payload_RSH, T, workspace, regions: "Regions", combine_offset, me, ep_size, top_k, payload_in_workspace,
        use_low_precision, active, output, out_dtype, recv_parity, timeout_s):
    """``moeA2APrepareCombineKernel`` and ``moeA2ACombineKernel`` after the op's checks: stage
    this rank's expert outputs in its combine region, post and wait for the flags, then sum
    for each local token the rows its target ranks hold for it. ``[T, H]`` (into ``output``
    if given)."""
    H = payload_RSH.size(2)
    payload_bytes = payload_RSH.numel() * payload_RSH.element_size()
    peers_P = _active_peers(active, ep_size)
    flag = _i32(workspace, me, regions.FLAG_VAL, 1)
    flag += 1
    expected = int(flag.item())
    region_RSH = workspace[me, combine_offset:combine_offset + payload_bytes].view(payload_RSH.dtype).view(ep_size, -1, H)
    recv_R = _i32(workspace, me, _recv_counters_at(regions, ep_size, recv_parity), ep_size).tolist()
    for src, n in enumerate(recv_R):
        if n > 0:
            if not payload_in_workspace:
                region_RSH[src, :n] = payload_RSH[src, :n]
            if use_low_precision:
                region_RSH[src, :n] = region_RSH[src, :n].to(torch.float8_e4m3fn).to(payload_RSH.dtype)
    side = _announce_rtm(workspace, me, peers_P, expected, payload_RSH.size(1), _COMBINE_SLOT)
    _post_flags(workspace, me, regions.COMBINE_FLAGS, peers_P, expected)
    _wait_flags(workspace, me, regions.COMBINE_FLAGS, peers_P, expected, "combine", timeout_s)
    _check_same_rtm(side, me, peers_P, expected, _COMBINE_SLOT, "combine")
    if Hooks.before_combine_read is not None:
        Hooks.before_combine_read(workspace, me, regions)

    # moeA2ACombineKernel: sum, per local token, the rows its target ranks hold for it.
    tgt_TK = _i32(workspace, me, regions.TOPK_TARGET_RANKS, T * top_k).view(T, top_k)
    send_TK = _i32(workspace, me, regions.TOPK_SEND_INDICES, T * top_k).view(T, top_k)
    sent_TK = (send_TK >= 0) & (tgt_TK >= 0) & (tgt_TK < ep_size)
    if active is not None:
        sent_TK &= torch.tensor(active[:ep_size])[tgt_TK.clamp(0, ep_size - 1).long()]
    tok, lane = sent_TK.nonzero(as_tuple=True)
    tgt, send = tgt_TK[tok, lane].long(), send_TK[tok, lane].long()
    row, S = H * payload_RSH.element_size(), payload_RSH.size(1)
    blocks_RSB = _blocks(workspace, combine_offset + me * S * row, S, row)
    acc_TH = torch.zeros(T, H, dtype=torch.float32)
    targets = torch.unique(tgt)
    if _one_indexed_copy(tok.numel() * row, targets.numel()):
        acc_TH.index_add_(0, tok, blocks_RSB[tgt, send].view(payload_RSH.dtype).float())
    else:  # per peer
        for r in targets.tolist():
            sel = (tgt == r).nonzero().flatten()
            acc_TH.index_add_(0, tok[sel], blocks_RSB[r].view(payload_RSH.dtype).index_select(0, send[sel]).float())
    if output is None:
        return acc_TH.to(out_dtype)
    output.copy_(acc_TH)
    return output


def sanitize_expert_ids(expert_ids_RSK, workspace, metainfo, ep_rank, invalid_expert_id, profile: Profile):
    """``moeA2ASanitizeExpertIdsOp``: rows past each source's received count get the invalid id."""
    _check_alive()
    icheck(expert_ids_RSK.dtype == torch.int32, "expertIds.dtype() == dl_int32", "expert_ids must be int32")
    icheck_eq(expert_ids_RSK.dim(), 3, "expertIds.ndim()", "3")
    R, S, _ = expert_ids_RSK.shape
    icheck(metainfo.dtype == torch.int64, "metainfo.dtype() == dl_int64")
    recv_R = _i32(workspace, ep_rank, _read_metainfo(metainfo, profile)[RECV_COUNTERS], R)
    stale_RS = torch.arange(S)[None, :] >= recv_R[:, None]
    expert_ids_RSK[stale_RS] = invalid_expert_id
