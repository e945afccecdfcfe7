"""Ranks a launcher started (``torchrun``), instead of the rank pool: rank, world size and the
rendezvous come from the environment, and this process is one rank.

``torchrun --standalone --nproc-per-node 2 -m testbed run --layout 2,1,2,1`` runs a scenario
this way; on a GB200 box ``torchrun --nnodes N --nproc-per-node G`` spans nodes. Each rank
joins the default group once (``env://``, gloo) and builds a scenario's groups on it as a
pool worker does; rank 0 receives every rank's result. A rank whose function raises exits
with the traceback, and the launcher stops the others (its own failure handling: there is no
pool here to collect stacks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional

from fakes.arena import scenario_prefix, sweep_orphans, unlink_prefix
from testbed.cluster.layout import ParallelLayout
from testbed.cluster.worker import rank_context

# What a launcher must set; torchrun also sets LOCAL_RANK, LOCAL_WORLD_SIZE and TORCHELASTIC_RUN_ID.
REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_GROUPS: dict = {}  # members -> process group, for the job's lifetime


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    run_id: str
    single_node: bool  # LOCAL_WORLD_SIZE == WORLD_SIZE (unknown without LOCAL_WORLD_SIZE: False)


def launch_env(environ: Optional[Mapping[str, str]] = None) -> Optional[LaunchEnv]:
    """This process's place in a launched job, or None when no launcher started it (neither
    ``RANK`` nor ``WORLD_SIZE`` set).

    Raises
    ------
    ValueError
        A launcher's variable is missing or malformed (names the variable and the rule).
    """
    env = os.environ if environ is None else environ
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise ValueError(f"launched rank: {', '.join(missing)} not set (a launcher such as torchrun sets "
                         f"{', '.join(REQUIRED)})")
    values = {}
    for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK"):
        text = env.get(name, env["RANK"] if name == "LOCAL_RANK" else "")
        if not text.isdecimal():
            raise ValueError(f"launched rank: {name}={text!r} must be a non-negative integer")
        values[name] = int(text)
    if values["WORLD_SIZE"] < 1 or values["RANK"] >= values["WORLD_SIZE"]:
        raise ValueError(f"launched rank: RANK={values['RANK']} must be in [0, WORLD_SIZE={values['WORLD_SIZE']})")
    if not 0 < values["MASTER_PORT"] < 65536:
        raise ValueError(f"launched rank: MASTER_PORT={values['MASTER_PORT']} must be a TCP port (1-65535)")
    return LaunchEnv(values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"], env["MASTER_ADDR"],
                     values["MASTER_PORT"], env.get("TORCHELASTIC_RUN_ID", "none"),
                     env.get("LOCAL_WORLD_SIZE") == env["WORLD_SIZE"])


def join(env: LaunchEnv, timeout_s: float, backend: str = "gloo") -> None:
    """Join the launched job's default group (``backend``, gloo by default; ``env://``), once
    per process; segments an earlier job left behind when its launcher died are removed first."""
    import torch
    import torch.distributed as dist

    sweep_orphans()
    torch.set_num_threads(1)
    if env.single_node:  # every rank here: gloo over loopback, as the pool's ranks
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method="env://", rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=timeout_s))


def leave() -> None:
    """Leave the launched job: its groups and the default group go."""
    import torch.distributed as dist

    _GROUPS.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def run_here(env: LaunchEnv, fn: Callable[..., Any], layout: ParallelLayout, args: tuple, *, timeout_s: float,
             seed: int, name: str, index: int, after: Optional[Callable[[Any], Any]] = None) -> Optional[list]:
    """``fn(ctx, *args)`` as this rank of ``layout`` (its world must be the job's), then the
    scenario's cleanups, then ``after(result)`` on this rank; returns every rank's
    ``(outcome, leaks)`` on rank 0 (in rank order), None on the others. ``leaks`` are the
    scenario's shared-memory segments still there once every rank finished (then removed).
    ``index`` numbers the job's scenarios (their shared-memory names)."""
    import torch.distributed as dist

    if layout.world_size != env.world_size:
        raise ValueError(f"layout {layout} has {layout.world_size} ranks but the launched job has "
                         f"WORLD_SIZE={env.world_size}")
    # Every local rank has the same parent (the launcher's agent); the pools' orphan sweep
    # removes the segments of a crashed job once the agent is gone.
    prefix = scenario_prefix(os.getppid(), f"tr{env.master_port}x{index}")
    ctx = rank_context(name, layout, env.rank, timedelta(seconds=timeout_s), prefix, seed, _GROUPS)
    try:
        result = fn(ctx, *args)
    finally:
        try:
            for cleanup in reversed(ctx._cleanups):
                cleanup()
        finally:
            ctx.arena.close()
    dist.barrier()  # every rank done with the scenario's segments
    leaks = unlink_prefix(prefix) if env.local_rank == 0 else []
    outcome = (after(result) if after is not None else result, leaks)
    gathered = [None] * env.world_size if env.rank == 0 else None
    dist.gather_object(outcome, gathered, dst=0)
    return gathered
