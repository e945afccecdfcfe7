"""Combine: ``output=`` against combine + copy, workspace-resident expert output against separate.

Every rank builds ``impl``'s one-sided workspace for ``[x bf16 [T, H], ids int32 [T, K],
weights fp32 [T, K]]`` and, per round, dispatches (not timed) and combines ``[R, T, H]`` bf16
expert outputs (the rows that arrived: the experts' values do not change the time) one of
three ways, timed alone: ``copy`` (combine returns a tensor, copied into the layer's output),
``output`` (combine writes the output itself, ``output=``), ``resident`` (the expert output
already sits in the combine region, ``payload_in_workspace=True``, with ``output=`` where the
release takes it). Per variant the median over ``--iters`` rounds after ``--warmup``; the
slowest rank's median is reported, and whether every variant combined the same output. On
GPUs (``--backend flashinfer``) CUDA events time the combine on the rank's stream, queued
behind a short spin so that host launches are not timed; on the fake, the wall clock. Prints ``{"bench": "combine",
"copy_us", "output_us", "resident_us", "output_vs_copy", "resident_vs_separate", ...}``
(``output_us`` None where the release's combine has no ``output=``; ``resident_vs_separate``
against ``output`` there is one, else against ``copy``).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.distributed as dist

from testbed.bench.one_sided import add_backend_arguments, check_backend, rank_manager
from testbed.cluster.layout import ParallelLayout
from testbed.cluster.pool import RankPool

VARIANTS = ("copy", "output", "resident")


def add_arguments(parser) -> None:
    add_backend_arguments(parser)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)


def bench_rank(ctx, backend: str, profile: str, hidden: int, tokens: int, top_k: int, experts: int,
               iters: int, warmup: int) -> dict:
    device, manager = rank_manager(ctx, backend, profile)
    me = ctx.coords.ep_rank
    g = torch.Generator().manual_seed(me)
    x_TH = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16).to(device)
    ids_TK = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(torch.int32)
    ids_TK, w_TK = ids_TK.to(device), torch.rand(tokens, top_k, generator=g).to(device)
    manager.initialize(max_num_tokens=tokens, top_k=top_k, num_experts=experts, hidden_size=hidden,
                       x_bytes_per_token=2 * hidden, x_sf_bytes_per_token=0)
    a2a = manager.moe_alltoall
    out_TH = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=device)
    with_output = bool(manager.combine_supports_output)

    def combine(variant: str, payload_RSH: torch.Tensor) -> None:
        resident = {"payload_in_workspace": True} if variant == "resident" else {}
        if variant == "copy" or not with_output:
            out_TH.copy_(a2a.combine(payload_RSH, tokens, **resident))
        else:
            a2a.combine(payload_RSH, tokens, output=out_TH, **resident)

    medians, outputs = {}, {}
    try:
        for variant in VARIANTS:
            if variant == "output" and not with_output:
                medians[variant] = None
                continue
            times = []
            for i in range(warmup + iters):
                recv_x_RSH = a2a.dispatch(ids_TK, [x_TH, ids_TK, w_TK], tokens)[0]
                if variant == "resident":
                    payload = a2a.get_combine_payload_tensor_in_workspace(tokens, hidden, torch.bfloat16)
                    payload.copy_(recv_x_RSH)  # where the experts would have written it
                else:
                    payload = recv_x_RSH.clone()  # the experts' separate output
                seconds = _timed(functools.partial(combine, variant, payload), device, ctx.groups["ep"])
                if i >= warmup:
                    times.append(seconds)
            medians[variant] = statistics.median(times) * 1e6
            outputs[variant] = out_TH.float().cpu()
    finally:
        manager.cleanup()
    # Every variant combined the same rows: a path that is fast because it is wrong shows here.
    medians["outputs_agree"] = all(torch.equal(out, outputs["copy"]) for out in outputs.values())
    return medians


# About 1 ms of GPU spin before the timed kernels: the ranks' hosts line up at a barrier, then
# every launch of the timed region is queued before the GPU reaches it, so the events time
# the kernels (and their wait for the peers' kernels), not the host's launches.
_QUEUE_CYCLES = 2_000_000


def _timed(fn, device: torch.device, group) -> float:
    dist.barrier(group=group)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_QUEUE_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(args) -> dict:
    for name in ("ranks", "hidden", "tokens", "top_k", "experts", "iters"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.warmup == 0 and args.backend == "flashinfer":
        raise SystemExit(f"--warmup: must be >= 0 (>= 1 on GPUs: the first call loads kernels), got {args.warmup}")
    if args.top_k > args.experts or args.experts < args.ranks:
        raise SystemExit(f"--top-k {args.top_k}, --experts {args.experts}, --ranks {args.ranks}: "
                         "need top_k <= experts and experts >= ranks")
    check_backend(args)
    with RankPool() as pool:
        per_rank = pool.run(bench_rank, ParallelLayout(args.ranks, dp=args.ranks),
                            (args.backend, args.profile, args.hidden, args.tokens, args.top_k, args.experts,
                             args.iters, args.warmup), timeout_s=600)
    slowest = {v: max(r[v] for r in per_rank) if per_rank[0][v] is not None else None for v in VARIANTS}
    agree = all(r["outputs_agree"] for r in per_rank)
    return {"bench": "combine", "backend": args.backend, "ranks": args.ranks, "hidden": args.hidden,
            "tokens": args.tokens, "top_k": args.top_k, "experts": args.experts, "iters": args.iters,
            "warmup": args.warmup, "timer": "cuda events" if args.backend == "flashinfer" else "wall clock",
            **{f"{v}_us": round(t, 1) if t is not None else None for v, t in slowest.items()},
            "outputs_agree": agree, "output_vs_copy": _ratio(slowest["output"], slowest["copy"]),
            "resident_vs_separate": _ratio(slowest["resident"], slowest["output"] or slowest["copy"])}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None
