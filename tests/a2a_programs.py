"""Rank programs and the dense reference for the one-sided all-to-all tests.

Every rank rebuilds every rank's inputs from ``(seed, rank)``, so the reference needs no
communication. Legend: T tokens, K top_k, H hidden, R ep ranks, S slots per source.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from fakes.flashinfer import set_profile
from fakes.flashinfer.comm import moe_a2a_kernels as kernels
from testbed.integrations.impl.fake_ep import ep_mapping_and_config
from testbed.scenario.reference import local_experts


@dataclass(frozen=True)
class Case:
    num_experts: int
    top_k: int
    hidden: int
    tokens_per_rank: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    seed: int = 0
    duplicate_routing: bool = False  # every lane of a token on one rank

    @property
    def rtm(self) -> int:
        return max(max(self.tokens_per_rank), 1)


def rank_inputs(case: Case, rank: int):
    """``(x_TH, ids_TK int32, w_TK fp32)`` of ``rank``."""
    g = torch.Generator().manual_seed(case.seed * 1000 + rank)
    T, K, E = case.tokens_per_rank[rank], case.top_k, case.num_experts
    x_TH = (torch.randn(T, case.hidden, generator=g) * 2).to(case.dtype)
    if case.duplicate_routing:
        ep = len(case.tokens_per_rank)
        owner = torch.randint(0, ep, (T, 1), generator=g)
        per = E // ep
        ids_TK = (owner * per + torch.randint(0, per, (T, K), generator=g)).to(torch.int32)
    else:
        ids_TK = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32) \
            if T else torch.empty(0, K, dtype=torch.int32)
    w_TK = torch.rand(T, K, generator=g)
    return x_TH, ids_TK, w_TK


def owner_of(expert: int, num_experts: int, ep: int) -> int:
    return next(r for r in range(ep) if expert in local_experts(num_experts, ep, r))


def expert_fn(x_H: torch.Tensor, expert: int) -> torch.Tensor:
    return x_H.float() * (expert + 1)


def reference_output(case: Case, rank: int) -> torch.Tensor:
    """Dense fp32: ``sum_k w[t,k] * expert_fn(x[t], ids[t,k])``."""
    x_TH, ids_TK, w_TK = rank_inputs(case, rank)
    out = torch.zeros(x_TH.shape, dtype=torch.float32)
    for t in range(x_TH.size(0)):
        for k in range(case.top_k):
            out[t] += w_TK[t, k] * expert_fn(x_TH[t], int(ids_TK[t, k]))
    return out


def expected_rows(case: Case, dst: int, src: int) -> list[bytes]:
    """Sorted bytes of the (x, ids, w) rows ``src`` must deliver to ``dst``."""
    ep = len(case.tokens_per_rank)
    x_TH, ids_TK, w_TK = rank_inputs(case, src)
    rows = []
    for t in range(x_TH.size(0)):
        if any(owner_of(int(e), case.num_experts, ep) == dst for e in ids_TK[t]):
            rows.append(_row_bytes(x_TH[t], ids_TK[t], w_TK[t]))
    return sorted(rows)


def _row_bytes(x_H, ids_K, w_K) -> bytes:
    return b"".join(bytes(t.contiguous().view(torch.uint8).tolist()) for t in (x_H, ids_K, w_K))


def round_trip(ctx, case: Case, profile: str = "0.7.2", slot_order: str = "shuffled"):
    """Dispatch ``[x, ids, w]``, run the weighted experts on what arrived, combine.

    Returns what arrived per source (sorted row bytes) and the combined ``[T, H]`` output."""
    set_profile(profile)
    kernels.SlotOrder.mode = slot_order
    kernels.SlotOrder.seed = ctx.seed
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    a2a = _make(ctx, profile, max_num_tokens=case.rtm, top_k=case.top_k,
                num_experts=case.num_experts, hidden=case.hidden)
    x_TH, ids_TK, w_TK = rank_inputs(case, me)
    S = case.rtm
    recv_x, recv_ids, recv_w = a2a.dispatch(ids_TK, [x_TH, ids_TK, w_TK], S,
                                            invalid_token_expert_id=-1, expert_id_payload_index=1)
    arrived = {}
    out_RSH = torch.zeros(R, S, case.hidden, dtype=case.dtype)
    lo = sum(experts_on(case.num_experts, R, r) for r in range(me))
    hi = lo + experts_on(case.num_experts, R, me)
    for src in range(R):
        n = int((recv_ids[src, :, 0] != -1).sum())
        assert bool((recv_ids[src, n:] == -1).all()), "sanitize left stale ids past the count"
        arrived[src] = sorted(_row_bytes(recv_x[src, i], recv_ids[src, i], recv_w[src, i]) for i in range(n))
        for i in range(n):
            acc = torch.zeros(case.hidden)
            for k in range(case.top_k):
                e = int(recv_ids[src, i, k])
                if lo <= e < hi:
                    acc += recv_w[src, i, k] * expert_fn(recv_x[src, i], e)
            out_RSH[src, i] = acc.to(case.dtype)
    out_TH = a2a.combine(out_RSH, S)
    return {"arrived": arrived, "out": out_TH}


def experts_on(num_experts: int, ep: int, rank: int) -> int:
    return len(local_experts(num_experts, ep, rank))


def _make(ctx, profile, *, max_num_tokens=4, top_k=2, num_experts=4, hidden=16,
          workspace_size_per_rank=None, **kw):
    set_profile(profile)
    from fakes.flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll

    mapping, config = ep_mapping_and_config(ctx)
    a2a = MoeAlltoAll(mapping, max_num_tokens, top_k, num_experts,
                      workspace_size_per_rank=workspace_size_per_rank,
                      hidden_size=None if workspace_size_per_rank else hidden,
                      mnnvl_config=config, **kw)
    # Before 0.7.x MoeAlltoAll does not barrier after zeroing its row: its caller must.
    dist.barrier(group=ctx.groups["ep"])
    return a2a


def _ids(T, K, E, rank):
    return ((torch.arange(T * K).view(T, K) + rank) % E).to(torch.int32)


def trigger(ctx, what: str, profile: str = "0.7.2"):
    """Provoke one failure of the fake; return ``(exception type name, message)`` or None."""
    me, T, K, H = ctx.coords.ep_rank, 3, 2, 16
    x = torch.randn(T, H, dtype=torch.bfloat16)
    ids = _ids(T, K, 4, me)
    try:
        if what == "seed001_overflow":
            # Sized for an nvfp4 layer (x H/2 + scales H/16 + ids + weights), then a bf16 layer.
            H = 256
            set_profile(profile)
            from fakes.flashinfer.comm.trtllm_moe_alltoall import moe_a2a_get_workspace_size_per_rank
            size = moe_a2a_get_workspace_size_per_rank(
                ctx.layout.ep_size, 8, H // 2 + H // 16 + 2 * K * 4, H * 2)
            a2a = _make(ctx, profile, max_num_tokens=8, workspace_size_per_rank=size)
            x = torch.randn(T, H, dtype=torch.bfloat16)
            recv = a2a.dispatch(ids, [x, ids, torch.rand(T, K)], 8)
            a2a.combine(torch.zeros(recv[0].shape, dtype=torch.bfloat16), 8)
        elif what == "dispatch_twice":
            a2a = _make(ctx, profile)
            a2a.dispatch(ids, [x], 4)
            a2a.dispatch(ids, [x], 4)
        elif what == "combine_before_dispatch":
            _make(ctx, profile).combine(torch.zeros(ctx.layout.ep_size, 4, H, dtype=torch.bfloat16), 4)
        elif what == "rtm_exceeds_max":
            _make(ctx, profile).dispatch(ids, [x], 5)
        elif what == "rtm_differs":  # each rank its own count, as SGLang without DP attention
            _make(ctx, profile).dispatch(ids[:2 + me], [x[:2 + me]], 2 + me)
        elif what == "rtm_differs_at_combine":  # the same at dispatch, rank 1 combines with one more
            a2a = _make(ctx, profile)
            recv = a2a.dispatch(ids[:2], [x[:2]], 3)
            a2a.combine(torch.zeros(ctx.layout.ep_size, 3 + me, recv[0].size(-1), dtype=torch.bfloat16), 3 + me)
        elif what == "ids_int64":
            _make(ctx, profile).dispatch(ids.long(), [x], 4)
        elif what == "ids_wrong_top_k":
            _make(ctx, profile).dispatch(ids[:, :1].contiguous(), [x], 4)
        elif what == "five_payloads":
            _make(ctx, profile, workspace_size_per_rank=1 << 16).dispatch(ids, [x] * 5, 4)
        elif what == "misaligned_payloads":
            _make(ctx, profile).dispatch(ids, [torch.zeros(T, 3, dtype=torch.uint8), torch.zeros(T, 4)], 3)
        elif what == "experts_not_divisible":
            _make(ctx, profile, num_experts=5).dispatch(ids, [x], 4)
        elif what == "workspace_too_small":
            # aux is 1152 bytes for ep 2 / 4 tokens; x needs 2 * 4 * 16 * 2 = 256 more
            _make(ctx, profile, workspace_size_per_rank=1300).dispatch(ids, [x], 4)
        elif what == "output_not_contiguous":
            a2a = _make(ctx, profile)
            recv = a2a.dispatch(ids, [x], 4)
            a2a.combine(recv[0].clone(), 4, output=torch.zeros(H, T, dtype=torch.bfloat16).t())
        elif what == "payload_not_in_workspace":
            a2a = _make(ctx, profile)
            recv = a2a.dispatch(ids, [x], 4)
            a2a.combine(recv[0].clone(), 4, payload_in_workspace=True)
        elif what == "ids_out_of_range":
            _make(ctx, profile).dispatch(ids + 4, [x], 4)
        elif what == "padded_row_minus_one":  # SGLang's -1 ids of a padded row: the kernel's division sends it to rank 0
            ids[-1] = -1
            recv = _make(ctx, profile).dispatch(ids, [x, ids], 4)
            got_RTK = recv[1][:, :T]
            padded_from = [r for r in range(ctx.layout.ep_size) if bool((got_RTK[r] == -1).all(-1).any())]
            if padded_from != (list(range(ctx.layout.ep_size)) if me == 0 else []):
                raise AssertionError(f"rank {me} received -1 rows from ranks {padded_from}")
        elif what == "tokens_exceed_rtm":
            _make(ctx, profile).dispatch(ids, [x], 2)
        elif what == "top_k_zero":
            _make(ctx, profile, top_k=0)
        elif what.startswith("top_k_"):  # top_k_<K>: a top_k the kernels may lack
            k = int(what.rsplit("_", 1)[1])
            _make(ctx, profile, top_k=k).dispatch(_ids(T, k, 4, me), [x], 4)
        elif what == "combine_fp8_payload":  # fp8 combine payloads from 0.6.14 on
            a2a = _make(ctx, profile)
            recv = a2a.dispatch(ids, [x], 4)
            a2a.combine(recv[0].to(torch.float8_e4m3fn), 4)
        elif what == "combine_low_precision_fp32":  # accepted: the output is bf16
            a2a = _make(ctx, profile, workspace_size_per_rank=1 << 16)  # room for fp32 rows
            recv = a2a.dispatch(ids, [x.float()], 4)
            out = a2a.combine(recv[0], 4, use_low_precision=True)
            assert out.dtype == torch.bfloat16 and out.shape == (T, H), (out.dtype, out.shape)
        elif what == "rank_mask_not_enabled":
            a2a = _make(ctx, profile)  # sets the profile, which decides what the module exports
            from fakes.flashinfer.comm.trtllm_moe_alltoall import moe_a2a_active_rank_mask
            a2a.dispatch(ids, [x], 4, active_rank_mask=moe_a2a_active_rank_mask([0, 1], 2))
        elif what == "dispatch_after_trap":  # rank 0 carries on after a wait ran out
            kernels.FLAG_TIMEOUT_S = 1.0
            a2a = _make(ctx, profile)
            if me == 0:
                try:
                    a2a.dispatch(ids, [x], 4)
                except kernels.CompletionTimeout:
                    pass
                a2a.dispatch(ids, [x], 4)
        elif what == "peer_never_dispatches":
            kernels.FLAG_TIMEOUT_S = 1.0
            a2a = _make(ctx, profile)
            if me == 0:
                a2a.dispatch(ids, [x], 4)
        else:
            raise ValueError(f"unknown trigger {what!r}")
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        kernels.FLAG_TIMEOUT_S = 30.0
    return None


def peer_raises_before_dispatch(ctx, late: tuple[int, ...] = (), flag_timeout_s: float = 30.0) -> None:
    """Rank 0 raises before its dispatch; the others dispatch and wait for its flags, those in
    ``late`` after a second of work (not a wait); ``flag_timeout_s``: when their waits trap."""
    import time

    a2a = _make(ctx, "0.7.2")
    if ctx.rank == 0:
        raise RuntimeError("rank 0 fails before its dispatch")
    if ctx.rank in late:
        time.sleep(1.0)  # busy elsewhere: no flag wait yet
    kernels.FLAG_TIMEOUT_S = flag_timeout_s
    try:
        me = ctx.coords.ep_rank
        a2a.dispatch(_ids(3, 2, 4, me), [torch.randn(3, 16, dtype=torch.bfloat16)], 4)
    finally:
        kernels.FLAG_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FuzzCase:
    ep: int
    num_experts: int
    top_k: int
    tokens_per_rank: tuple[int, ...]
    dtype: torch.dtype
    same_rank_lanes: bool  # all lanes of each token route to one rank
    seed: int


def fuzz_inputs(case: FuzzCase, rank: int):
    g = torch.Generator().manual_seed(case.seed * 131 + rank)
    T, K, E, R = case.tokens_per_rank[rank], case.top_k, case.num_experts, case.ep
    x_TH = (torch.randn(T, 8, generator=g) * 4).to(case.dtype)
    if case.same_rank_lanes:
        owner_T = torch.randint(0, R, (T,), generator=g)
        lo = torch.tensor([sum(experts_on(E, R, r) for r in range(o)) for o in owner_T.tolist()], dtype=torch.long)
        n = torch.tensor([experts_on(E, R, o) for o in owner_T.tolist()], dtype=torch.long)
        ids_TK = lo[:, None] + (torch.rand(T, K, generator=g) * n[:, None]).long()
    else:
        ids_TK = torch.randint(0, E, (T, K), generator=g)
    tag_TB = torch.randint(0, 256, (T, 3), generator=g, dtype=torch.uint8)
    return x_TH, ids_TK.to(torch.int32), tag_TB


def identity_round_trip(ctx, case: FuzzCase):
    """Experts write back each received row times this rank's local lanes for it."""
    set_profile("0.7.2")
    kernels.SlotOrder.mode = "shuffled"
    kernels.SlotOrder.seed = case.seed
    from fakes.flashinfer.comm.trtllm_moe_alltoall import moe_a2a_get_workspace_size_per_rank

    R, me = case.ep, ctx.coords.ep_rank
    S = max(max(case.tokens_per_rank), 1)
    item = torch.empty((), dtype=case.dtype).element_size()
    size = moe_a2a_get_workspace_size_per_rank(R, S, case.top_k * 4 + 8 * item + 3, 8 * item)
    a2a = _make(ctx, "0.7.2", max_num_tokens=S, top_k=case.top_k, num_experts=case.num_experts,
                workspace_size_per_rank=size)
    x_TH, ids_TK, tag_TB = fuzz_inputs(case, me)
    # largest element size first, as the kernel's alignment rule asks
    recv_ids, recv_x, recv_tag = a2a.dispatch(ids_TK, [ids_TK, x_TH, tag_TB], S,
                                              invalid_token_expert_id=-1, expert_id_payload_index=0)
    lo = sum(experts_on(case.num_experts, R, r) for r in range(me))
    hi = lo + experts_on(case.num_experts, R, me)
    local_RS = ((recv_ids >= lo) & (recv_ids < hi)).sum(-1)
    out_RSH = (recv_x.float() * local_RS[..., None]).to(case.dtype)
    arrived = {src: sorted(bytes(recv_tag[src, i].tolist()) for i in range(int((recv_ids[src, :, 0] != -1).sum())))
               for src in range(R)}
    return a2a.combine(out_RSH, S), arrived


def combine_variants(ctx, case: Case):
    """The same dispatch combined three ways: plain, into ``output=``, from the workspace view."""
    me, S = ctx.coords.ep_rank, case.rtm
    a2a = _make(ctx, "0.7.2", max_num_tokens=S, top_k=case.top_k, num_experts=case.num_experts,
                hidden=case.hidden)
    x_TH, ids_TK, w_TK = rank_inputs(case, me)
    results = []
    for mode in ("plain", "output", "in_workspace"):
        recv_x, recv_ids, recv_w = a2a.dispatch(ids_TK, [x_TH, ids_TK, w_TK], S)
        out_RSH = (recv_x.float() * 3).to(case.dtype)
        if mode == "plain":
            results.append(a2a.combine(out_RSH, S))
        elif mode == "output":
            out_TH = torch.full((x_TH.size(0), case.hidden), 7.0, dtype=case.dtype)
            got = a2a.combine(out_RSH, S, output=out_TH)
            assert got.data_ptr() == out_TH.data_ptr(), "output= was not filled in place"
            results.append(out_TH)
        else:
            view = a2a.get_combine_payload_tensor_in_workspace(S, case.hidden, case.dtype)
            view.copy_(out_RSH)
            results.append(a2a.combine(view, S, payload_in_workspace=True))
    return results


def eplb_and_mask(ctx, num_experts: int = 8):
    """EPLB stats gather, then a dispatch with rank 1 masked off."""
    R, me, T, K, H = ctx.layout.ep_size, ctx.coords.ep_rank, 4, 2, 8
    a2a = _make(ctx, "0.7.2", max_num_tokens=T, top_k=K, num_experts=num_experts, hidden=H,
                eplb_stats_num_experts=num_experts, enable_rank_mask=True)
    from fakes.flashinfer.comm.trtllm_moe_alltoall import moe_a2a_active_rank_mask
    ids_TK = _ids(T, K, num_experts, me)
    x_TH = torch.ones(T, H, dtype=torch.bfloat16) * (me + 1)
    stats_E = torch.arange(num_experts, dtype=torch.int32) + 100 * me
    everyone = moe_a2a_active_rank_mask(range(R), R)  # enable_rank_mask=True wants a mask every call
    a2a.dispatch(ids_TK, [x_TH], T, eplb_local_stats=stats_E, active_rank_mask=everyone)
    gathered = a2a.eplb_gathered_stats.clone()
    a2a.combine(torch.zeros(R, T, H, dtype=torch.bfloat16), T, active_rank_mask=everyone)
    if me == 1:
        return gathered, None  # the masked-off rank sits this round out
    mask = moe_a2a_active_rank_mask([r for r in range(R) if r != 1], R)
    recv_x, = a2a.dispatch(ids_TK, [x_TH], T, active_rank_mask=mask)
    out = a2a.combine((recv_x.float() * 2).to(torch.bfloat16), T, active_rank_mask=mask)
    return gathered, out


def two_sided_round_trip(ctx, case: Case):
    """MnnvlMoe: prepare, send x, weighted experts on the received rows, combine."""
    from fakes.flashinfer.comm.trtllm_alltoall import MnnvlMoe

    R, me, M, K = ctx.layout.ep_size, ctx.coords.ep_rank, case.rtm, case.top_k
    E = case.num_experts
    mapping, config = ep_mapping_and_config(ctx)
    workspace = MnnvlMoe.get_moe_workspaces(mapping, config)
    prepare_ws = MnnvlMoe.get_moe_prepare_workspace(mapping, config)
    x_TH, ids_TK, w_TK = rank_inputs(case, me)
    info, local_ids, local_w, _ = MnnvlMoe.mnnvl_moe_alltoallv_prepare_without_allgather(
        ids_TK, w_TK, None, prepare_ws, M, me, R, E, E, K)
    recv_x = MnnvlMoe.mnnvl_moe_alltoallv(x_TH, info, workspace, me, R)
    n = int(info.recv_rank_count_cumsum[-1])
    out = torch.zeros(recv_x.shape, dtype=case.dtype)
    for i in range(n):
        acc = torch.zeros(case.hidden)
        for k in range(K):
            e = int(local_ids[i, k])
            if e != E:  # slot_count marks experts owned elsewhere
                acc += local_w[i, k] * expert_fn(recv_x[i], e)
        out[i] = acc.to(case.dtype)
    stale = {"ids": bool((local_ids[n:] == E).all()), "x_nan": bool(recv_x[n:].float().isnan().all())}
    return MnnvlMoe.mnnvl_moe_alltoallv_combine(out, info, workspace, me, R, K, x_TH.size(0)), stale


def slot_order_probe(ctx, mode: str):
    """Per source, the token indices in the order they landed in this rank's slots."""
    set_profile("0.7.2")
    kernels.SlotOrder.mode = mode
    kernels.SlotOrder.seed = 5
    R, me, T = ctx.layout.ep_size, ctx.coords.ep_rank, 8
    a2a = _make(ctx, "0.7.2", max_num_tokens=T, top_k=1, num_experts=R * 4, hidden=4)
    ids = ((torch.arange(T) % R) * 4).to(torch.int32).view(T, 1)  # token t goes to rank t % R
    x = (torch.arange(T, dtype=torch.float32) + 100 * me).view(T, 1).repeat(1, 4)
    recv_ids, recv_x = a2a.dispatch(ids, [ids, x], T, invalid_token_expert_id=-1, expert_id_payload_index=0)
    try:
        return [[int(v) - 100 * src for v in recv_x[src, (recv_ids[src, :, 0] != -1), 0]] for src in range(R)]
    finally:
        kernels.SlotOrder.mode = "shuffled"


def moe_ep_round_trip(ctx, case: Case, backend: str, workspace_output: bool, profile: str):
    """``flashinfer.moe_ep`` of ``profile``: dispatch through ``create_communication``, the
    weighted experts on the received rows, combine. Returns the combined ``[T, H]`` output and
    how many rows arrived with a token (every other row carries the invalid id in every slot)."""
    set_profile(profile)
    from fakes.flashinfer import moe_ep

    R, me, S, E = ctx.layout.ep_size, ctx.coords.ep_rank, case.rtm, case.num_experts
    bootstrap = moe_ep.BootstrapConfig(world_size=R, rank=me, process_group=ctx.groups["ep"])
    params = moe_ep.MoEEpCommParams(num_experts=E, top_k=case.top_k, max_tokens_per_rank=S,
                                    hidden_size=case.hidden, dtype=case.dtype)
    # The one-sided backend builds its own communicator over the bootstrap's group (its
    # default); the two-sided one is handed the testbed's.
    config = (moe_ep.NVLinkOneSidedConfig() if backend == "nvlink_one_sided"
              else moe_ep.NVLinkTwoSidedConfig(comm_backend=ep_mapping_and_config(ctx)[1].comm_backend))
    comm = moe_ep.create_communication(bootstrap, params, config)
    x_TH, ids_TK, w_TK = rank_inputs(case, me)
    step = {"max_tokens_per_rank" if profile == "0.7.2" else "runtime_max_tokens_per_rank": S}
    got = comm.dispatch(x_TH, ids_TK, w_TK, **step)
    assert got.hidden_states.shape == (R * S, case.hidden) and got.tokens_per_rank == S
    out_NH = comm.get_combine_input_buffer(case.dtype) if workspace_output else None
    if out_NH is None:
        out_NH = torch.zeros(R * S, case.hidden, dtype=case.dtype)
    local = set(local_experts(E, R, me))
    with_token = 0
    for i in range(R * S):
        ids_K = got.topk_ids[i].tolist()
        if all(e == params.invalid_expert_id for e in ids_K):
            out_NH[i] = 0
            continue
        with_token += 1
        acc = torch.zeros(case.hidden)
        for k, e in enumerate(ids_K):
            if e in local:
                acc += got.topk_weights[i, k].float() * expert_fn(got.hidden_states[i], e)
        out_NH[i] = acc.to(case.dtype)
    out_TH = comm.combine(out_NH)
    comm.destroy()
    return out_TH, with_token


def targets_of(case: Case, dst: int) -> int:
    """How many tokens of all ranks have at least one expert on ``dst``."""
    R = len(case.tokens_per_rank)
    return sum(len(expected_rows(case, dst, src)) for src in range(R))


def trigger_moe_ep(ctx, what: str):
    """Provoke one failure of 0.7.4's fake ``moe_ep`` one-sided backend; return
    ``(exception type name, message)`` or None."""
    set_profile("0.7.4")
    from fakes.flashinfer import moe_ep

    me, T, K, H, R = ctx.coords.ep_rank, 3, 2, 16, ctx.layout.ep_size
    x = torch.randn(T, H, dtype=torch.bfloat16)
    ids, weights = _ids(T, K, 4, me), torch.rand(T, K)
    bootstrap = moe_ep.BootstrapConfig(world_size=R, rank=me, process_group=ctx.groups["ep"])

    def make(top_k=K, num_experts=4, **config):
        params = moe_ep.MoEEpCommParams(num_experts=num_experts, top_k=top_k, max_tokens_per_rank=4, hidden_size=H)
        return moe_ep.create_communication(bootstrap, params, moe_ep.NVLinkOneSidedConfig(**config))

    try:
        if what == "runtime_over_capacity":
            make().dispatch(x, ids, weights, runtime_max_tokens_per_rank=5)
        elif what == "old_keyword":
            make().dispatch(x, ids, weights, max_tokens_per_rank=4)
        elif what == "rtm_differs":
            make().dispatch(x[:2 + me], ids[:2 + me], weights[:2 + me], runtime_max_tokens_per_rank=2 + me)
        elif what == "top_k_5":
            make(top_k=5, num_experts=8)
        elif what == "experts_not_divisible":
            make(num_experts=5)
        elif what == "lamport_and_cft":
            make(lamport=True, cft=True)
        elif what == "timeout_not_int":
            make(timeout_sec=True)
        elif what == "interleaved_rounds":  # two layers of one layout share the workspace
            first, second = make(), make()
            first.dispatch(x, ids, weights)
            second.dispatch(x, ids, weights)
        elif what == "after_destroy":
            comm = make()
            comm.destroy()
            comm.dispatch(x, ids, weights)
        elif what == "unaligned_payload":  # ids of tokens 1.. start 8 bytes into the tensor
            make().dispatch(x[1:], ids[1:], weights[1:])
        elif what == "combine_region_overflow":
            comm = make()
            comm.dispatch(x, ids, weights)
            comm.get_combine_input_buffer(torch.float64)
        elif what == "dispatch_after_trap":  # rank 0 carries on after a wait ran out
            comm = make(timeout_sec=1)
            if me == 0:
                try:
                    comm.dispatch(x, ids, weights)
                except kernels.CompletionTimeout:
                    pass
                comm.dispatch(x, ids, weights)
        elif what == "output_not_contiguous":
            comm = make()
            got = comm.dispatch(x, ids, weights)
            comm.combine(got.hidden_states, output=torch.zeros(H, T, dtype=torch.bfloat16).t())
        elif what == "stats_not_contiguous":
            make(eplb_stats_num_experts=4).dispatch(x, ids, weights, eplb_local_stats=torch.zeros(8, dtype=torch.int32)[::2])
        elif what == "mask_int64":
            comm = make(enable_rank_mask=True)
            comm.dispatch(x, ids, weights, active_rank_mask=comm.active_rank_mask(range(R)).view(torch.int64))
        elif what == "dispatch_while_checkpointed":  # checkpoint_prepare without its restore
            comm = make()
            comm.checkpoint_prepare()
            try:
                comm.dispatch(x, ids, weights)
            finally:
                try:  # the context is dead: a restore cannot bring the rank back
                    comm.checkpoint_restore(ep_mapping_and_config(ctx)[1].comm_backend)
                except RuntimeError as e:
                    assert "a kernel trapped earlier" in str(e), e
                else:
                    raise AssertionError("checkpoint_restore worked after a trap")
        elif what == "invalid_ids_route_nowhere":  # 0.7.4's kernel skips ids outside [0, E)
            comm = make()
            bad = ids.clone()
            bad[0, 0], bad[1, 1] = -1, 4  # 4 == num_experts
            got = comm.dispatch(x, bad, None)
            out = comm.combine(got.hidden_states)  # identity experts: combine reads only rows tokens went to
            owners = [len({e // 2 for e in row if 0 <= e < 4}) for row in bad.tolist()]
            torch.testing.assert_close(out.float(), x.float() * torch.tensor(owners, dtype=torch.float32)[:, None],
                                       rtol=2e-2, atol=2e-2)
        elif what == "top_k_3":
            comm = make(top_k=3)
            got = comm.dispatch(x, _ids(T, 3, 4, me), torch.rand(T, 3))
            comm.combine(torch.zeros_like(got.hidden_states))
        else:
            raise ValueError(f"unknown trigger {what!r}")
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def rank_mask_beyond_64(ctx, dead: int):
    """0.7.4 at more than 64 EP ranks: a rank mask whose second word marks rank ``dead``
    inactive. The live ranks run one round with identity experts; returns, per live rank, its
    combined ``[T, H]`` output and each token's number of distinct live target ranks (what
    the output must be, times the token), or None on the dead rank."""
    set_profile("0.7.4")
    from fakes.flashinfer import moe_ep

    R, me, T, K, H = ctx.layout.ep_size, ctx.coords.ep_rank, 3, 4, 16
    E = 2 * R
    bootstrap = moe_ep.BootstrapConfig(world_size=R, rank=me, process_group=ctx.groups["ep"])
    params = moe_ep.MoEEpCommParams(num_experts=E, top_k=K, max_tokens_per_rank=T, hidden_size=H)
    comm = moe_ep.create_communication(bootstrap, params, moe_ep.NVLinkOneSidedConfig(enable_rank_mask=True))
    if me == dead:
        return None
    mask = comm.active_rank_mask([r for r in range(R) if r != dead])
    g = torch.Generator().manual_seed(me)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    # lane 0 on the dead rank's experts for token 0, the others anywhere
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    ids[0, 0] = 2 * dead
    got = comm.dispatch(x, ids, None, active_rank_mask=mask)
    live = got.topk_ids[:, 0] != params.invalid_expert_id
    out_NH = torch.where(live[:, None], got.hidden_states, torch.zeros_like(got.hidden_states))
    out = comm.combine(out_NH, active_rank_mask=mask)
    owners = (ids.long() // 2).tolist()
    return out, [len({o for o in row if o != dead}) for row in owners]
