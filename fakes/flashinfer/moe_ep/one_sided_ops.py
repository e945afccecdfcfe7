"""The JIT module behind 0.7.4's ``NVLinkOneSidedAlltoAll`` (``csrc/nvlink_one_sided_alltoall.cu``),
on CPU: the workspace layout with its 33 metainfo fields, the same checks and messages, and
the fence transport's data path (shared with the older kernels in ``moe_a2a_kernels``).

The fake machine is a Hopper-class NVLink box: no CFT counted writes (compute capability
below 10.0) and no Lamport kernels, so every step takes the fence path, as it does there.

Legend: T local tokens, K top_k, R ep ranks, S runtime max tokens per rank, H hidden.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from fakes.flashinfer._check import check_contiguous, check_input_type, icheck, icheck_eq
from fakes.flashinfer.comm import moe_a2a_kernels as kernels
from fakes.flashinfer.profiles import PROFILES

# MoeA2AMetaInfoIndex (thop/moe/communication/moeAlltoAllMeta.h), in index order.
METAINFO_FIELDS = (
    "FLAG_VAL", "LOCAL_TOKEN_COUNTER", "SEND_COUNTERS", "RECV_COUNTERS", "DISPATCH_COMPLETION_FLAGS",
    "DISPATCH_COUNTED_WRITE_COUNTERS", "DISPATCH_COUNTER_BASELINE", "TOPK_TARGET_RANKS", "TOPK_TARGET_INDICES",
    "EPLB_GATHERED_STATS", "DISPATCH_PAYLOAD", "DISPATCH_PAYLOAD_SIZE_INDEX", "COMBINE_COMPLETION_FLAGS",
    "COMBINE_COUNTED_WRITE_COUNTERS", "COMBINE_COUNTER_BASELINE", "COMBINE_INPUT", "COMBINE_INPUT_SIZE_INDEX",
    "COMBINE_RECV", "COMBINE_RECV_SIZE_INDEX", "MAX_NUM_TOKENS_INDEX", "TOP_K_INDEX", "EP_SIZE_INDEX",
    "EPLB_STATS_NUM_EXPERTS_INDEX", "CFT_ENABLED_INDEX", "WORKSPACE_SIZE_INDEX", "LAMPORT_MAX_NUM_TOKENS_INDEX",
    "LAMPORT_PAYLOAD_FORMAT_INDEX", "LAMPORT_HIDDEN_SIZE_INDEX", "LAMPORT_STATE", "LAMPORT_LANDING",
    "LAMPORT_COMBINE_LANDING", "LAMPORT_RECV", "LAMPORT_RECV_SIZE_INDEX",
)
NUM_METAINFO_FIELDS = len(METAINFO_FIELDS)
_AT = {name: i for i, name in enumerate(METAINFO_FIELDS)}
WORKSPACE_ALIGNMENT = 256  # kWorkspaceAlignment
CACHELINE = 128  # kCachelineAlignment
MAX_TIMEOUT_S = 24 * 60 * 60
_PROFILE = PROFILES["0.7.4"]


def _index_name(field: str) -> str:
    return field if field.endswith("_INDEX") else f"{field}_OFFSET_INDEX"


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


# The Lamport transport's limits and payload formats (moe_alltoall_lamport.cuh), which the
# module reports whether or not it has the kernels.
LAMPORT_CONSTANTS = (("MAX_RANKS", 64), ("MAX_TOP_K", 22), ("MAX_TOKENS_PER_RANK", 512),
                     ("DISPATCH_BLOCKS_PER_SM", 6), ("IDS_SENTINEL", 0x88888888 - (1 << 32)), ("FORMAT_BF16", 0),
                     ("FORMAT_MXFP8", 1), ("FORMAT_FP8_BLOCK128", 2), ("FORMAT_NVFP4", 3))


def metainfo_index_pairs() -> tuple[list[str], list[int]]:
    """``moe_a2a_get_metainfo_index_pairs``: the field indices, the kernel limits, then the
    Lamport constants (the sentinel as the int32 the real op reports)."""
    pairs = [(f"MOE_A2A_{_index_name(f)}", i) for i, f in enumerate(METAINFO_FIELDS)]
    pairs += [("MOE_A2A_NUM_METAINFO_FIELDS", NUM_METAINFO_FIELDS), ("MOE_A2A_MAX_RANKS", _PROFILE.k_max_ranks),
              ("MOE_A2A_MAX_TOP_K", _PROFILE.k_max_top_k), ("MOE_A2A_MAX_PAYLOADS", _PROFILE.k_max_payloads),
              ("MOE_A2A_WORKSPACE_ALIGNMENT", WORKSPACE_ALIGNMENT)]
    pairs += [(f"MOE_A2A_LAMPORT_{name}", value) for name, value in LAMPORT_CONSTANTS]
    return [n for n, _ in pairs], [v for _, v in pairs]


def layout_constants() -> SimpleNamespace:
    """What ``kernels.layout_constants()`` gives: the pairs without their ``MOE_A2A_`` prefix."""
    names, values = metainfo_index_pairs()
    return SimpleNamespace(**{n.removeprefix("MOE_A2A_"): v for n, v in zip(names, values)})


def workspace_layout(ep_size: int, max_num_tokens: int, top_k: int, dispatch_bytes: int,
                     combine_input_bytes: int, combine_recv_bytes: int, eplb_stats_num_experts: int,
                     can_use_cft: bool) -> list[int]:
    """``calculateWorkspaceLayout``: the per-rank byte offsets and capacities, in field order."""
    icheck(0 < ep_size <= _PROFILE.k_max_ranks, "epSize > 0 && epSize <= tl::kMaxRanks",
           f"Invalid EP size: {ep_size}")
    icheck(0 < max_num_tokens <= 2**31 - 1, "maxNumTokens > 0 && maxNumTokens <= std::numeric_limits<int32_t>::max()",
           f"Invalid allocation-time token capacity: {max_num_tokens}")
    icheck(0 < top_k <= _PROFILE.k_max_top_k, "topK > 0 && topK <= tl::kMaxTopK", f"Invalid top_k: {top_k}")
    icheck(0 <= eplb_stats_num_experts <= 2**31 - 1,
           "eplbStatsNumExperts >= 0 && eplbStatsNumExperts <= std::numeric_limits<int32_t>::max()",
           f"Invalid EPLB expert capacity: {eplb_stats_num_experts}")
    icheck(can_use_cft or combine_recv_bytes == 0, "canUseCft || combineRecvBytes == 0",
           "A combine receive payload requires CFT support")
    for nbytes in (dispatch_bytes, combine_input_bytes, combine_recv_bytes):
        icheck(nbytes >= 0, "bytes >= 0 && bytes <= std::numeric_limits<int64_t>::max() - kWorkspaceAlignment",
               f"Invalid workspace payload capacity: {nbytes}")
    dispatch_bytes, combine_input_bytes, combine_recv_bytes = (
        _align(b, WORKSPACE_ALIGNMENT) for b in (dispatch_bytes, combine_input_bytes, combine_recv_bytes))
    layout = [0] * NUM_METAINFO_FIELDS
    offset = 0

    def reserve(field: str, nbytes: int, alignment: int = 4) -> None:
        nonlocal offset
        offset = _align(offset, alignment)
        layout[_AT[field]] = offset
        offset += nbytes

    counts = 4 * ep_size
    reserve("FLAG_VAL", 4)
    reserve("LOCAL_TOKEN_COUNTER", 4)
    reserve("SEND_COUNTERS", counts)
    reserve("RECV_COUNTERS", 2 * counts)
    reserve("DISPATCH_COMPLETION_FLAGS", counts, CACHELINE)
    if can_use_cft:
        raise NotImplementedError("CFT counted writes need compute capability >= 10.0; the fake machine has none")
    reserve("TOPK_TARGET_RANKS", max_num_tokens * top_k * 4, CACHELINE)
    reserve("TOPK_TARGET_INDICES", max_num_tokens * top_k * 4, CACHELINE)
    reserve("EPLB_GATHERED_STATS", ep_size * eplb_stats_num_experts * 4, CACHELINE)
    reserve("DISPATCH_PAYLOAD", dispatch_bytes, WORKSPACE_ALIGNMENT)
    layout[_AT["DISPATCH_PAYLOAD_SIZE_INDEX"]] = dispatch_bytes
    reserve("COMBINE_COMPLETION_FLAGS", counts, CACHELINE)
    reserve("COMBINE_INPUT", combine_input_bytes, WORKSPACE_ALIGNMENT)
    layout[_AT["COMBINE_INPUT_SIZE_INDEX"]] = combine_input_bytes
    for field, value in (("MAX_NUM_TOKENS_INDEX", max_num_tokens), ("TOP_K_INDEX", top_k),
                         ("EP_SIZE_INDEX", ep_size), ("EPLB_STATS_NUM_EXPERTS_INDEX", eplb_stats_num_experts),
                         ("CFT_ENABLED_INDEX", int(can_use_cft)), ("WORKSPACE_SIZE_INDEX", offset)):
        layout[_AT[field]] = value
    return layout


def get_workspace_layout(ep_size, max_num_tokens, top_k, dispatch_bytes, combine_input_bytes, combine_recv_bytes,
                         eplb_stats_num_experts, can_use_cft, metainfo: torch.Tensor) -> None:
    """``moe_a2a_get_workspace_layout``: write the layout into ``metainfo`` (CPU int64)."""
    _check_metainfo(metainfo, "metainfo must have NUM_METAINFO_FIELDS elements")
    metainfo.copy_(torch.tensor(workspace_layout(ep_size, max_num_tokens, top_k, dispatch_bytes, combine_input_bytes,
                                                 combine_recv_bytes, eplb_stats_num_experts, can_use_cft)))


def _check_metainfo(metainfo: torch.Tensor, msg: str) -> list[int]:
    check_contiguous(metainfo, "metainfo")
    check_input_type(metainfo, torch.int64, "metainfo")
    icheck(metainfo.dim() == 1 and metainfo.size(0) == NUM_METAINFO_FIELDS,
           "metainfo.ndim() == 1 && metainfo.size(0) == meta::NUM_METAINFO_FIELDS", msg)
    return [int(v) for v in metainfo.tolist()]


def _read_layout(metainfo: torch.Tensor) -> dict[str, int]:
    values = _check_metainfo(metainfo, "metainfo must contain the complete MoE A2A workspace layout")
    return dict(zip(METAINFO_FIELDS, values))


def _regions(layout: dict[str, int]) -> kernels.Regions:
    return kernels.Regions(
        FLAG_VAL=layout["FLAG_VAL"], LOCAL_TOKEN_COUNTER=layout["LOCAL_TOKEN_COUNTER"],
        SEND_COUNTERS=layout["SEND_COUNTERS"], RECV_COUNTERS=layout["RECV_COUNTERS"],
        DISPATCH_FLAGS=layout["DISPATCH_COMPLETION_FLAGS"], COMBINE_FLAGS=layout["COMBINE_COMPLETION_FLAGS"],
        TOPK_TARGET_RANKS=layout["TOPK_TARGET_RANKS"], TOPK_SEND_INDICES=layout["TOPK_TARGET_INDICES"],
        EPLB_GATHERED_STATS=layout["EPLB_GATHERED_STATS"], PAYLOAD_DATA=layout["DISPATCH_PAYLOAD"])


def _flag(workspace: torch.Tensor, rank: int, layout: dict[str, int]) -> int:
    return int(kernels._i32(workspace, rank, layout["FLAG_VAL"], 1)[0])


def _parity(dispatch_flag: int) -> int:
    """Which received-count array a round uses: dispatch and combine each advance the flag,
    so round ``n`` dispatches at flag ``2n + 1``."""
    return (dispatch_flag >> 1) & 1


def initialize(workspace: torch.Tensor, metainfo: torch.Tensor, ep_rank: int, ep_size: int) -> None:
    """``moe_a2a_initialize``: zero this rank's slice, received counts to -1. Touches only the
    caller's row; the caller barriers the EP group before any peer may publish into it."""
    kernels._check_alive()
    check_input_type(workspace, torch.uint8, "workspace")
    icheck(workspace.dim() == 2 and workspace.size(0) == ep_size and workspace.stride(1) == 1,
           "workspace.ndim() == 2 && workspace.size(0) == epSize && workspace.stride(1) == 1",
           "workspace must have shape [ep_size, bytes_per_rank] with contiguous rank slices")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize", "Invalid EP rank")
    layout = _read_layout(metainfo)
    icheck(layout["EP_SIZE_INDEX"] == ep_size, "layout[EP_SIZE_INDEX] == epSize", "Workspace layout EP size mismatch")
    icheck(layout["LAMPORT_MAX_NUM_TOKENS_INDEX"] == 0, "layout[LAMPORT_MAX_NUM_TOKENS_INDEX] == 0",
           "the fake machine has no Lamport kernels")
    expected = workspace_layout(ep_size, layout["MAX_NUM_TOKENS_INDEX"], layout["TOP_K_INDEX"],
                                layout["DISPATCH_PAYLOAD_SIZE_INDEX"], layout["COMBINE_INPUT_SIZE_INDEX"],
                                layout["COMBINE_RECV_SIZE_INDEX"], layout["EPLB_STATS_NUM_EXPERTS_INDEX"],
                                bool(layout["CFT_ENABLED_INDEX"]))
    icheck(list(layout.values()) == expected, "layout == expected", "Workspace layout metadata is inconsistent")
    icheck(layout["DISPATCH_PAYLOAD_SIZE_INDEX"] > 0 and layout["COMBINE_INPUT_SIZE_INDEX"] > 0,
           "layout[DISPATCH_PAYLOAD_SIZE_INDEX] > 0 && layout[COMBINE_INPUT_SIZE_INDEX] > 0",
           "Dispatch and combine input payload capacities must be positive")
    size = layout["WORKSPACE_SIZE_INDEX"]
    icheck(workspace.size(1) >= size, "workspace.size(1) >= layout[WORKSPACE_SIZE_INDEX]",
           f"Workspace needs {size} bytes per rank, got {workspace.size(1)}")
    if kernels.Hooks.before_initialize_zero is not None:
        kernels.Hooks.before_initialize_zero(workspace, ep_rank)
    workspace[ep_rank, :size].zero_()
    kernels._i32(workspace, ep_rank, layout["RECV_COUNTERS"], 2 * ep_size).fill_(-1)


def _check_common(ep_rank, ep_size, top_k, layout, workspace, rtm, op: str) -> None:
    icheck(rtm > 0, "runtimeMaxTokensPerRank > 0", "runtimeMaxTokensPerRank must be positive")
    icheck(0 < ep_size <= _PROFILE.k_max_ranks, "epSize > 0 && epSize <= tl::kMaxRanks",
           f"epSize must be in the range (0, {_PROFILE.k_max_ranks}]")
    icheck(0 <= ep_rank < ep_size, "epRank >= 0 && epRank < epSize", "epRank must be in the range [0, epSize)")
    icheck(0 < top_k <= _PROFILE.k_max_top_k, "topK > 0 && topK <= tl::kMaxTopK",
           "topK must be in the range (0, kMaxTopK]")
    check_input_type(workspace, torch.uint8, "workspace")
    if op == "Dispatch":
        icheck_eq(workspace.dim(), 2, "workspace.ndim()", "2", "workspace must be a 2D tensor of shape [epSize, sizePerRank]")
        icheck_eq(workspace.size(0), ep_size, "workspace.size(0)", "epSize", "workspace first dimension must equal epSize")
    else:
        icheck(workspace.dim() == 2 and workspace.size(0) == ep_size,
               "workspace.ndim() == 2 && workspace.size(0) == epSize", "workspace must be [ep_size, size_per_rank]")
    icheck(ep_size == layout["EP_SIZE_INDEX"] and top_k == layout["TOP_K_INDEX"],
           "epSize == offsets[EP_SIZE_INDEX] && topK == offsets[TOP_K_INDEX]",
           f"{op} EP size/top_k differs from its workspace layout")
    icheck(workspace.size(1) >= layout["WORKSPACE_SIZE_INDEX"], "workspace.size(1) >= offsets[WORKSPACE_SIZE_INDEX]",
           "Workspace is smaller than its layout")


def _check_transport(use_cft: bool, use_lamport: bool) -> None:
    icheck(not use_lamport, "!useLamport || offsets[LAMPORT_MAX_NUM_TOKENS_INDEX] > 0",
           "Workspace was allocated without Lamport regions")
    icheck(not use_cft, "!useCftCountedWrites || offsets[CFT_ENABLED_INDEX]",
           "Workspace was allocated without CFT support")


def _timeout_s(timeout_sec: int) -> float:
    """The fake traps at the configured timeout, or sooner at the testbed's flag timeout."""
    icheck(0 < timeout_sec <= MAX_TIMEOUT_S, "timeoutSec > 0 && timeoutSec <= kMaxTimeoutSec",
           f"MoE all-to-all timeout must be in 1..{MAX_TIMEOUT_S} seconds")
    return min(float(timeout_sec), kernels.FLAG_TIMEOUT_S)


def dispatch(ids_TK, payloads, workspace, metainfo, rtm, ep_rank, ep_size, top_k, num_experts, eplb_local_stats,
             use_cft, expert_id_index, invalid_expert_id, use_lamport, enable_rank_mask, active_rank_mask,
             timeout_sec, enable_pdl):
    """``moe_a2a_dispatch``: ``(recv_offsets, combine_offset, eplb_offset)``, byte offsets in
    this rank's row (the receive buffer of payload ``i`` is ``[ep_size, rtm, bytes_i]`` there)."""
    kernels._check_alive()
    check_contiguous(ids_TK, "tokenSelectedExperts")
    check_input_type(ids_TK, torch.int32, "tokenSelectedExperts")
    icheck_eq(ids_TK.dim(), 2, "tokenSelectedExperts.ndim()", "2", "tokenSelectedExperts must be a 2D tensor")
    icheck_eq(ids_TK.size(1), top_k, "tokenSelectedExperts.size(1)", "topK", "tokenSelectedExperts must have topK columns")
    layout = _read_layout(metainfo)
    _check_transport(use_cft, use_lamport)
    T = ids_TK.size(0)
    icheck(rtm <= layout["MAX_NUM_TOKENS_INDEX"], "runtimeMaxTokensPerRank <= offsets[MAX_NUM_TOKENS_INDEX]",
           "runtimeMaxTokensPerRank exceeds the allocation-time token capacity")
    _check_common(ep_rank, ep_size, top_k, layout, workspace, rtm, "Dispatch")
    icheck(len(payloads) > 0, "numPayloads > 0", "inputPayloads must not be empty")
    icheck(len(payloads) <= _PROFILE.k_max_payloads, "numPayloads <= tl::kMaxPayloads", "Too many input payloads")
    icheck(num_experts >= ep_size, "numExperts >= epSize", "numExperts must be greater than or equal to epSize")
    n_eplb = 0
    if eplb_local_stats is not None:
        check_contiguous(eplb_local_stats, "stats")
        check_input_type(eplb_local_stats, torch.int32, "stats")
        icheck_eq(eplb_local_stats.dim(), 1, "stats.ndim()", "1", "eplb_local_stats must be a 1D tensor")
        n_eplb = eplb_local_stats.size(0)
        icheck(n_eplb > 0, "eplbStatsNumExperts > 0", "eplb_local_stats must not be empty")
        icheck(n_eplb <= num_experts, "eplbStatsNumExperts <= numExperts",
               "eplb_local_stats size must be <= numExperts (slots)")
    recv_offsets, at = [], layout["DISPATCH_PAYLOAD"]
    for p in payloads:
        check_contiguous(p, "payload")
        icheck_eq(p.dim(), 2, "payload.ndim()", "2", "payload must be a 2D tensor")
        icheck_eq(p.size(0), T, "payload.size(0)", "localNumTokens",
                  "payload must have the same first dimension as tokenSelectedExperts")
        icheck(p.data_ptr() % 16 == 0, "reinterpret_cast<uintptr_t>(payload.data_ptr()) % 16 == 0",
               "payload must be 16-byte aligned")
        recv_offsets.append(at)
        at = _align(at + ep_size * rtm * p.size(1) * p.element_size(), CACHELINE)
    if expert_id_index >= 0:
        icheck(expert_id_index < len(payloads), "expertIdPayloadIndex < numPayloads",
               "expert_id_payload_index out of range")
        check_input_type(payloads[expert_id_index], torch.int32, "expertIdPayload")
        icheck_eq(payloads[expert_id_index].size(1), top_k, "expertIdPayload.size(1)", "topK",
                  "expert-id payload must have topK columns")
    icheck(T <= rtm, "localNumTokens <= runtimeMaxTokensPerRank", "Local token count exceeds the runtime capacity")
    icheck(n_eplb <= layout["EPLB_STATS_NUM_EXPERTS_INDEX"],
           "eplbStatsNumExperts <= offsets[EPLB_STATS_NUM_EXPERTS_INDEX]",
           "EPLB statistics exceed their workspace capacity")
    capacity = layout["DISPATCH_PAYLOAD_SIZE_INDEX"]
    icheck(at <= layout["DISPATCH_PAYLOAD"] + capacity, "currentOffset <= recvRegionOffset + recvRegionSize",
           f"Dispatch payload exceeds its workspace capacity: need {at - layout['DISPATCH_PAYLOAD']} bytes, "
           f"capacity {capacity}")
    timeout_s = _timeout_s(timeout_sec)
    active = kernels._resolve_mask(_PROFILE, enable_rank_mask, active_rank_mask, ep_rank)
    kernels._switch_top_k(top_k, "moe_a2a_dispatch_launch", _PROFILE)
    # An id outside [0, num_experts) has no destination (the kernel's valid_expert).
    kernels.put(ids_TK, payloads, workspace, _regions(layout), recv_offsets, rtm, ep_rank, ep_size, num_experts,
                eplb_local_stats, active, recv_parity=_parity(_flag(workspace, ep_rank, layout) + 1), timeout_s=timeout_s,
                invalid_ids_route_nowhere=True)
    eplb_offset = layout["EPLB_GATHERED_STATS"] if n_eplb else -1
    return recv_offsets, layout["COMBINE_INPUT"], eplb_offset


_COMBINE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def combine(payload_RSH, T, workspace, metainfo, rtm, ep_rank, ep_size, top_k, combine_offset, payload_in_workspace,
            use_low_precision, use_cft, enable_rank_mask, active_rank_mask, output, timeout_sec, enable_pdl,
            use_lamport) -> None:
    """``moe_a2a_combine``: each local token's rows summed into ``output`` ``[T, H]``."""
    kernels._check_alive()
    check_contiguous(payload_RSH, "payload")
    icheck_eq(payload_RSH.dim(), 3, "payload.ndim()", "3",
              "payload must be a 3D tensor [ep_size, runtime_max_tokens_per_rank, elements_per_token]")
    icheck_eq(payload_RSH.size(0), ep_size, "payload.size(0)", "epSize", "payload first dimension must equal epSize")
    icheck(rtm > 0, "runtimeMaxTokensPerRank > 0", "runtimeMaxTokensPerRank must be positive")
    icheck_eq(payload_RSH.size(1), rtm, "payload.size(1)", "runtimeMaxTokensPerRank",
              "payload second dimension must equal runtimeMaxTokensPerRank")
    icheck(payload_RSH.data_ptr() % 16 == 0, "reinterpret_cast<uintptr_t>(payload.data_ptr()) % 16 == 0",
           "payload must be 16-byte aligned")
    icheck(payload_RSH.size(2) > 0, "elementsPerToken > 0", "elementsPerToken must be positive")
    icheck(T >= 0, "localNumTokens >= 0", "localNumTokens must be non-negative")
    if payload_RSH.dtype not in _COMBINE_DTYPES:
        raise TypeError("Unsupported data type for payload")
    check_contiguous(output, "output")
    icheck(output.dtype == payload_RSH.dtype, "output.dtype() == payload.dtype()",
           "output dtype must match the payload dtype")
    icheck(output.dim() == 2 and output.size(0) == T and output.size(1) == payload_RSH.size(2),
           "output.ndim() == 2 && output.size(0) == localNumTokens && output.size(1) == elementsPerToken",
           "output must be a [local_num_tokens, elements_per_token] tensor")
    layout = _read_layout(metainfo)
    _check_common(ep_rank, ep_size, top_k, layout, workspace, rtm, "Combine")
    _check_transport(use_cft, use_lamport)
    icheck(rtm <= layout["MAX_NUM_TOKENS_INDEX"], "runtimeMaxTokensPerRank <= offsets[MAX_NUM_TOKENS_INDEX]",
           "runtimeMaxTokensPerRank exceeds the allocation-time token capacity")
    icheck(combine_offset == layout["COMBINE_INPUT"], "combinePayloadOffset == offsets[COMBINE_INPUT_OFFSET_INDEX]",
           "combinePayloadOffset must address the fixed combine source region")
    in_workspace = payload_RSH.data_ptr() == workspace[ep_rank, combine_offset:].data_ptr()
    icheck(not payload_in_workspace or in_workspace, "!payloadInWorkspace || inputIsWorkspace",
           "payload_in_workspace is true but payload does not address the combine input region")
    need, capacity = payload_RSH.numel() * payload_RSH.element_size(), layout["COMBINE_INPUT_SIZE_INDEX"]
    icheck(need <= capacity, "payloadSize <= regionSize",
           f"Combine payload exceeds its fixed workspace region: need {need} bytes, capacity {capacity}")
    timeout_s = _timeout_s(timeout_sec)
    active = kernels._resolve_mask(_PROFILE, enable_rank_mask, active_rank_mask, ep_rank)
    kernels._switch_top_k(top_k, "moe_a2a_combine_launch", _PROFILE)
    # The kernel reads the expert outputs where they are; staging is the fake's way to make
    # them visible to the peers, and a no-op when they already sit in the combine region.
    kernels.get(payload_RSH, T, workspace, _regions(layout), combine_offset, ep_rank, ep_size, top_k, in_workspace,
                use_low_precision, active, output, output.dtype, recv_parity=_parity(_flag(workspace, ep_rank, layout)),
                timeout_s=timeout_s)


def sanitize_expert_ids(expert_ids_RSK, workspace, metainfo, ep_rank, invalid_expert_id, enable_pdl) -> None:
    """``moe_a2a_sanitize_expert_ids``: rows past each source's received count get the invalid id."""
    kernels._check_alive()
    check_contiguous(expert_ids_RSK, "expertIds")
    check_input_type(expert_ids_RSK, torch.int32, "expertIds")
    icheck_eq(expert_ids_RSK.dim(), 3, "expertIds.ndim()", "3", "expert_ids must be [ep_size, runtime_max_tokens_per_rank, top_k]")
    layout = _read_layout(metainfo)
    check_input_type(workspace, torch.uint8, "workspace")
    icheck_eq(workspace.dim(), 2, "workspace.ndim()", "2")
    R, S, _ = expert_ids_RSK.shape
    parity = _parity(_flag(workspace, ep_rank, layout))
    recv_R = kernels._i32(workspace, ep_rank, layout["RECV_COUNTERS"] + 4 * R * parity, R)
    expert_ids_RSK[torch.arange(S)[None, :] >= recv_R[:, None]] = invalid_expert_id


def module() -> SimpleNamespace:
    """What ``get_nvlink_one_sided_alltoall_module()`` returns, for the fence transport."""
    return SimpleNamespace(
        moe_a2a_get_metainfo_index_pairs=metainfo_index_pairs, moe_a2a_get_workspace_layout=get_workspace_layout,
        moe_a2a_initialize=initialize, moe_a2a_dispatch=dispatch, moe_a2a_combine=combine,
        moe_a2a_sanitize_expert_ids=sanitize_expert_ids, moe_a2a_lamport_available=lambda: False,
    )
