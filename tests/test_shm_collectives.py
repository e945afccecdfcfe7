"""The rank pool's collectives over shared memory: the results of all-gather, all-gather-object
and exact all-reduce, torch's and gloo's checks and messages, gloo's failure behaviour (a peer
that left fails the others at once), a clear error where members gather different sizes or
make different calls."""

from __future__ import annotations

import time

import pytest

import rankprogs
from fakes import futex
from testbed.cluster.layout import ParallelLayout
from testbed.cluster.pool import RankFailedError

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="the shared-memory all-gather needs futexes (Linux)")


@pytest.mark.parametrize("dims, seed", [((4, 1, 4, 1), 1), ((4, 2, 2, 1), 2), ((4, 2, 1, 2), 3), ((3, 1, 3, 1), 4)],
                         ids=lambda v: str(v))
def test_shm_collectives_results_on_every_group(no_leaks, dims, seed):
    per_rank = no_leaks.run(rankprogs.all_gathers, ParallelLayout(*dims), (seed,), timeout_s=60)
    checked = {c for c, _ in per_rank}
    assert len(checked) == 1 and checked.pop() >= 10
    assert all(shm > 0 for _, shm in per_rank)  # the pool's ranks did gather through shared memory


@pytest.mark.parametrize("dims, seed", [((4, 1, 4, 1), 5), ((4, 2, 1, 2), 6), ((3, 1, 3, 1), 7)], ids=lambda v: str(v))
def test_shm_collectives_all_reduce_and_large_objects_on_every_group(no_leaks, dims, seed):
    checked = set(no_leaks.run(rankprogs.all_reduces, ParallelLayout(*dims), (seed,), timeout_s=60))
    assert len(checked) == 1 and checked.pop() >= 100


SAME_CALL = "(every member must make the same call)"
SAME_SHAPE = "(every member must pass the same shape and dtype)"


@pytest.mark.parametrize("calls, expected", [
    (("object", "sum"), "rank 1 made all_reduce (SUM) of 12 bytes of torch.int32, rank 0 all_gather_object of a "),
    (("sum", "barrier"), "rank 1 made a barrier, rank 0 all_reduce (SUM) of 12 bytes of torch.int32"),
    (("barrier", "object"), "rank 1 made all_gather_object of a 16-byte object, rank 0 a barrier"),
    (("gather", "sum"), "rank 1 made all_reduce (SUM) of 12 bytes of torch.int32, rank 0 all_gather of 12 bytes"),
    (("sum", "max"), "rank 1 made all_reduce (MAX) of 12 bytes of torch.int32, rank 0 all_reduce (SUM) of"),
    (("broadcast0", "sum"), "rank 1 made all_reduce (SUM) of 12 bytes of torch.int32, rank 0 broadcast from rank 0"),
    (("broadcast0", "broadcast1"), "rank 1 made broadcast from rank 1 of 12 bytes of torch.int32, rank 0 broadcast "
                                   "from rank 0 of 12 bytes"),
    (("broadcast0", "broadcast-short"), "rank 1 sent 8 bytes of torch.int32, rank 0 12 bytes of torch.int32 "
                                        + SAME_SHAPE),
], ids=lambda v: "-".join(v) if isinstance(v, tuple) else "")
def test_shm_collectives_different_calls_is_a_clear_error(no_leaks, calls, expected):
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(rankprogs.different_calls, ParallelLayout(2, dp=2), (calls,), timeout_s=60)
    rule = SAME_SHAPE if SAME_SHAPE in expected else SAME_CALL
    assert expected in info.value.reports[0].summary and rule in info.value.reports[0].summary
    other = info.value.reports[1].summary  # rank 1 names both calls too, from its side
    assert f"rank 0 {'sent' if rule == SAME_SHAPE else 'made'} " in other and rule in other, other


def test_shm_collectives_barrier_after_async_gloo_work(no_leaks):
    assert all(no_leaks.run(rankprogs.barrier_after_async_work, ParallelLayout(3, dp=3), timeout_s=60))


def test_shm_collectives_barrier_waits_for_every_member(no_leaks):
    per_rank = no_leaks.run(rankprogs.barrier_order, ParallelLayout(4, dp=4), timeout_s=60)
    assert all(per_rank), per_rank


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_shm_collectives_peer_that_left_fails_the_others_at_once(no_leaks, how):
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(rankprogs.gather_after_peer_leaves, ParallelLayout(4, dp=4), (how,), timeout_s=60)
    assert time.monotonic() - started < 30  # not the group timeout (90 s)
    reports = info.value.reports
    assert reports[1].status == ("died" if how == "kill" else "raised")
    for r in (0, 2, 3):
        assert reports[r].status == "raised", reports[r]
        assert "rank(s) [1] left the group" in reports[r].summary


def test_shm_collectives_wrong_output_sizes_is_a_clear_error(no_leaks):
    with pytest.raises(RankFailedError) as info:
        no_leaks.run(rankprogs.gather_with_wrong_sizes, ParallelLayout(2, dp=2), timeout_s=60)
    assert "rank 1 sent 12 bytes of torch.int32, rank 0 16 bytes of torch.int32" in str(info.value)
