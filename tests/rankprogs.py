"""Rank programs used by the tests (module level, so the rank processes can import them)."""

from __future__ import annotations

import os
import threading

import torch
import torch.distributed as dist

from testbed.cluster.faults import stall_forever


def pid(ctx) -> int:
    return os.getpid()


def unpicklable_result(ctx):
    return threading.Lock()


def one_sided_puts(ctx) -> list[list[int]]:
    """Every rank writes a 16-byte tag into every EP peer's row, then reads its own row."""
    n, me = ctx.layout.ep_size, ctx.coords.ep_rank
    ws_RB = ctx.arena.tensor("ws", (n, 16 * n), torch.uint8, group=ctx.groups["ep"])
    for peer in range(n):
        ws_RB[peer, me * 16:(me + 1) * 16] = (me * n + peer) % 256
    dist.barrier(group=ctx.groups["ep"])
    return ws_RB[me].view(n, 16)[:, 0].tolist()


def create_then_raise(ctx) -> None:
    ctx.arena.create(f"seg{ctx.rank}", 4096)
    dist.barrier()
    if ctx.rank == 1:
        raise RuntimeError(f"created {ctx.arena.path(f'seg{ctx.rank}')}")
    dist.barrier()


def create_then_die(ctx) -> None:
    ctx.arena.create(f"seg{ctx.rank}", 4096)
    dist.barrier()
    if ctx.rank == 1:
        os.kill(os.getpid(), 9)
    dist.barrier()


def hold_segment(ctx) -> None:
    """Create a segment, say so on stdout, then never return (for parent-death tests)."""
    ctx.arena.create(f"seg{ctx.rank}", 4096)
    # One write() below PIPE_BUF is atomic; print() may split text and newline, and the
    # two ranks' lines then interleave.
    os.write(1, f"READY {ctx.rank} {os.getpid()} {ctx.arena.path(f'seg{ctx.rank}')}\n".encode())
    stall_forever()


def hold_gil(ctx, rank: int) -> None:
    """``rank`` spins inside the regex engine, which never releases the GIL."""
    import re

    if ctx.rank == rank:
        re.match(r"(a+)+$", "a" * 64 + "b")
    dist.barrier()


def world_mark(ctx, raise_on: int | None = None) -> str:
    """Check an all-reduce on every group of the layout, then return a mark of this
    process's default group, its store's file and the group object: the same mark in a later
    scenario means the same world was kept. ``raise_on``: the rank that raises after the checks."""
    for kind, group in ctx.groups.items():
        total = torch.tensor([ctx.rank])
        dist.all_reduce(total, group=group)
        assert int(total) == sum(ctx.group_ranks[kind]), (kind, int(total), ctx.group_ranks[kind])
    store = dist.distributed_c10d._get_default_store()
    while not hasattr(store, "path"):
        store = store.underlying_store
    if ctx.rank == raise_on:
        raise RuntimeError(f"rank {ctx.rank} fails on purpose")
    return f"{store.path}:{id(dist.group.WORLD)}"
