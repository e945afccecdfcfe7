"""The rank process: a long-lived worker that runs one rank of one scenario at a time.

Protocol on the command pipe, per scenario: the parent sends a :class:`Job`; the worker
sets up the process groups, runs the function and answers ``("ok" | "raised", ...)``; it
keeps its process groups alive until the parent sends ``"end"`` (so a rank that finished
early does not turn a peer's hang into a "connection closed" error, which a GPU would
not do either), then tears down and answers ``("clean", rank, error, kept, seconds the teardown took)``.

After a scenario its rank finished, a worker keeps its world (the default group, the
groups built on it and their shared-memory collectives) for a next job naming the same
store, world size, rank, timeout and backend; the parent names the same store only when every
rank of the job kept that world. A world is left instead when the scenario made process
groups of its own or a shared-memory round failed (members may be out of step). Destroying a gloo group waits one
10 ms event-loop tick per peer, 0.6 s at 64 ranks. What a kept world cannot catch: an
asynchronous collective a scenario left in flight on every rank would pair with the next
scenario's (the testbed's programs wait for theirs).

A second pipe is served by a daemon thread: it answers stack requests while the main
thread is blocked, and its EOF means the parent is gone, so the worker unlinks its
scenario's shared memory and exits rather than outlive the pool.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import faulthandler
import getpass
import os
import pickle
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable

import torch

from fakes import futex
from fakes.arena import ShmArena, unlink_prefix
from testbed.cluster import shm_collectives
from testbed.cluster.engine_groups import GroupReuse
from testbed.cluster.layout import GROUP_KINDS, ParallelLayout, RankCoords

EXIT_PARENT_GONE = 3
PARKING_KEY = "parked"  # the scenario's segment of its ranks' parking records (:mod:`fakes.futex`)


@dataclass(frozen=True)
class Job:
    """One rank's share of a scenario, as sent to a worker."""

    name: str
    rank: int
    layout: ParallelLayout
    store_path: str
    pg_timeout_s: float
    pg_backend: str
    arena_prefix: str
    seed: int
    payload: bytes
    sys_path: tuple[str, ...]
    reuse_groups: bool = True  # the scenario's own groups from the world's pool (:mod:`.engine_groups`)


@dataclass
class RankContext:
    """What a scenario function receives as its first argument, in each rank process.

    ``groups[kind]`` is this rank's process group of that kind (``world``, ``tp``, ``dp``,
    ``pp``, ``ep``); ``group_ranks[kind]`` its members' global ranks in group order.
    Groups whose members are the whole world are the default group itself.
    """

    name: str
    layout: ParallelLayout
    coords: RankCoords
    groups: dict[str, Any]
    group_ranks: dict[str, tuple[int, ...]]
    arena: ShmArena
    seed: int
    pg_timeout: timedelta
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.coords.rank

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def add_cleanup(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the scenario ends (last added, first run), before the groups go."""
        self._cleanups.append(fn)


@dataclass
class _State:
    """The scenario in flight (for the control thread) and the world kept between scenarios."""

    arena_prefix: str | None = None
    world: tuple | None = None  # (store path, world size, rank, group timeout, backend) of the kept world
    groups_by_members: dict = field(default_factory=dict)
    process_groups: int = 0  # how many this process had when the scenario started
    engine_groups: GroupReuse = field(default_factory=GroupReuse)


# A world that gathered more groups than this (many layouts of one world size) is left, so
# that sockets and gloo threads do not pile up.
MAX_KEPT_GROUPS = 64


def scratch_environment(scratch: str) -> dict[str, str]:
    """The variables that put a process's temporary files in ``scratch`` (``TMPDIR``), all
    but what an engine means to keep between runs there: inductor's compiled kernels stay in
    inductor's own default folder (``torchinductor_<user>`` in the caller's temporary folder)
    or where the caller's ``TORCHINDUCTOR_CACHE_DIR`` says. vLLM compiles its sampler's
    logprobs gather on first use, on a CPU with g++: seconds per process, in every process of
    every run where the cache moved with ``TMPDIR`` into a scratch removed after it."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not cache:  # torch._inductor.runtime.cache_dir_utils.default_cache_dir's (importing it costs 1.5 s)
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        cache = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    return {"TMPDIR": scratch, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def main(cmd_conn, ctl_conn, dump_path: str, initializer=None) -> None:
    """Entry point of a spawned worker process."""
    # Ctrl-C reaches the whole foreground process group; the parent decides what to do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    dump_file = open(dump_path, "w")
    # Fallback for a main thread that holds the GIL: the parent sends SIGUSR1.
    faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=True)
    state = _State()
    threading.Thread(
        target=_serve_control, args=(ctl_conn, state), name="testbed-control", daemon=True
    ).start()

    import torch

    torch.set_num_threads(1)
    _keep_freed_memory()
    shm_collectives.install()
    state.engine_groups.install()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # What a rank leaves in the temporary folder (vLLM binds a ZMQ socket file there for each
    # message queue it makes, and never unlinks one: hundreds a history) goes in its pool's
    # scratch, which the pool removes.
    os.environ.update(scratch_environment(os.path.dirname(dump_path)))
    tempfile.tempdir = None  # the fork server's answer, cached
    os.environ.pop("LOCAL_RANK", None)  # a launcher's, if the parent was launched: not this rank's
    if initializer is not None:
        initializer()
    cmd_conn.send(("ready", os.getpid()))
    while True:
        try:
            job = cmd_conn.recv()
        except (EOFError, OSError):
            break
        if job is None:
            break
        _run(job, cmd_conn, state)


def _keep_freed_memory() -> None:
    """Make glibc keep freed blocks up to 32 MiB in the heap instead of returning them to
    the kernel, as CUDA's caching allocator keeps device memory: otherwise every large
    tensor a rank allocates is fresh pages, and first-touch page faults (costly under
    gVisor-style sandboxes) dominate the data path."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass  # not glibc: correct, only slower


def _serve_control(conn, state: _State) -> None:
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            if state.arena_prefix:
                unlink_prefix(state.arena_prefix)
            os._exit(EXIT_PARENT_GONE)
        if request == "stacks":
            conn.send(format_stacks())


def format_stacks() -> str:
    """Every other thread's Python stack, innermost call last; the main thread's starts at
    the scenario function (the worker's own frames above it say nothing)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    chunks = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        entries = traceback.extract_stack(frame)
        runner = [i for i, e in enumerate(entries) if e.filename == __file__ and e.name == "_run"]
        if runner:
            entries = entries[runner[-1] + 1:]
        header = f'Thread "{names.get(ident, "?")}" (most recent call last):\n'
        chunks.append(header + "".join(traceback.format_list(entries)))
    return "\n".join(chunks)


def _parking_record(job: Job):
    """This rank's row of the scenario's parking records, which the pool reads."""
    try:
        words = ShmArena(job.arena_prefix).attach(PARKING_KEY).view(torch.int64)
    except FileNotFoundError:  # a job sent by hand, not by a pool
        return None
    return words[job.rank * futex.RECORD_WORDS:(job.rank + 1) * futex.RECORD_WORDS]


def _run(job: Job, conn, state: _State) -> None:
    state.arena_prefix = job.arena_prefix
    futex.report_to(_parking_record(job))
    started = time.monotonic()
    ctx = None
    phase = "load"
    try:
        sys.path[:0] = [p for p in job.sys_path if p not in sys.path]
        fn, args, kwargs = pickle.loads(job.payload)
        phase = "setup"
        ctx = _setup(job, state)
        state.engine_groups.begin(job.reuse_groups)
        phase = "run"
        result = fn(ctx, *args, **kwargs)
        phase = "return"
        reply = ("ok", job.rank, pickle.dumps(result), time.monotonic() - started)
    except BaseException as exc:
        reply = (
            "raised", job.rank, phase, f"{type(exc).__name__}: {exc}",
            traceback.format_exc(), time.time(),
        )
    futex.report_to(None)
    if reply[0] == "raised":
        # A rank that raised is gone as far as its peers are concerned (a real one would
        # exit): closing its groups now lets peers blocked on it fail fast, not hang.
        teardown_error = _teardown(ctx, state, keep=False)
        ctx = None
    conn.send(reply)

    try:
        conn.recv()  # "end": every rank of the scenario has answered or been killed
    except (EOFError, OSError):
        return
    ended = time.monotonic()
    if reply[0] == "ok":
        teardown_error = _teardown(ctx, state, keep=_keepable(state))
        ctx = None
    state.arena_prefix = None
    conn.send(("clean", job.rank, teardown_error, state.world is not None, time.monotonic() - ended))


def _teardown(ctx: RankContext | None, state: _State, keep: bool) -> str | None:
    """Run the scenario's cleanups and, unless ``keep``, destroy the world's process groups;
    the traceback on failure (the world is then left)."""
    try:
        if ctx is not None:
            for cleanup in reversed(ctx._cleanups):
                cleanup()
            ctx.arena.close()
            ctx.groups.clear()
        state.engine_groups.end()
        if not keep:
            _leave_world(state)
        return None
    except BaseException:
        error = traceback.format_exc()
        try:
            _leave_world(state)
        except BaseException:
            error += traceback.format_exc()
        return error


def _keepable(state: _State) -> bool:
    """Whether the world may serve the next scenario: no group came or went besides the
    layouts' and the pooled ones (a scenario's own groups would pile up), not too many of
    those, no failed round."""
    import torch.distributed as dist

    grown = state.engine_groups.made
    return (len(dist.distributed_c10d._world.pg_map) == state.process_groups + grown
            and len(state.groups_by_members) <= MAX_KEPT_GROUPS and not state.engine_groups.full()
            and shm_collectives.healthy())


def _leave_world(state: _State) -> None:
    import torch.distributed as dist

    state.world, state.groups_by_members = None, {}
    state.engine_groups.forget()
    shm_collectives.leave_all()
    if dist.is_initialized():
        dist.destroy_process_group()


def _setup(job: Job, state: _State) -> RankContext:
    import torch.distributed as dist

    timeout = timedelta(seconds=job.pg_timeout_s)
    layout = job.layout
    world = (job.store_path, layout.world_size, job.rank, job.pg_timeout_s, job.pg_backend)
    if state.world != world:
        _leave_world(state)
        store = dist.FileStore(job.store_path, layout.world_size)
        dist.init_process_group(
            job.pg_backend, store=store, rank=job.rank, world_size=layout.world_size, timeout=timeout
        )
        state.world = world
    ctx = rank_context(job.name, layout, job.rank, timeout, job.arena_prefix, job.seed,
                       state.groups_by_members)
    state.process_groups = len(dist.distributed_c10d._world.pg_map)
    return ctx


def rank_context(name: str, layout: ParallelLayout, rank: int, timeout: timedelta, arena_prefix: str,
                 seed: int, groups_by_members: dict | None = None) -> RankContext:
    """This rank's :class:`RankContext` over the initialized default group: the layout's
    groups and the scenario's shared-memory arena, made current. ``groups_by_members``
    keeps groups across scenarios of one default group (new ones are added to it)."""
    import torch.distributed as dist

    groups: dict[str, Any] = {}
    group_ranks: dict[str, tuple[int, ...]] = {}
    arena = ShmArena(arena_prefix)
    by_members = {} if groups_by_members is None else groups_by_members
    world = tuple(range(layout.world_size))
    if world not in by_members:
        by_members[world] = dist.group.WORLD
        shm_collectives.attach(dist.group.WORLD, world, arena, timeout.total_seconds())
    for kind in GROUP_KINDS:
        members = layout.group_of(kind, rank)
        if members not in by_members:
            # Only the members take part in creating it; sub-groups never inherit the
            # world's timeout (gloo would wait 30 minutes), so it is given again.
            by_members[members] = dist.new_group(
                list(members), timeout=timeout, use_local_synchronization=True
            )
            shm_collectives.attach(by_members[members], members, arena, timeout.total_seconds())
        groups[kind] = by_members[members]
        group_ranks[kind] = members
    arena.activate()
    return RankContext(
        name=name,
        layout=layout,
        coords=layout.coords(rank),
        groups=groups,
        group_ranks=group_ranks,
        arena=arena,
        seed=seed,
        pg_timeout=timeout,
    )
