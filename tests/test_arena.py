from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import rankprogs
from fakes.arena import SHM_DIR, ShmArena, pid_alive, scenario_prefix, sweep_orphans
from testbed.cluster.pool import RankFailedError
from testbed.cluster.layout import ParallelLayout


def _own_segments() -> list[Path]:
    return sorted(SHM_DIR.glob(f"a2atb-{os.getpid()}-*"))


@pytest.mark.parametrize("world", [2, 4])
def test_arena_one_sided_puts_visible_to_every_rank(no_leaks, world):
    rows = no_leaks.run(rankprogs.one_sided_puts, ParallelLayout(world, dp=world))
    for me, row in enumerate(rows):
        # slot `src` of rank `me`'s row holds what rank `src` wrote for `me`
        assert row == [(src * world + me) % 256 for src in range(world)]
    assert not _own_segments()


def test_arena_segments_unlinked_when_a_rank_raises(no_leaks):
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(rankprogs.create_then_raise, ParallelLayout(2, dp=2), timeout_s=30)
    path = Path(info.value.reports[1].summary.split("created ")[1].split(" (in run)")[0])
    assert path.name.startswith(f"a2atb-{os.getpid()}-")
    assert not path.exists()
    assert not _own_segments()


def test_arena_segments_unlinked_when_a_rank_is_killed(no_leaks):
    with pytest.raises(RankFailedError, match="rank 1 died first"):
        no_leaks.run(rankprogs.create_then_die, ParallelLayout(2, dp=2), timeout_s=30)
    assert not _own_segments()


def test_arena_rejects_bad_keys_and_sizes():
    arena = ShmArena(scenario_prefix(os.getpid(), "unit"))
    with pytest.raises(ValueError, match="arena key '../x'"):
        arena.path("../x")
    with pytest.raises(ValueError, match="nbytes must be a positive int"):
        arena.create("seg", 0)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        arena.attach("missing")


def test_arena_create_twice_is_an_error():
    arena = ShmArena(scenario_prefix(os.getpid(), "twice"))
    try:
        a_B = arena.create("seg", 64)
        b_B = arena.attach("seg")
        a_B[3] = 9
        assert b_B[3].item() == 9
        with pytest.raises(FileExistsError, match="already exists"):
            arena.create("seg", 64)
    finally:
        assert arena.sweep() == [arena.path("seg").name]


def test_arena_sweep_orphans_removes_only_dead_owners():
    proc = subprocess.Popen(["true"])
    proc.wait()
    dead_pid = proc.pid
    orphan = SHM_DIR / f"{scenario_prefix(dead_pid, 'gone')}seg"
    mine = SHM_DIR / f"{scenario_prefix(os.getpid(), 'alive')}seg"
    orphan.write_bytes(b"x")
    mine.write_bytes(b"x")
    try:
        removed = sweep_orphans()
        assert orphan.name in removed and not orphan.exists()
        assert mine.exists()
    finally:
        orphan.unlink(missing_ok=True)
        mine.unlink(missing_ok=True)


def test_arena_pid_alive_counts_a_zombie_as_dead():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert pid_alive(os.getpid())
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: a zombie
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)
