"""The collective audit and the event log of a scenario's rank.

Every ``torch.distributed`` collective made from a frame of the integration under test
(``impl/``, or the files of another project's integration: :func:`install`'s ``code``) is
recorded with its group (as global ranks) and its call site, in a per-rank JSON-lines file the parent reads
even when the rank hung or died: a mismatch between the ranks of a group is then reported
by name instead of as a bare timeout. The rank program logs its own events (a build of the
all-to-all, a layer built, a forward's start and end) in the same file, so the order of
collectives and events is the order they happened in.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Callable

import torch.distributed as dist

from testbed.integrations.impl import CODE as IMPL_CODE
from testbed.scenario.events import Collective, Event, EventLog

# What counts as the integration's code: (real path prefix, name shown in call sites); impl's
# until a scenario installs its integration's.
_code: tuple[tuple[str, str], ...] = IMPL_CODE
COLLECTIVES = (
    "barrier", "monitored_barrier", "all_reduce", "reduce", "broadcast", "all_gather",
    "all_gather_into_tensor", "all_gather_single", "all_gather_object", "broadcast_object_list",
    "gather", "gather_object", "scatter", "scatter_object_list", "reduce_scatter",
    "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all", "all_to_all_single",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "new_group",
)


def calls_per_group(logs: dict[int, list[Event]]) -> dict[tuple[int, ...], dict[int, list[Collective]]]:
    """``{group ranks: {rank: its collectives on that group, in order}}``."""
    per_group: dict[tuple[int, ...], dict[int, list[Collective]]] = {}
    for rank, events in sorted(logs.items()):
        for e in events:
            if isinstance(e, Collective):
                per_group.setdefault(e.group, {}).setdefault(rank, []).append(e)
    return per_group


def divergence(group: tuple[int, ...], by_rank: dict[int, list[Collective]], finished=None) -> str | None:
    """Where the ranks of ``group`` stop issuing the same collectives, or None.

    With ``finished`` (the ranks that have returned) only a mismatch that is already certain
    counts: two ranks' n-th calls differ, or a rank waits in a call a finished peer never made.
    """
    seqs = {r: by_rank.get(r, []) for r in group}
    n = 0
    while True:
        ops = {r: s[n].op for r, s in seqs.items() if n < len(s)}
        if not ops:
            return None
        # A rank out of calls at n is behind for good only once it has returned.
        behind = [r for r in group if n >= len(seqs[r]) and (finished is None or r in finished)]
        if behind or len(set(ops.values())) > 1:
            break
        n += 1
    parts = [f"rank {r}: " + (f"{seqs[r][n].op} from {seqs[r][n].site}" if n < len(seqs[r])
                              else "nothing more" + (" (returned)" if finished and r in finished else ""))
             for r in group]
    return (f"group [{','.join(map(str, group))}]: the ranks' collective #{n + 1} differs ("
            + "; ".join(parts) + "): a mismatch that deadlocks or pairs the wrong calls")


def certain_mismatch(logs: dict[int, list[Event]], finished: set[int]) -> str | None:
    """The first collective mismatch among the ranks' logs so far that can no longer resolve."""
    for group, by_rank in sorted(calls_per_group(logs).items()):
        found = divergence(group, by_rank, finished)
        if found:
            return found
    return None


def integration_call_site() -> str | None:
    """``impl/<file>:<line> in <function>`` of the innermost frame of the integration's code
    calling (``vllm/...`` for vLLM's), or None."""
    frame = inspect.currentframe()
    while frame is not None:
        site = _site(frame)
        if site is not None:
            return site
        frame = frame.f_back
    return None


def direct_integration_call_site(skip: int = 1) -> str | None:
    """The integration's frame that called into the fake directly (the testbed's own recording
    frames between them skipped), or None when the call came from the fake itself: what the
    fake does with its own arguments is not the integration's doing."""
    frame = inspect.currentframe()
    for _ in range(skip + 1):
        frame = frame.f_back if frame is not None else None
    while frame is not None and _real(frame.f_code.co_filename).startswith(TESTBED_ROOT):
        frame = frame.f_back
    return None if frame is None else _site(frame)


def _site(frame) -> str | None:
    """``frame`` as a call site when it is the integration's code, else None."""
    filename = _real(frame.f_code.co_filename)
    for prefix, shown in _code:
        if filename.startswith(prefix):
            return f"{shown}{filename[len(prefix):]}:{frame.f_lineno} in {frame.f_code.co_name}"
    return None


TESTBED_ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir)) + os.sep


@functools.lru_cache(maxsize=4096)
def _real(filename: str) -> str:
    return os.path.realpath(filename)


def install(log: EventLog, world_size: int, code: tuple[tuple[str, str], ...] = IMPL_CODE) -> Callable[[], None]:
    """Record every collective the integration's ``code`` ((real path prefix, shown name)
    pairs) makes from now on; returns the function that stops it."""
    global _code
    _code = code
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name: str, fn: Callable) -> Callable:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None

        def recorded(*args, **kwargs):
            site = integration_call_site()
            if site is not None:
                log.write(Collective(op=name, group=tuple(group_ranks(name, sig, args, kwargs, world_size)), site=site))
            return fn(*args, **kwargs)

        recorded.__wrapped__ = fn
        return recorded

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))

    def uninstall() -> None:
        global _code
        _code = IMPL_CODE
        for name, fn in originals.items():
            setattr(dist, name, fn)

    return uninstall


def group_ranks(name, sig, args, kwargs, world_size) -> list[int]:
    """The global ranks collective ``name`` called with ``args`` and ``kwargs`` (bound by
    ``sig``, its signature, where known) spans."""
    if name == "new_group":
        ranks = (sig.bind_partial(*args, **kwargs).arguments.get("ranks") if sig else None)
        return sorted(ranks) if ranks is not None else list(range(world_size))
    if name == "batch_isend_irecv":
        group = getattr(args[0][0], "group", None) if args and args[0] else None
    else:
        group = sig.bind_partial(*args, **kwargs).arguments.get("group") if sig else kwargs.get("group")
    if group is None or group is dist.group.WORLD:
        return list(range(world_size))
    return list(dist.get_process_group_ranks(group))
