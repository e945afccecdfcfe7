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
by itself). Rank-to-rank signals are files in a directory every rank of the scenario sees; the
first rank's says how it moved on (:func:`released_by`), which names what ordered the race in
an engine's own processes.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import traceback
from typing import Callable, Optional

import torch
import torch.distributed as dist

from fakes.flashinfer.comm import moe_a2a_kernels as kernels
from testbed import patch
from testbed.harness.audit import COLLECTIVES, TESTBED_ROOT, group_ranks

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
    zeroed, moved_on = _signal(signals, ep[0], "zeroed"), _signal(signals, ep[0], "moved-on")
    undo = [patch.attribute(kernels, "FLAG_TIMEOUT_S", min(flag_timeout_s, kernels.FLAG_TIMEOUT_S))]
    if ctx.rank == ep[0]:
        undo += _first_rank(zeroed, moved_on, late=ep[-1], world_size=ctx.world_size)
    else:
        undo.append(patch.attribute(kernels.Hooks, "before_initialize_zero", _wait_for(zeroed, moved_on)))

    def uninstall() -> None:
        for u in reversed(undo):
            u()
    return uninstall


def released_by(signals: str, first: int) -> Optional[str]:
    """How the first rank ``first`` of an EP group had moved on when its late rank zeroed its
    row (its flags posted, or the collective it entered and where from); None where it never
    did (no late rank was held)."""
    try:
        with open(_signal(signals, first, "moved-on")) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _signal(signals: str, first: int, what: str) -> str:
    return os.path.join(signals, f"late-zeroing-ep{first}-{what}")


def _first_rank(zeroed: str, moved_on: str, late: int, world_size: int) -> list[Callable[[], None]]:
    """Signal ``zeroed`` before this rank's first zeroing (done by the time anything later
    runs), then ``moved_on`` at its first flag post or collective spanning ``late``, saying
    which."""
    def signal_moved_on(how: str) -> None:
        if os.path.exists(zeroed) and not os.path.exists(moved_on):
            with open(moved_on + ".part", "w") as f:
                f.write(how)
            os.replace(moved_on + ".part", moved_on)  # whole when it appears: the late rank reads it

    def before_zero(workspace, ep_rank) -> None:
        if not os.path.exists(zeroed):
            open(zeroed, "w").close()

    post_flags = kernels._post_flags

    def posting(*args, **kwargs):  # posts, then signals: the peer's row holds the flag first
        post_flags(*args, **kwargs)
        signal_moved_on("posted its dispatch flags into its peers' rows")

    def ordering(name: str, fn: Callable) -> Callable:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None

        def call(*args, **kwargs):  # signals, then blocks: the late rank is free to reach it
            ranks = group_ranks(name, sig, args, kwargs, world_size)
            if late in ranks:
                signal_moved_on(f"entered {name} on ranks [{','.join(map(str, ranks))}] from {_caller()}")
            return fn(*args, **kwargs)
        return call

    return ([patch.attribute(kernels.Hooks, "before_initialize_zero", before_zero),
             patch.attribute(kernels, "_post_flags", posting)]
            + [patch.attribute(dist, name, ordering(name, getattr(dist, name)))
               for name in _ORDERING if hasattr(dist, name)])


# The testbed's and torch's frames: never the caller of a collective (the fake's are: it stands
# for FlashInfer, whose set-up barriers from 0.7.1).
_NOT_CALLERS = (TESTBED_ROOT, os.path.dirname(os.path.realpath(torch.__file__)) + os.sep)


def _caller() -> str:
    """The innermost two frames outside the testbed and torch, ``file:line in function, called
    from file:line in function``: whoever made the collective (the engine, the integration, or
    FlashInfer's own set-up through the caller's communicator) and who called it."""
    frames = [f for f in reversed(traceback.extract_stack())
              if not os.path.realpath(f.filename).startswith(_NOT_CALLERS)][:2]
    return ", called from ".join(f"{_shown(os.path.realpath(f.filename))}:{f.lineno} in {f.name}"
                                 for f in frames) or "the testbed"


def _shown(path: str) -> str:
    """``path`` from its package's top (``sglang/srt/...``): relative to the longest entry of
    ``sys.path`` that holds it."""
    roots = [os.path.realpath(p) + os.sep for p in sys.path if p]
    root = max((r for r in roots if path.startswith(r)), key=len, default="")
    return path[len(root):]


def _wait_for(zeroed: str, moved_on: str) -> Callable:
    """A ``Hooks.before_initialize_zero`` that, once, polls until the first rank has zeroed and
    moved on (the peer's progress is the condition; the scenario's watchdog bounds the wait)."""
    def hook(workspace, ep_rank) -> None:
        while not (os.path.exists(zeroed) and os.path.exists(moved_on)):  # true from then on: once
            time.sleep(1e-3)
    return hook
