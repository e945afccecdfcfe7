"""A2a: bytes per second per rank of the fake's dispatch + combine, against gloo and memcpy.

Each rank dispatches ``[x bf16 [T, H], ids int32 [T, K], weights fp32 [T, K]]`` and combines
``[R, T, H]`` bf16 expert outputs resident in its combine region (``payload_in_workspace``). The bytes moved per rank are the payload bytes of every (token,
unique target rank) pair plus the ``H * 2`` bytes per pair the combine gathers. The same
byte counts then go through two gloo ``all_to_all_single`` calls (dispatch and combine
splits), and through a single-thread ``memcpy`` on rank 0 while the others wait; then every
rank copies its bytes once at the same time (``memcpy_all_ranks_gbps``: the ceiling of any
data path when ranks share the cores).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from testbed.cluster.pool import RankPool
from testbed.cluster.layout import ParallelLayout


def add_arguments(parser) -> None:
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--iters", type=int, default=10)


def _timed(fn, iters: int, group) -> float:
    fn()  # warm-up
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier(group=group)
    return (time.perf_counter() - started) / iters


def bench_rank(ctx, hidden: int, tokens: int, top_k: int, experts: int, iters: int) -> dict:
    from fakes.flashinfer import set_profile
    from fakes.flashinfer.comm.moe_a2a_kernels import expert_to_rank
    from testbed.integrations.impl.fake_ep import ep_mapping_and_config

    set_profile("0.7.2")
    from fakes.flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll

    group = ctx.groups["ep"]
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    g = torch.Generator().manual_seed(me)
    x_TH = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    ids_TK = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    w_TK = torch.rand(tokens, top_k, generator=g)
    mapping, config = ep_mapping_and_config(ctx)
    a2a = MoeAlltoAll(mapping, tokens, top_k, experts, hidden_size=hidden, mnnvl_config=config)

    def fake_round():
        # The experts' output resident in the combine region (written there by the experts,
        # not by the all-to-all): combine reads the peers' rows once, no staging copy.
        a2a.dispatch(ids_TK, [x_TH, ids_TK, w_TK], tokens)
        a2a.combine(a2a.get_combine_payload_tensor_in_workspace(tokens, hidden, torch.bfloat16), tokens,
                    payload_in_workspace=True)

    fake_s = _timed(fake_round, iters, group)

    # Per-target pair counts: one send per unique target rank per token.
    target_TK = expert_to_rank(ids_TK, experts, R)
    pairs_R = torch.stack([(target_TK == r).any(1).sum() for r in range(R)])
    dispatch_bpt = hidden * 2 + top_k * 8
    combine_bpt = hidden * 2
    moved = int(pairs_R.sum()) * (dispatch_bpt + combine_bpt)

    send_d = (pairs_R * dispatch_bpt).tolist()
    recv_d = torch.empty(R, dtype=torch.int64)
    dist.all_to_all_single(recv_d, torch.tensor(send_d), group=group)
    send_c, recv_c = (pairs_R * combine_bpt).tolist(), (recv_d // dispatch_bpt * combine_bpt).tolist()
    recv_d = recv_d.tolist()
    buf_send_d, buf_recv_d = torch.empty(sum(send_d), dtype=torch.uint8), torch.empty(sum(recv_d), dtype=torch.uint8)
    buf_send_c, buf_recv_c = torch.empty(sum(recv_c), dtype=torch.uint8), torch.empty(sum(send_c), dtype=torch.uint8)

    def gloo_round():
        dist.all_to_all_single(buf_recv_d, buf_send_d, recv_d, send_d, group=group)
        dist.all_to_all_single(buf_recv_c, buf_send_c, send_c, recv_c, group=group)

    gloo_s = _timed(gloo_round, iters, group)

    src, dst = torch.ones(moved, dtype=torch.uint8), torch.empty(moved, dtype=torch.uint8)
    memcpy_s = None
    if me == 0:
        dst.copy_(src)
        started = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src)
        memcpy_s = (time.perf_counter() - started) / iters
    dist.barrier(group=group)
    # The ceiling of any data path here: every rank copying its bytes once, at the same time.
    all_ranks_memcpy_s = _timed(lambda: dst.copy_(src), iters, group)
    return {"moved": moved, "fake_s": fake_s, "gloo_s": gloo_s, "memcpy_s": memcpy_s,
            "all_ranks_memcpy_s": all_ranks_memcpy_s}


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def run(args) -> dict:
    layout = ParallelLayout(args.ranks, dp=args.ranks)
    with RankPool() as pool:
        per_rank = pool.run(
            bench_rank, layout,
            (args.hidden, args.tokens, args.top_k, args.experts, args.iters),
            timeout_s=600, name="bench-a2a",
        )
    gbps = lambda key: sum(r["moved"] / r[key] for r in per_rank) / len(per_rank) / 1e9  # noqa: E731
    fake, gloo = gbps("fake_s"), gbps("gloo_s")
    memcpy = per_rank[0]["moved"] / per_rank[0]["memcpy_s"] / 1e9
    return {
        "bench": "a2a",
        "ranks": args.ranks, "hidden": args.hidden, "tokens_per_rank": args.tokens,
        "top_k": args.top_k, "experts": args.experts,
        "bytes_per_rank": round(sum(r["moved"] for r in per_rank) / len(per_rank)),
        "fake_gbps": _sig(fake),
        "gloo_gbps": _sig(gloo),
        "memcpy_gbps": _sig(memcpy),
        "fake_vs_gloo": _sig(fake / gloo),
        "fake_vs_memcpy": _sig(fake / memcpy),
        "memcpy_all_ranks_gbps": _sig(gbps("all_ranks_memcpy_s")),
        # The goal (issue 10): >= 0.5 of every rank copying its bytes once at the same time.
        "fake_vs_ceiling": _sig(fake / gbps("all_ranks_memcpy_s")),
        "cpus": os.cpu_count(),
    }
