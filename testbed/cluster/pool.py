"""The simulated cluster: a persistent pool of rank processes and the watchdog over them.

``RankPool.run(fn, layout)`` runs ``fn(ctx, *args, **kwargs)`` on ``layout.world_size``
rank processes joined by a gloo rendezvous (a FileStore in the pool's private directory,
so concurrent pools under pytest-xdist never meet), with every TP / DP / PP / EP group of
the layout built; when every one of those processes kept the world of the previous job
(same size, ranks, timeout and backend: :mod:`testbed.cluster.worker`), the job runs on it. Not a TCPStore: its client reverse-resolves the store's
address, and on machines whose resolver drops those queries that costs 5 s per rank. Workers
fork from a fork server that imported torch and the testbed once (:data:`PRELOAD`), so a
worker starts in milliseconds and shares those pages (20-30 MiB unique memory per rank);
they are reused across scenarios; a worker that died, hung or failed to tear down is killed
and replaced, never reused.

The watchdog is this process: it waits on the workers' pipes and process sentinels up
to the scenario timeout. When a rank raises or dies, the others get ``abort_grace_s`` to
finish; then every rank still running has its stack taken (all threads) and is killed,
and one :class:`ScenarioError` names what each rank did. The grace ends sooner where every
rank still running is parked (:func:`fakes.futex.parked`): in the fake's flag waits, on
flags only ranks that had finished could write, each until a deadline past the grace, as
when a GPU kernel waits for a peer whose process raised; they are killed just the same.
"""

from __future__ import annotations

import atexit
import glob
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from testbed.cluster import worker as worker_mod
from fakes import futex
from fakes.arena import ShmArena, pid_alive, scenario_prefix, sweep_orphans, unlink_prefix
from testbed.cluster.layout import ParallelLayout

DEFAULT_TIMEOUT_S = 60.0
ABORT_GRACE_S = 3.0
STACK_TIMEOUT_S = 2.0
TEARDOWN_TIMEOUT_S = 10.0  # for up to TEARDOWN_RANKS ranks; more ranks, proportionally more
# Every rank destroys its world's groups at once, on the machine's few cores: 33 ranks under
# four sweeps' load once took longer than 10 s, each still destroying (not stuck).
TEARDOWN_RANKS = 8
START_TIMEOUT_S = 180.0
MONITOR_PERIOD_S = 0.25
PARK_POLL_S = 0.05  # after a failure, how often the ranks' parking records are read (a flag wait sleeps <= 50 ms)
_open_pools: "weakref.WeakSet[RankPool]" = weakref.WeakSet()


@dataclass(frozen=True)
class RankReport:
    """How one rank's part of a scenario ended.

    ``status`` is one of ``ok`` (returned), ``raised`` (its traceback in ``detail``),
    ``died`` (the process exited; ``summary`` says how), ``stuck`` (still running at the
    scenario timeout), ``aborted`` (still running ``abort_grace_s`` after another rank
    failed) or ``teardown`` (finished but could not tear down). For ``stuck`` and
    ``aborted`` ranks ``detail`` holds the stack of every thread when it was killed.
    """

    rank: int
    pid: int
    status: str
    summary: str = ""
    detail: str = ""
    elapsed_s: float | None = None
    failed_at: float | None = None  # wall clock, for ordering failures across processes


class ScenarioError(RuntimeError):
    """A scenario did not complete on every rank; ``reports`` says what each rank did."""

    def __init__(self, headline: str, reports: dict[int, RankReport]) -> None:
        self.reports = reports
        super().__init__(_format_failure(headline, reports))

    def ranks(self, status: str) -> list[int]:
        return sorted(r for r, rep in self.reports.items() if rep.status == status)

    @property
    def finished(self) -> list[int]:
        return self.ranks("ok")

    @property
    def stuck(self) -> list[int]:
        return self.ranks("stuck")


class RankFailedError(ScenarioError):
    """At least one rank raised or its process died."""


class ScenarioTimeoutError(ScenarioError):
    """No rank failed, but some did not finish within the timeout: a deadlock or a hang."""


class CollectiveMismatchError(ScenarioError):
    """The scenario's monitor saw a collective mismatch that can only end in a hang (or in
    calls paired wrongly); the ranks were stopped before the timeout."""


class ScenarioSetupError(TypeError):
    """The scenario could not be handed to the rank processes (nothing was started)."""


def open_pools_worker_pids() -> set[int]:
    """The rank processes of every pool of this process still open (each one's are its own,
    not strays of another)."""
    return {pid for pool in list(_open_pools) for pid in pool.worker_pids}


class WorkerStartError(RuntimeError):
    """A rank process did not come up."""


class _Worker:
    def __init__(self, ctx, dump_dir: str, index: int, initializer=None) -> None:
        self.dump_path = os.path.join(dump_dir, f"worker-{index}.stack")
        self.cmd, child_cmd = ctx.Pipe()
        self.ctl, child_ctl = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_mod.main,
            args=(child_cmd, child_ctl, self.dump_path, initializer),
            name=f"a2atb-rank-worker-{index}",
            daemon=True,
        )
        self.process.start()
        child_cmd.close()
        child_ctl.close()

    def alive(self) -> bool:
        return self.process.is_alive()

    def stacks(self) -> str:
        """Ask the worker's control thread for its stacks, or fall back to faulthandler."""
        try:
            self.ctl.send("stacks")
            if self.ctl.poll(STACK_TIMEOUT_S):
                return self.ctl.recv()
        except (EOFError, OSError):
            pass
        return self._faulthandler_stacks()

    def _faulthandler_stacks(self) -> str:
        # The control thread did not answer: the main thread holds the GIL in C code.
        # faulthandler's SIGUSR1 handler needs no GIL; its dump is done once the file stops growing.
        try:
            os.kill(self.process.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return "(process already gone)"
        size, deadline = -1, time.monotonic() + STACK_TIMEOUT_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
            new = os.path.getsize(self.dump_path)
            if new and new == size:
                break
            size = new
        with open(self.dump_path) as f:
            text = f.read()
        return "(faulthandler, innermost call first)\n" + text if text else "(no stack: not responding)"

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        for conn in (self.cmd, self.ctl):
            conn.close()


# Imported once in the fork server; every worker forks from it with them loaded (and their
# pages shared until written), instead of importing torch anew per rank.
PRELOAD = ("torch", "torch.distributed", "testbed.cluster.worker")
REUSE_ENV = "A2A_REUSE_GROUPS"  # "0": every scenario makes and destroys its own process groups
PRELOAD_ENV = "A2A_PRELOAD_MODULES"  # comma-separated modules the fork server imports as well


def preloaded_modules() -> tuple[str, ...]:
    """The modules ``A2A_PRELOAD_MODULES`` names."""
    return tuple(filter(None, os.environ.get(PRELOAD_ENV, "").split(",")))


def worker_context(preload: tuple[str, ...] = ()):
    """The multiprocessing context workers start from: a fork server that preloaded
    :data:`PRELOAD`, ``preload`` and the modules ``A2A_PRELOAD_MODULES`` names (it forks from a
    single-threaded process, unlike a plain fork of this one, which may run threads): the rank
    program and the engine an integration drives, say. The fork server is one per process:
    the first pool to start a worker decides."""
    ctx = mp.get_context("forkserver")
    # An engine's import (vLLM ~5 s and ~260 MiB, SGLang ~3.5 s and ~535 MiB) once per fork
    # server instead of once per rank.
    ctx.set_forkserver_preload(list(dict.fromkeys(PRELOAD + tuple(preload) + preloaded_modules()))
                               + ["testbed.cluster.frozen"])
    return ctx


STACKS_PREFIX = "a2atb-stacks-"  # + owner pid: a pool's scratch (stack dumps, store file), or a session's


def sweep_stack_dirs() -> list[str]:
    """Remove the scratch directories of pools (and of the process sessions it started,
    :mod:`testbed.harness.session`) whose process died without closing them (a SIGKILLed
    parent cannot clean up after itself)."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(STACKS_PREFIX + "*"):
        owner = path.name[len(STACKS_PREFIX):].split("-")[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def teardown_timeout(world_size: int) -> float:
    """How long the ranks of a ``world_size``-rank scenario may take to tear it down."""
    return TEARDOWN_TIMEOUT_S * max(1.0, world_size / TEARDOWN_RANKS)


class RankPool:
    """A reusable set of rank processes.

    Parameters
    ----------
    start_timeout_s : float
        How long a new worker may take to import torch and report ready.
    initializer : callable, optional
        Picklable; every rank process calls it once at start (e.g. to apply a mutant of
        ``impl`` to the whole run).
    preload : tuple of str, optional
        Modules the fork server imports besides torch's (see :func:`worker_context`).
    reuse_groups : bool, optional
        Whether a scenario's own process groups come from those earlier scenarios of its
        world made (:mod:`testbed.cluster.engine_groups`); default: unless
        ``A2A_REUSE_GROUPS=0`` (what ``--no-reuse`` sets).

    Use as a context manager or call :meth:`close`; workers are also killed at interpreter
    exit and exit by themselves when this process dies.
    """

    def __init__(self, start_timeout_s: float = START_TIMEOUT_S,
                 initializer: Callable[[], Any] | None = None, preload: tuple[str, ...] = (),
                 reuse_groups: bool | None = None) -> None:
        self._mp = worker_context(preload)
        self.reuse_groups = reuse_groups if reuse_groups is not None else os.environ.get(REUSE_ENV) != "0"
        _open_pools.add(self)
        self._start_timeout_s = start_timeout_s
        self._initializer = initializer
        self._dump_dir = tempfile.mkdtemp(prefix=f"{STACKS_PREFIX}{os.getpid()}-")
        self._workers: list[_Worker | None] = []  # by rank; None: a slot whose worker was discarded
        # The world each worker kept after its last scenario: (store path, world size, group
        # timeout, backend, its rank there).
        self._worlds: dict[_Worker, tuple[str, int, float, str, int]] = {}
        self._spawned = 0
        self._lock = threading.Lock()
        self._closed = False
        self.scenarios_run = 0
        self.last_teardown_s = 0.0  # the slowest rank's teardown of the last scenario
        sweep_orphans()
        sweep_stack_dirs()
        atexit.register(self.close)

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w is not None]

    @property
    def workers_spawned(self) -> int:
        return self._spawned

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker and remove the pool's scratch files."""
        if self._closed:
            return
        self._closed = True
        _open_pools.discard(self)
        live = [w for w in self._workers if w is not None]
        for w in live:
            try:
                w.cmd.send(None)
            except (OSError, ValueError):
                pass
        for w in live:
            w.process.join(2)
            w.kill()
        self._workers.clear()
        shutil.rmtree(self._dump_dir, ignore_errors=True)
        atexit.unregister(self.close)

    def run(
        self,
        fn: Callable[..., Any],
        layout: ParallelLayout,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        abort_grace_s: float = ABORT_GRACE_S,
        pg_timeout_s: float | None = None,
        pg_backend: str = "gloo",
        name: str | None = None,
        seed: int = 0,
        monitor: Callable[[set[int]], str | None] | None = None,
    ) -> list[Any]:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank of ``layout``.

        Parameters
        ----------
        fn : callable
            A picklable (module-level) function; ``ctx`` is a
            :class:`testbed.cluster.worker.RankContext`.
        layout : ParallelLayout
            The world size and TP / DP / PP degrees.
        timeout_s : float
            Wall-clock limit for the whole scenario, set-up included.
        abort_grace_s : float
            After a rank fails, how long the others may take to finish before they are
            killed with their stacks taken.
        pg_timeout_s : float, optional
            Timeout of every process group; defaults to ``timeout_s + 30`` so that the
            watchdog, which shows stacks, fires before gloo does.
        pg_backend : str
            The world's ``torch.distributed`` backend: ``gloo``, or ``cpu:gloo,cuda:nccl``
            (CUDA tensors over NCCL) for ranks that drive GPUs.
        seed : int
            Passed to every rank as ``ctx.seed``.
        monitor : callable, optional
            Called about every ``MONITOR_PERIOD_S`` with the ranks that have returned; a
            string it returns stops the scenario at once (stacks taken, ranks killed) as a
            :class:`CollectiveMismatchError` with that text.

        Returns
        -------
        list
            ``fn``'s return value per rank, indexed by global rank.

        Raises
        ------
        ScenarioSetupError
            ``fn`` or its arguments cannot be pickled.
        RankFailedError
            A rank raised or its process died.
        ScenarioTimeoutError
            Some rank did not finish within ``timeout_s`` and none failed.
        CollectiveMismatchError
            ``monitor`` reported a mismatch.
        """
        if not isinstance(layout, ParallelLayout):
            raise TypeError(f"layout must be a ParallelLayout, got {type(layout).__name__}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        name = name or getattr(fn, "__qualname__", repr(fn))
        payload = _pickle_payload(fn, tuple(args), dict(kwargs or {}), name)
        with self._lock:
            if self._closed:
                raise RuntimeError("RankPool is closed")
            return self._run(
                name, payload, layout, timeout_s, abort_grace_s,
                pg_timeout_s if pg_timeout_s is not None else timeout_s + 30.0, pg_backend, seed, monitor,
            )

    def _run(self, name, payload, layout, timeout_s, abort_grace_s, pg_timeout_s, pg_backend, seed, monitor):
        workers = self._ensure_workers(layout.world_size)
        prefix = scenario_prefix(os.getpid(), uuid.uuid4().hex[:12])
        world = (pg_timeout_s, pg_backend)
        store_path = self._world_store(workers, world) or os.path.join(self._dump_dir, prefix + "store")
        records = ShmArena(prefix).create(worker_mod.PARKING_KEY, 8 * futex.RECORD_WORDS * layout.world_size)
        records = records.view(torch.int64).view(layout.world_size, futex.RECORD_WORDS)
        started = time.monotonic()
        in_flight = dict(enumerate(workers))
        try:
            for rank, w in in_flight.items():
                w.cmd.send(
                    worker_mod.Job(
                        name=name, rank=rank, layout=layout, store_path=store_path, pg_timeout_s=pg_timeout_s,
                        pg_backend=pg_backend, arena_prefix=prefix, seed=seed, payload=payload,
                        sys_path=tuple(sys.path), reuse_groups=self.reuse_groups,
                    )
                )
            reports, mismatch = self._watch(in_flight, started, timeout_s, abort_grace_s, monitor, records)
            reports.update(self._teardown(in_flight, reports, (store_path, layout.world_size, *world)))
            in_flight = {}
        finally:
            # Interrupted (Ctrl-C, pytest-timeout): the ranks are in an unknown state.
            for w in in_flight.values():
                w.kill()
                self._discard(w)
            kept = {world[0] for world in self._worlds.values()}
            for path in [store_path] + glob.glob(os.path.join(self._dump_dir, "*store")):
                if path not in kept and os.path.exists(path):
                    os.unlink(path)
            unlink_prefix(prefix)
        self.scenarios_run += 1
        return self._result(name, layout, time.monotonic() - started, timeout_s, reports, mismatch)

    def _watch(self, in_flight, started, timeout_s, abort_grace_s, monitor, records):
        reports: dict[int, RankReport] = {}
        waiting = dict(in_flight)
        deadline = started + timeout_s
        failed_at = None
        mismatch = None
        monitor_at = started  # not on every reply: with 64 ranks that reads every log 64 times
        # (the ranks still running, their parking records) when all were first seen in the
        # same flag-wait loops as now
        asleep_since = None
        parked = False
        while waiting:
            limit = deadline if failed_at is None else min(deadline, failed_at + abort_grace_s)
            now = time.monotonic()
            remaining = limit - now
            if remaining <= 0:
                break
            if failed_at is not None:
                ranks = sorted(waiting)
                seen = records[ranks].clone()
                if asleep_since is None or asleep_since[0] != ranks or not futex.in_the_same_loops(asleep_since[1], seen):
                    asleep_since = (ranks, seen)
                elif futex.parked(asleep_since[1], seen, limit):
                    parked = True
                    break
                remaining = min(remaining, PARK_POLL_S)
            if monitor is not None and failed_at is None:
                if now >= monitor_at:
                    mismatch = monitor({r for r, rep in reports.items() if rep.status == "ok"})
                    if mismatch:
                        break
                    monitor_at = now + MONITOR_PERIOD_S
                remaining = min(remaining, monitor_at - now)
            by_handle = {}
            for rank, w in waiting.items():
                by_handle[w.cmd] = rank
                by_handle[w.process.sentinel] = rank
            for handle in wait(list(by_handle), timeout=remaining):
                rank = by_handle[handle]
                if rank not in waiting:
                    continue
                report = self._reply(rank, waiting[rank], started)
                if report is None:
                    continue
                reports[rank] = report
                del waiting[rank]
                if report.status != "ok" and failed_at is None:
                    failed_at = time.monotonic()
        status = "stuck" if failed_at is None else "aborted"
        # Every stack before any kill: a rank whose peer was killed leaves its wait (as after
        # gloo's "Connection closed by peer") and its stack would no longer show the hang.
        stacks = {rank: w.stacks() if w.alive() else "(process gone)" for rank, w in waiting.items()}
        why = ", parked: waiting for shared words only ranks that had finished could write" if parked else ""
        for rank, w in waiting.items():
            w.kill()
            self._discard(w)
            reports[rank] = RankReport(rank, w.process.pid, status, f"process {w.process.pid} killed{why}", stacks[rank])
        return reports, mismatch

    def _reply(self, rank: int, w: _Worker, started: float) -> RankReport | None:
        if w.cmd.poll():
            try:
                msg = w.cmd.recv()
            except (EOFError, OSError):
                msg = None
                w.process.join(2)  # the pipe closed: the process is exiting
            if msg is not None:
                if msg[0] == "ok":
                    _, _, blob, elapsed = msg
                    return RankReport(rank, w.process.pid, "ok", "", blob, elapsed)
                _, _, phase, summary, tb, at = msg
                return RankReport(
                    rank, w.process.pid, "raised", f"{summary} (in {phase})", tb, time.monotonic() - started, at
                )
        if w.alive():
            return None
        w.process.join(1)
        code = w.process.exitcode
        how = (
            f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
            else f"exited with code {code}"
        )
        self._discard(w)
        return RankReport(rank, w.process.pid, "died", f"process {w.process.pid} {how}", "",
                          time.monotonic() - started, time.time())

    def _world_store(self, workers: list[_Worker], world: tuple[float, str]) -> str | None:
        """The store of the world every one of ``workers`` kept, each as its rank here and
        with the same ``(group timeout, backend)`` (so the job reuses its groups), or None."""
        kept = [self._worlds.get(w) for w in workers]
        if kept[0] is None:
            return None
        store_path = kept[0][0]
        if kept != [(store_path, len(workers), *world, rank) for rank in range(len(workers))]:
            return None
        return store_path

    def _teardown(self, in_flight, reports, world) -> dict[int, RankReport]:
        """Let the surviving ranks drop the scenario (and their groups, unless they keep
        ``world``); kill any that cannot."""
        live = {r: w for r, w in in_flight.items() if w in self._workers}
        for w in live.values():
            self._worlds.pop(w, None)
            w.cmd.send("end")
        deadline = time.monotonic() + teardown_timeout(len(in_flight))
        problems = {}
        self.last_teardown_s = 0.0
        for rank, w in live.items():
            remaining = max(0.0, deadline - time.monotonic())
            msg = None
            try:
                if w.cmd.poll(remaining):
                    msg = w.cmd.recv()
            except (EOFError, OSError):
                pass
            if msg is not None and msg[2] is None:
                self.last_teardown_s = max(self.last_teardown_s, msg[4])
                if msg[3]:
                    self._worlds[w] = (*world, rank)
                continue
            detail = msg[2] if msg is not None else w.stacks()
            w.kill()
            self._discard(w)
            if reports[rank].status == "ok":
                problems[rank] = RankReport(
                    rank, w.process.pid, "teardown", "failed to tear down", detail
                )
        return problems

    def _result(self, name, layout, elapsed, timeout_s, reports, mismatch) -> list[Any]:
        statuses = {rep.status for rep in reports.values()}
        if statuses == {"ok"}:
            return [pickle.loads(reports[r].detail) for r in range(layout.world_size)]
        where = f"scenario {name!r} on {layout}"
        if mismatch:
            raise CollectiveMismatchError(
                f"{where} stopped after {elapsed:.1f} s, before the timeout: {mismatch}; rank(s) "
                f"{sorted(r for r, rep in reports.items() if rep.status == 'stuck')} were still waiting",
                reports,
            )
        failures = [rep for rep in reports.values() if rep.status in ("raised", "died")]
        if failures:
            # The parent sees a death only after the peers' "connection reset" errors that it
            # causes, so a death ranks first; raises are ordered by the ranks' own clocks.
            first = min(failures, key=lambda rep: (rep.status != "died", rep.failed_at))
            raise RankFailedError(
                f"{where} failed after {elapsed:.1f} s: rank {first.rank} {first.status} first "
                f"({first.summary}); failed: {sorted(rep.rank for rep in failures)}",
                reports,
            )
        if "stuck" in statuses:
            raise ScenarioTimeoutError(
                f"{where} timed out after {timeout_s:g} s (deadlock or hang): "
                f"rank(s) {sorted(r for r, rep in reports.items() if rep.status == 'stuck')} "
                f"did not finish",
                reports,
            )
        raise ScenarioError(f"{where} failed after {elapsed:.1f} s", reports)

    def start(self, world_size: int) -> None:
        """Start workers until ``world_size`` are ready (``run`` does it on demand)."""
        with self._lock:
            self._ensure_workers(world_size)

    def _ensure_workers(self, n: int) -> list[_Worker]:
        for w in [w for w in self._workers if w is not None and not w.alive()]:
            w.kill()
            self._discard(w)
        self._workers += [None] * (n - len(self._workers))
        fresh = []
        for i in range(n):
            if self._workers[i] is None:
                self._workers[i] = w = _Worker(self._mp, self._dump_dir, self._spawned, self._initializer)
                self._spawned += 1
                fresh.append(w)
        deadline = time.monotonic() + self._start_timeout_s
        for w in fresh:
            msg = None
            try:
                # The process's sentinel too: one that dies while starting may leave its pipe
                # open in the fork server, and must not cost the whole start timeout.
                if w.cmd in wait([w.cmd, w.process.sentinel], max(0.0, deadline - time.monotonic())):
                    msg = w.cmd.recv()
            except (EOFError, OSError):
                pass
            if not msg or msg[0] != "ready":
                w.process.join(STACK_TIMEOUT_S)
                code = w.process.exitcode
                w.kill()
                self._discard(w)
                why = (f"did not start within {self._start_timeout_s:g} s" if code is None else
                       f"exited with code {code} before it was ready (its traceback is on stderr)")
                raise WorkerStartError(f"rank worker {w.process.name} {why}")
        return self._workers[:n]

    def _discard(self, w: _Worker) -> None:
        """Forget ``w``; its slot waits for a replacement, so that every other worker keeps its
        rank (a rank on the real FlashInfer holds its GPU and that GPU's state for good)."""
        self._worlds.pop(w, None)
        if w in self._workers:
            self._workers[self._workers.index(w)] = None


def _pickle_payload(fn, args, kwargs, name) -> bytes:
    try:
        return pickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise ScenarioSetupError(
            f"scenario {name!r}: the function and its arguments must be picklable to reach "
            f"the rank processes (use a module-level function, not a lambda, closure or "
            f"local function): {type(exc).__name__}: {exc}"
        ) from exc


def _format_failure(headline: str, reports: dict[int, RankReport]) -> str:
    lines = [headline]
    for status in ("ok", "raised", "died", "stuck", "aborted", "teardown"):
        ranks = sorted(r for r, rep in reports.items() if rep.status == status)
        if ranks:
            lines.append(f"  {status:9s} rank(s) {ranks}")
    for rank in sorted(reports):
        rep = reports[rank]
        if rep.status == "ok":
            continue
        lines.append(f"--- rank {rank}: {rep.status}" + (f": {rep.summary}" if rep.summary else ""))
        if rep.status in ("stuck", "aborted"):
            lines.append("stack when killed (all threads):")
        if rep.detail:
            lines.append(rep.detail.rstrip())
    return "\n".join(lines)


_default_pool: RankPool | None = None


def default_pool() -> RankPool:
    """The process-wide pool, created on first use."""
    global _default_pool
    if _default_pool is None or _default_pool._closed:
        _default_pool = RankPool()
    return _default_pool
