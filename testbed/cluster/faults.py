"""Fault injectors: rank programs that fail in the ways real deployments fail.

Each takes the faulty rank(s) as arguments; the other ranks do what a healthy rank does
(wait for their peers in a collective), so the watchdog sees the real symptom: a crash,
a hang behind a crashed peer, or a deadlock.
"""

from __future__ import annotations

import os
import signal
import threading

import torch.distributed as dist


class InjectedFault(RuntimeError):
    """Raised on purpose by a fault injector."""


def crash(ctx, ranks: tuple[int, ...] = (0,)) -> int:
    """``ranks`` raise :class:`InjectedFault`; the others wait on a world barrier."""
    if ctx.rank in ranks:
        raise InjectedFault(f"injected crash on rank {ctx.rank}")
    dist.barrier()
    return ctx.rank


def stall_forever() -> None:
    """Block this thread for good, the way a rank stuck on a device wait does."""
    threading.Event().wait()


def stall(ctx, ranks: tuple[int, ...] = (0,)) -> int:
    """``ranks`` never return (stuck in :func:`stall_forever`); the others wait on a world barrier."""
    if ctx.rank in ranks:
        stall_forever()
    dist.barrier()
    return ctx.rank


def sigkill(ctx, ranks: tuple[int, ...] = (0,)) -> int:
    """``ranks`` are SIGKILLed (no traceback, no cleanup); the others wait on a world barrier."""
    if ctx.rank in ranks:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return ctx.rank


def rebuild_barriers(ctx, rebuilds_per_stage: tuple[int, ...], scope: str = "ep") -> int:
    """Each pipeline stage rebuilds its EP workspace a different number of times and
    barriers after every rebuild, on the ``scope`` group.

    With ``scope="ep"`` each stage's barriers only involve that stage: it completes.
    With ``scope="world"`` a stage that rebuilds more often waits for ranks of the other
    stage that will never arrive: the pipeline-parallel start-up deadlock of seed 001.
    """
    if len(rebuilds_per_stage) != ctx.layout.pp:
        raise ValueError(
            f"rebuilds_per_stage has {len(rebuilds_per_stage)} entries; the layout has "
            f"pp={ctx.layout.pp} stages"
        )
    if scope not in ("ep", "world"):
        raise ValueError(f"scope must be 'ep' or 'world', got {scope!r}")
    for _ in range(rebuilds_per_stage[ctx.coords.pp_rank]):
        dist.barrier(group=ctx.groups[scope])
    return rebuilds_per_stage[ctx.coords.pp_rank]
