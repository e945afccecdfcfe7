from __future__ import annotations

import glob
import os
import queue
import random
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import a2a_programs
import rankprogs
from testbed.cluster import faults, selfcheck
from testbed.cluster.pool import (
    STACKS_PREFIX,
    RankFailedError,
    RankPool,
    ScenarioSetupError,
    ScenarioTimeoutError,
    WorkerStartError,
    sweep_stack_dirs,
)
from testbed.cluster.layout import ParallelLayout
from vllm_groups import EXPECTED_GROUPS, group_containing

HERE = Path(__file__).parent


@pytest.mark.parametrize("dims", sorted(EXPECTED_GROUPS), ids=lambda d: "w{}tp{}dp{}pp{}".format(*d))
def test_cluster_collectives_on_every_group(no_leaks, dims):
    per_rank = no_leaks.run(selfcheck.collectives_rank, ParallelLayout(*dims), timeout_s=90)
    world = dims[0]
    for rank, out in enumerate(per_rank):
        assert out["members"]["world"] == tuple(range(world))
        for kind, groups in EXPECTED_GROUPS[dims].items():
            assert out["members"][kind] == group_containing(groups, rank), (rank, kind)
        assert set(out["ops"]) >= {"world", "tp", "dp", "pp", "ep"}
        assert ("pp-p2p" in out["ops"]) == (dims[3] > 1)


def test_cluster_rank_raise_names_the_rank(no_leaks):
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(faults.crash, ParallelLayout(4, dp=4), ((2,),), timeout_s=30)
    err = info.value
    assert err.reports[2].status == "raised"
    assert "rank 2 raised first" in str(err)
    assert "InjectedFault: injected crash on rank 2" in str(err)
    assert 'faults.py", line' in err.reports[2].detail  # the rank's own traceback came back
    assert set(err.reports) == {0, 1, 2, 3}


def test_cluster_grace_ends_once_every_running_rank_is_parked(no_leaks):
    """Rank 0 raises before its dispatch; the others wait for its flags, which nobody will
    ever write: the grace ends once all are in that wait, not while one still works."""
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(a2a_programs.peer_raises_before_dispatch, ParallelLayout(4, dp=4), ((2,),),
                     timeout_s=120, abort_grace_s=20)  # the flag waits trap at 30 s
    err = info.value
    assert err.reports[0].status == "raised"
    for rank in (1, 2, 3):
        report = err.reports[rank]
        assert report.status == "aborted" and "parked" in report.summary, (rank, report.summary)
        assert "in _wait_flags" in report.detail, (rank, report.detail)  # rank 2 got there first


def test_cluster_grace_waits_for_a_parked_rank_whose_wait_runs_out_first(no_leaks):
    """A flag wait that traps within the grace is not cut short: each rank reports its own trap."""
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(a2a_programs.peer_raises_before_dispatch, ParallelLayout(4, dp=4), (), {"flag_timeout_s": 1.0},
                     timeout_s=120, abort_grace_s=20)
    err = info.value
    for rank in (1, 2, 3):
        report = err.reports[rank]
        assert report.status == "raised" and "CompletionTimeout" in report.summary, (rank, report.summary)


def test_cluster_rank_hang_reported_with_stuck_frame(no_leaks):
    timeout = 4.0
    no_leaks.run(rankprogs.pid, ParallelLayout(2, dp=2))  # replace workers earlier tests killed
    started = time.monotonic()
    with pytest.raises(ScenarioTimeoutError) as info:
        no_leaks.run(faults.stall, ParallelLayout(2, dp=2), ((1,),), timeout_s=timeout)
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 5, f"hang reported after {elapsed:.1f} s (timeout {timeout} s)"
    err = info.value
    assert err.stuck == [0, 1]
    assert "deadlock or hang" in str(err)
    assert "in stall_forever" in err.reports[1].detail
    assert "in barrier" in err.reports[0].detail  # rank 0 waits for rank 1 in the barrier
    assert "stack when killed" in str(err)


def test_cluster_stack_of_a_rank_holding_the_gil(no_leaks):
    """The control thread cannot run; the stack comes from faulthandler's signal handler."""
    with pytest.raises(ScenarioTimeoutError) as info:
        no_leaks.run(rankprogs.hold_gil, ParallelLayout(2, dp=2), (1,), timeout_s=5)
    detail = info.value.reports[1].detail
    assert detail.startswith("(faulthandler")
    assert "hold_gil" in detail and "rankprogs.py" in detail


def test_cluster_rank_sigkill_reported_as_death(no_leaks):
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(faults.sigkill, ParallelLayout(4, dp=4), ((3,),), timeout_s=30)
    err = info.value
    assert err.reports[3].status == "died"
    assert "SIGKILL" in err.reports[3].summary
    assert "rank 3 died first" in str(err)
    # the dead worker is replaced on the next scenario, never reused
    survivors = {rep.pid for rep in err.reports.values() if rep.status == "raised"}
    assert survivors, "no peer noticed the death"
    pids = no_leaks.run(rankprogs.pid, ParallelLayout(4, dp=4))
    assert err.reports[3].pid not in pids and err.reports[3].pid not in no_leaks.worker_pids
    assert survivors <= set(no_leaks.worker_pids)  # ranks that only raised are reused


def test_cluster_wrong_group_barrier_between_stages_is_a_deadlock(no_leaks):
    """Stage 0 rebuilds twice, stage 1 once, each followed by a world barrier (seed 001)."""
    layout = ParallelLayout(4, tp=1, dp=2, pp=2)
    with pytest.raises(ScenarioTimeoutError) as info:
        no_leaks.run(faults.rebuild_barriers, layout, ((2, 1), "world"), timeout_s=4)
    err = info.value
    stage0 = [r for r in range(4) if layout.coords(r).pp_rank == 0]
    assert err.stuck == stage0 == [0, 2]
    assert err.finished == [1, 3]
    for rank in stage0:
        assert "in rebuild_barriers" in err.reports[rank].detail
        assert "in barrier" in err.reports[rank].detail


@pytest.mark.parametrize("dims", [(4, 1, 2, 2), (8, 2, 2, 2)], ids=["w4dp2pp2", "w8tp2dp2pp2"])
def test_cluster_ep_scoped_barrier_between_stages_completes(no_leaks, dims):
    layout = ParallelLayout(*dims)
    out = no_leaks.run(faults.rebuild_barriers, layout, ((2, 1), "ep"), timeout_s=30)
    assert out == [(2, 1)[layout.coords(r).pp_rank] for r in range(layout.world_size)]


def _make_closure():
    def local_fn(ctx):
        return 0

    return local_fn


@pytest.mark.parametrize(
    "fn, args",
    [(lambda ctx: 0, ()), (_make_closure(), ()), (rankprogs.pid, (threading.Lock(),))],
    ids=["lambda", "local-function", "unpicklable-arg"],
)
def test_cluster_unpicklable_scenario_is_a_clear_error(no_leaks, fn, args):
    started = time.monotonic()
    with pytest.raises(ScenarioSetupError, match="must be picklable"):
        no_leaks.run(fn, ParallelLayout(2, dp=2), args, timeout_s=30)
    assert time.monotonic() - started < 1.0


def test_cluster_unpicklable_result_names_the_phase(no_leaks):
    with pytest.raises(RankFailedError, match=r"\(in return\)"):
        no_leaks.run(rankprogs.unpicklable_result, ParallelLayout(2, dp=2), timeout_s=30)


def test_cluster_reuses_workers(no_leaks):
    first = no_leaks.run(rankprogs.pid, ParallelLayout(2, dp=2))
    spawned = no_leaks.workers_spawned
    second = no_leaks.run(rankprogs.pid, ParallelLayout(2, dp=2))
    assert first == second
    assert no_leaks.workers_spawned == spawned


def test_cluster_teardown_time_grows_with_the_world():
    from testbed.cluster.pool import TEARDOWN_RANKS, TEARDOWN_TIMEOUT_S, teardown_timeout

    assert teardown_timeout(2) == teardown_timeout(TEARDOWN_RANKS) == TEARDOWN_TIMEOUT_S
    assert teardown_timeout(4 * TEARDOWN_RANKS) == 4 * TEARDOWN_TIMEOUT_S


def test_cluster_rank_temporary_files_go_with_the_pool():
    with RankPool() as pool:
        left = pool.run(rankprogs.temporary_file, ParallelLayout(2, dp=2))
        assert all(os.path.exists(path) for path in left)
        assert not [path for path in left if Path(path).parent == Path(tempfile.gettempdir())]
    assert not [path for path in left if os.path.exists(path)]


def test_cluster_keeps_a_world_only_while_every_rank_held_it(no_leaks):
    """Over a random walk of layouts and failures, a job reuses the previous world (its
    default group and the groups built on it) exactly when the previous job had the same
    world size and every rank finished it; collectives are right on every group either way."""
    rng = random.Random(7)
    layouts = [ParallelLayout(4, dp=4), ParallelLayout(4, tp=2, dp=2), ParallelLayout(2, dp=2),
               ParallelLayout(3, dp=3), ParallelLayout(4, tp=2, pp=2)]
    no_leaks.run(rankprogs.pid, ParallelLayout(4, dp=4))  # workers killed by earlier tests replaced
    previous, reused = None, set()  # (world size, marks, passed)
    for step in range(14):
        layout = rng.choice(layouts)
        raise_on = rng.randrange(layout.world_size) if rng.random() < 0.25 else None
        try:
            marks = no_leaks.run(rankprogs.world_mark, layout, (raise_on,), timeout_s=60)
            passed = True
        except RankFailedError as err:
            assert raise_on is not None and err.reports[raise_on].status == "raised", str(err)
            passed, marks = False, None
        if marks is not None and previous is not None and previous[1] is not None:
            expect = previous[0] == layout.world_size and previous[2]
            assert (marks == previous[1]) == expect, (step, layout, previous)
            assert expect or not set(marks) & set(previous[1]), (step, layout)
            reused.add(expect)
        previous = (layout.world_size, marks, passed)
        stores = set(glob.glob(os.path.join(no_leaks._dump_dir, "*store")))
        assert stores <= {world[0] for world in no_leaks._worlds.values()}  # a left world's store goes
    assert reused == {True, False}  # the walk saw both


def test_cluster_groups_of_a_scenario_are_reused_by_the_next(no_leaks):
    """A scenario's own process groups (an engine's parallel state) come from those its world's
    earlier scenarios made: the N-th group of given members is the same group each time, two
    groups of the same members stay two, a destroyed one goes back to the pool, and the world
    (its group count included) stays as it was."""
    layout = ParallelLayout(2, dp=2)
    first = no_leaks.run(rankprogs.world_mark, layout)
    made = no_leaks.run(rankprogs.make_own_groups, layout)
    again = no_leaks.run(rankprogs.make_own_groups, layout)
    assert again == made  # the same group objects, the same number of groups in the world
    assert len(set(made[0][0])) == 3  # three asked for, three distinct
    assert no_leaks.run(rankprogs.world_mark, layout) == first


def test_cluster_groups_of_a_scenario_without_reuse_leave_the_world():
    """Without reuse (``--no-reuse``), a scenario's own groups would pile up in a kept world:
    after one, the next job gets a new world."""
    with RankPool(reuse_groups=False) as pool:
        layout = ParallelLayout(2, dp=2)
        first = pool.run(rankprogs.world_mark, layout)
        assert pool.run(rankprogs.world_mark, layout) == first
        pool.run(rankprogs.make_own_groups, layout)
        assert not set(pool.run(rankprogs.world_mark, layout)) & set(first)


@pytest.mark.parametrize(
    "kwargs, error",
    [({"timeout_s": 0}, ValueError), ({"timeout_s": -1}, ValueError)],
)
def test_cluster_rejects_bad_arguments(no_leaks, kwargs, error):
    with pytest.raises(error, match="timeout_s"):
        no_leaks.run(rankprogs.pid, ParallelLayout(2, dp=2), **kwargs)
    with pytest.raises(TypeError, match="ParallelLayout"):
        no_leaks.run(rankprogs.pid, (2, 1, 2, 1))


def test_cluster_pool_close_stops_every_worker():
    with RankPool() as pool:
        pids = pool.run(rankprogs.pid, ParallelLayout(2, dp=2))
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]


def test_cluster_replacement_worker_takes_the_dead_ones_rank(no_leaks):
    layout = ParallelLayout(4, dp=4)
    before = no_leaks.run(rankprogs.pid, layout)
    with pytest.raises(RankFailedError):
        no_leaks.run(faults.sigkill, layout, ((2,),), timeout_s=60)
    after = no_leaks.run(rankprogs.pid, layout)
    assert [a == b for a, b in zip(before, after)] == [True, True, False, True], (before, after)


def test_cluster_worker_that_dies_while_starting_is_reported_at_once():
    started = time.monotonic()
    with RankPool(start_timeout_s=120, initializer=rankprogs.exit_at_start) as pool:
        with pytest.raises(WorkerStartError, match="exited with code 7 before it was ready"):
            pool.start(2)
    assert time.monotonic() - started < 30  # not the start timeout


# The parent takes SIGINT as Ctrl-C does (KeyboardInterrupt) even where it was started from a
# shell's background job, whose commands inherit SIGINT ignored (Python then installs no
# handler, and the signal the test sends does nothing: a full suite run with `&` failed so).
PARENT_SCRIPT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from testbed.cluster.pool import RankPool
from testbed.cluster.layout import ParallelLayout
import rankprogs
pool = RankPool()
pool.run(rankprogs.hold_segment, ParallelLayout(2, dp=2), timeout_s=120)
"""


def _wait_gone(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _tree(pid: int) -> str:
    return subprocess.run(["ps", "-o", "pid,ppid,stat,etime,cmd", "--ppid", str(pid)],
                          capture_output=True, text=True).stdout


# Each step's own bound: start-up imports torch in three processes (parent, fork server,
# ranks), which under a concurrent multi-process load on 2 cores takes well over a minute.
READY_S, EXIT_S = 180.0, 60.0


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["parent-killed", "parent-interrupted"])
def test_cluster_parent_death_leaves_no_ranks_or_segments(how, tmp_path):
    # The parent's stderr goes to a file and its stdout is drained by a thread: the fork
    # server and the ranks inherit both, and a pipe nobody reads blocks the first process
    # that fills it (a rank that cannot write cannot exit).
    err_path = tmp_path / "parent.stderr"
    with open(err_path, "wb") as err:
        parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT], cwd=HERE, bufsize=0,
                                  stdout=subprocess.PIPE, stderr=err)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln.decode()) for ln in parent.stdout], daemon=True).start()

    def fail(step: str, why: str) -> None:
        pytest.fail(f"step '{step}' failed: {why}\nparent alive: {parent.poll() is None}\nits children:\n"
                    f"{_tree(parent.pid)}\nparent stderr (tail):\n{err_path.read_text(errors='replace')[-3000:]}")

    try:
        ready, deadline = [], time.monotonic() + READY_S
        while len(ready) < 2:
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                fail("ranks report ready", f"{len(ready)} of 2 READY lines within {READY_S:.0f} s")
            if line.startswith("READY"):
                ready.append(line.split())
        workers = [int(r[2]) for r in ready]
        segments = [Path(r[3]) for r in ready]
        if not all(s.exists() for s in segments):
            fail("segments exist", f"{[str(s) for s in segments if not s.exists()]} missing while the ranks hold them")
        parent.send_signal(how)
        try:
            code = parent.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            fail(f"the parent exits after {signal.Signals(how).name}", f"still running after {EXIT_S:.0f} s")
        for pid in workers:
            if not _wait_gone(pid, EXIT_S):
                status = Path(f"/proc/{pid}/status").read_text() if Path(f"/proc/{pid}").exists() else ""
                fail("the ranks exit with their parent", f"rank process {pid} outlived its parent by {EXIT_S:.0f} s "
                     f"({' '.join(status.split()[:6])})")
        left = [str(s) for s in segments if s.exists()]
        if left:
            fail("the ranks remove their segments", f"shared-memory segments survived: {left}")
        # A killed parent cannot remove its scratch directory; the next pool's start does.
        sweep_stack_dirs()
        left = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{STACKS_PREFIX}{parent.pid}-*")]
        if left:
            fail("the next pool sweeps the dead parent's scratch", f"it survived: {left}")
        if how == signal.SIGINT and (code == 0 or b"KeyboardInterrupt" not in err_path.read_bytes()):
            fail("the interrupted parent reports it", f"exit code {code}, no KeyboardInterrupt on stderr")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_fault_counts_only_as_the_expected_failure(cluster):
    layout = ParallelLayout(2, dp=2)
    with pytest.raises(RankFailedError) as crashed:
        cluster.run(faults.crash, layout, ((0,),), timeout_s=20)
    assert faults.unexpected("crash", layout, crashed.value) is None
    assert "should be stuck" in faults.unexpected("stall", layout, crashed.value)
    assert "should have died" in faults.unexpected("sigkill", layout, crashed.value)
