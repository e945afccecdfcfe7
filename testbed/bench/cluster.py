"""Cluster: per-scenario cost of the rank pool against a fresh spawn + init_process_group.

The spawn side is what PyTorch's own multi-process test case does for every test: start
the rank processes (each imports torch), rendezvous on a FileStore, run, tear down. The
pool side runs the same trivial scenario (an all-reduce and a barrier) through one warm
:class:`testbed.cluster.pool.RankPool`, which also builds every TP/DP/PP/EP group each time.
The pool's one-off start-up is reported apart (``pool_startup_s``).
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from testbed.cluster.pool import RankPool
from testbed.cluster.layout import ParallelLayout

SIZES = (2, 4)


def add_arguments(parser) -> None:
    parser.add_argument("--per-size", type=int, default=10, metavar="N",
                        help="scenarios per world size, for each of 2 and 4 ranks (default: %(default)s)")


def _trivial(group=None) -> float:
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    dist.barrier(group=group)
    return total.item()


def pool_rank(ctx) -> float:
    return _trivial()


def _spawned_rank(rank: int, world_size: int, store_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store_file}", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=60),
    )
    try:
        if _trivial() != world_size:
            raise RuntimeError(f"all_reduce gave the wrong sum on rank {rank}")
    finally:
        dist.destroy_process_group()


def _spawn_once(world_size: int, scratch: str, index: int) -> None:
    store_file = os.path.join(scratch, f"store-{index}")
    tmp.spawn(_spawned_rank, args=(world_size, store_file), nprocs=world_size, join=True)


def run(args) -> dict:
    if args.per_size < 1:
        raise SystemExit(f"--per-size must be >= 1, got {args.per_size}")
    order = [n for _ in range(args.per_size) for n in SIZES]

    started = time.perf_counter()
    with RankPool() as pool:
        pool.run(pool_rank, ParallelLayout(max(SIZES), dp=max(SIZES)))
        startup = time.perf_counter() - started
        started = time.perf_counter()
        for n in order:
            if pool.run(pool_rank, ParallelLayout(n, dp=n)) != [float(n)] * n:
                raise RuntimeError("pool scenario gave the wrong all_reduce sum")
        pool_s = (time.perf_counter() - started) / len(order)

    with tempfile.TemporaryDirectory(prefix="a2atb-bench-") as scratch:
        started = time.perf_counter()
        for i, n in enumerate(order):
            _spawn_once(n, scratch, i)
        spawn_s = (time.perf_counter() - started) / len(order)

    return {
        "bench": "cluster",
        "scenarios": len(order),
        "world_sizes": list(SIZES),
        "pool_s_per_scenario": round(pool_s, 4),
        "spawn_s_per_scenario": round(spawn_s, 4),
        "ratio": round(pool_s / spawn_s, 4),
        "pool_startup_s": round(startup, 3),
    }
