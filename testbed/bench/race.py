"""Race: is a combine still reading when the next, larger dispatch overwrites what it reads?

FlashInfer's one-sided protocol waits for peers at the start of dispatch's and combine's
reads, never after combine. Each trial, on a workspace built for an nvfp4 layer and then a
bf16 one (``impl``'s manager), every rank dispatches the nvfp4-sized round, combines, and at
once (``--between-rounds nothing``, no host synchronization) dispatches the bf16 round, whose
payload region reaches into the first round's combine region; EP rank 1 runs its first
combine late (``--stall``): on GPUs ``torch.cuda._sleep(--sleep-cycles)`` queued before it on
its stream, on the fake a combine that reads only after rank 0 wrote the next dispatch.
The two differ: the real combine kernel signals its peers that it is ready and then reads, and
a sleep queued before it delays both, so its peers wait for it and the window between its
signal and its reads stays as narrow as the kernels make it; the fake's stall sits in that
window. A GPU run without corruption therefore says that window did not open, not that the
protocol orders the rounds.
``--between-rounds collective`` puts vLLM's per-forward host collective between the rounds
(on GPUs it does not order device work; on the fake it would wait forever for the stalled
rank, so it is refused there). The first round's output is checked on every rank against
``sum_k w * (e + 1)`` (the experts scale ones by ``e + 1``). Prints ``{"bench": "race",
"trials", "corrupted", "clean", "max_error", ...}``: a trial is corrupted when any rank's
first-round output is off.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.distributed as dist

from testbed.bench.one_sided import add_backend_arguments, check_backend, rank_manager
from testbed.cluster.layout import ParallelLayout
from testbed.cluster.pool import RankPool
from testbed.scenario.reference import local_experts

RTOL = 2e-2  # expert outputs travel as bf16
INVALID_ID = -1


def add_arguments(parser) -> None:
    add_backend_arguments(parser)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=16, help="tokens per rank, both rounds")
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--stall", action=argparse.BooleanOptionalAction, default=True,
                        help="EP rank 1 runs its first combine late (default: on; --no-stall: the control)")
    parser.add_argument("--between-rounds", choices=("nothing", "collective"), default="nothing")
    parser.add_argument("--sleep-cycles", type=int, default=10_000_000, help="GPU: the stall, in clock cycles")


def race_rank(ctx, backend: str, profile: str, hidden: int, tokens: int, top_k: int, trials: int, stall: bool,
              between_rounds: str, sleep_cycles: int) -> dict:
    device, manager = rank_manager(ctx, backend, profile)
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    experts = 4 * R
    mine = local_experts(experts, R, me)
    for x_bytes, sf_bytes in ((hidden // 2, hidden // 16), (2 * hidden, 0)):  # an nvfp4 layer, then a bf16 one
        manager.initialize(max_num_tokens=tokens, top_k=top_k, num_experts=experts, hidden_size=hidden,
                           x_bytes_per_token=x_bytes, x_sf_bytes_per_token=sf_bytes)
    a2a = manager.moe_alltoall
    corrupted, max_error = 0, 0.0
    try:
        for trial in range(trials):
            g = torch.Generator().manual_seed(trial * 1000 + me)
            ids_TK = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :top_k].to(torch.int32)
            w_TK = torch.rand(tokens, top_k, generator=g)
            x4_TB = torch.randint(0, 256, (tokens, hidden // 2), generator=g, dtype=torch.uint8)
            sf_TB = torch.randint(0, 256, (tokens, hidden // 16), generator=g, dtype=torch.uint8)
            x_TH = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
            ids, w, x4, sf, x = (t.to(device) for t in (ids_TK, w_TK, x4_TB, sf_TB, x_TH))

            _, _, recv_ids_RSK, recv_w_RSK = a2a.dispatch(ids, [x4, sf, ids, w], tokens,
                                                       invalid_token_expert_id=INVALID_ID, expert_id_payload_index=2)
            local_RSK = (recv_ids_RSK >= mine.start) & (recv_ids_RSK < mine.stop)
            scale_RS1 = torch.where(local_RSK, recv_w_RSK * (recv_ids_RSK.float() + 1), 0).sum(-1, keepdim=True)
            expert_out_RSH = scale_RS1.expand(-1, -1, hidden).to(torch.bfloat16).contiguous()
            if stall and me == 1:
                if device.type == "cuda":
                    torch.cuda._sleep(sleep_cycles)
                else:
                    from fakes.flashinfer.comm import moe_a2a_kernels

                    moe_a2a_kernels.Hooks.before_combine_read = moe_a2a_kernels.stall_until_next_dispatch(peer=0)
            first_TH = a2a.combine(expert_out_RSH, tokens)
            if between_rounds == "collective":
                dist.all_reduce(torch.zeros(1), group=ctx.groups["ep"])
            a2a.combine(a2a.dispatch(ids, [x, ids, w], tokens)[0], tokens)
            want_T = (w_TK * (ids_TK.float() + 1)).sum(1)
            err = float((first_TH.float().cpu() - want_T[:, None]).abs().max()) if tokens else 0.0
            tolerance = RTOL * max(1.0, float(want_T.abs().max())) if tokens else 0.0
            bad = torch.tensor([int(not err <= tolerance)])  # NaN is corrupted too
            dist.all_reduce(bad, group=ctx.groups["ep"])  # a trial is corrupted when any rank's output is
            corrupted += int(bad.item() > 0)
            max_error = max(max_error, err) if math.isfinite(err) else float("inf")
    finally:
        if backend == "fake":
            from fakes.flashinfer.comm import moe_a2a_kernels

            moe_a2a_kernels.Hooks.before_combine_read = None
        manager.cleanup()
    return {"corrupted": corrupted, "max_error": max_error}


def run(args) -> dict:
    for name in ("ranks", "hidden", "tokens", "top_k", "trials", "sleep_cycles"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    if args.ranks < 2:
        raise SystemExit("--ranks: the race needs >= 2 ranks (rank 1 runs late)")
    if args.hidden % 64:
        raise SystemExit(f"--hidden: a multiple of 64 (nvfp4's 9H/16 bytes per token must keep the ids 4-byte "
                         f"aligned), got {args.hidden}")
    check_backend(args)
    if args.backend == "fake" and args.stall and args.between_rounds == "collective":
        raise SystemExit("--between-rounds collective with --stall on the fake: the stalled rank waits for the "
                         "next dispatch, which the collective holds back (a deadlock, not a race); "
                         "use --no-stall, or a GPU")
    with RankPool() as pool:
        per_rank = pool.run(race_rank, ParallelLayout(args.ranks, dp=args.ranks),
                            (args.backend, args.profile, args.hidden, args.tokens, args.top_k, args.trials,
                             args.stall, args.between_rounds, args.sleep_cycles), timeout_s=600)
    corrupted = per_rank[0]["corrupted"]
    return {"bench": "race", "backend": args.backend, "ranks": args.ranks, "hidden": args.hidden,
            "tokens": args.tokens, "stall": args.stall, "between_rounds": args.between_rounds,
            "trials": args.trials, "corrupted": corrupted, "clean": args.trials - corrupted,
            "max_error": _json_number(max(r["max_error"] for r in per_rank))}


def _json_number(x: float) -> float | str:
    """``x`` rounded, or ``"non-finite"`` (JSON has no NaN or infinity)."""
    return round(x, 4) if math.isfinite(x) else "non-finite"
