"""The late-zeroing schedule: an EP rank slow to zero its workspace row, made to happen.

FlashInfer's ``moe_a2a_initialize`` zeroes only the calling rank's row of the one-sided
workspace, and a peer's dispatch writes into that row. Whatever a faster peer published there
before the zeroing is erased, and the slow rank then waits for a completion flag that will never
come. Releases before 0.7.1 leave the ordering to whoever builds ``MoeAlltoAll`` (a barrier on
the EP group before first use); from 0.7.1 the workspace set-up barriers itself. The
``collectives`` invariant judges the order from the event log; this schedule makes the race
happen instead: the last rank of each EP group holds its first zeroing until the group's first
rank, done with its own row, has moved on, by posting its dispatch flags into its peers' rows or
by entering a collective that spans the late rank (which, being collective, then orders the two
by itself). Rank-to-rank signals are files in a directory every rank of the scenario sees.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Callable

import torch.distributed as dist

from fakes.flashinfer.comm import moe_a2a_kernels as kernels
from testbed import patch
from testbed.harness.audit import COLLECTIVES, group_ranks

# Calls that order the ranks they span (a point-to-point pair, or a new group's creation, does
# not order the whole group).
_ORDERING = tuple(name for name in COLLECTIVES
                  if name not in ("new_group", "send", "recv", "isend", "irecv", "batch_isend_irecv"))


def install(ctx, ep: tuple[int, ...], signals: str, flag_timeout_s: float = 5.0) -> Callable[[], None]:
    """Make this rank play its part when ``ep`` (the global ranks of its EP group, in EP order)
    has two ranks or more: the first rank signals, the last waits. ``flag_timeout_s`` bounds the
    fake's flag waits, so an erased dispatch fails well inside the scenario's timeout. Returns
    what undoes it."""
    if len(ep) < 2 or ctx.rank not in (ep[0], ep[-1]):
        return lambda: None
    zeroed, moved_on = (os.path.join(signals, f"late-zeroing-ep{ep[0]}-{what}") for what in ("zeroed", "moved-on"))
    undo = [patch.attribute(kernels, "FLAG_TIMEOUT_S", min(flag_timeout_s, kernels.FLAG_TIMEOUT_S))]
    if ctx.rank == ep[0]:
        undo += _first_rank(zeroed, moved_on, late=ep[-1], world_size=ctx.world_size)
    else:
        undo.append(patch.attribute(kernels.Hooks, "before_initialize_zero", _wait_for(zeroed, moved_on)))

    def uninstall() -> None:
        for u in reversed(undo):
            u()
    return uninstall


def _first_rank(zeroed: str, moved_on: str, late: int, world_size: int) -> list[Callable[[], None]]:
    """Signal ``zeroed`` before this rank's first zeroing (done by the time anything later
    runs), then ``moved_on`` at its first flag post or collective spanning ``late``."""
    def signal_moved_on() -> None:
        if os.path.exists(zeroed) and not os.path.exists(moved_on):
            open(moved_on, "w").close()

    def before_zero(workspace, ep_rank) -> None:
        if not os.path.exists(zeroed):
            open(zeroed, "w").close()

    post_flags = kernels._post_flags

    def posting(*args, **kwargs):  # posts, then signals: the peer's row holds the flag first
        post_flags(*args, **kwargs)
        signal_moved_on()

    def ordering(name: str, fn: Callable) -> Callable:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None

        def call(*args, **kwargs):  # signals, then blocks: the late rank is free to reach it
            if late in group_ranks(name, sig, args, kwargs, world_size):
                signal_moved_on()
            return fn(*args, **kwargs)
        return call

    return ([patch.attribute(kernels.Hooks, "before_initialize_zero", before_zero),
             patch.attribute(kernels, "_post_flags", posting)]
            + [patch.attribute(dist, name, ordering(name, getattr(dist, name)))
               for name in _ORDERING if hasattr(dist, name)])


def _wait_for(zeroed: str, moved_on: str) -> Callable:
    """A ``Hooks.before_initialize_zero`` that, once, polls until the first rank has zeroed and
    moved on (the peer's progress is the condition; the scenario's watchdog bounds the wait)."""
    def hook(workspace, ep_rank) -> None:
        while not (os.path.exists(zeroed) and os.path.exists(moved_on)):  # true from then on: once
            time.sleep(1e-3)
    return hook
