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

from testbed.cluster.pool import ScenarioTimeoutError


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


def unexpected(fault: str, layout, error) -> str | None:
    """None when ``error`` (a :class:`ScenarioError`) is the failure ``fault`` must cause,
    else what is wrong with it: a fault is caught only when it fails the way it should."""
    reports = error.reports
    if fault in ("crash", "sigkill"):
        status, text = ("raised", "InjectedFault") if fault == "crash" else ("died", "SIGKILL")
        rep = reports.get(0)
        if rep is None or rep.status != status or text not in rep.summary:
            return f"rank 0 should have {status} ({text}); it is {rep.status if rep else 'missing'}"
        return None
    stuck = error.ranks("stuck")
    if fault == "stall":
        if not isinstance(error, ScenarioTimeoutError) or 0 not in stuck:
            return f"rank 0 should be stuck at the timeout; stuck: {stuck}"
        if "stall_forever" not in reports[0].detail:
            return "rank 0's stack does not show stall_forever"
        return None
    stage0 = [r for r in range(layout.world_size) if layout.coords(r).pp_rank == 0]
    if not isinstance(error, ScenarioTimeoutError) or stuck != stage0:
        return f"the stage-0 ranks {stage0} should be the stuck ones; stuck: {stuck}"
    bad = [r for r in stuck if "rebuild_barriers" not in reports[r].detail or "barrier" not in reports[r].detail]
    if bad:
        return f"rank(s) {bad} are not stuck in rebuild_barriers' barrier"
    return None
