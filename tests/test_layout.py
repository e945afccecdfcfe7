from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.cluster.layout import GROUP_KINDS, ParallelLayout
from vllm_groups import EXPECTED_GROUPS


@pytest.mark.parametrize("dims", sorted(EXPECTED_GROUPS))
def test_layout_groups_match_vllm(dims):
    layout = ParallelLayout(*dims)
    for kind, groups in EXPECTED_GROUPS[dims].items():
        assert [list(g) for g in layout.groups(kind)] == groups, kind
    assert layout.groups("world") == (tuple(range(dims[0])),)


def test_layout_coords_8_ranks():
    layout = ParallelLayout(8, 2, 2, 2)
    # rank 6 = dp 1, pp 1, tp 0; EP index within stage 1 = dp * tp + tp_rank = 2
    c = layout.coords(6)
    assert (c.tp_rank, c.dp_rank, c.pp_rank, c.ep_rank) == (0, 1, 1, 2)
    assert layout.ep_size == 4


@pytest.mark.parametrize(
    "dims, words",
    [
        ((6, 4, 1, 1), ["world_size 6", "tp 4"]),
        ((8, 2, 1, 3), ["world_size 8", "pp 3"]),
        ((8, 2, 3, 1), ["dp 3", "world_size 8"]),
        ((0, 1, 1, 1), ["world_size", "positive"]),
        ((4, 2, 2, 0), ["pp", "positive"]),
    ],
)
def test_layout_rejects_sizes_that_do_not_divide(dims, words):
    with pytest.raises(ValueError) as info:
        ParallelLayout(*dims)
    for word in words:
        assert word in str(info.value)


def test_layout_parse_forms():
    assert ParallelLayout.parse("8,2,2,2") == ParallelLayout(8, 2, 2, 2)
    assert ParallelLayout.parse("w4dp2pp2") == ParallelLayout(4, 1, 2, 2)
    assert ParallelLayout.parse(str(ParallelLayout(8, 2, 2, 2))) == ParallelLayout(8, 2, 2, 2)
    with pytest.raises(ValueError, match="expected 'WORLD,TP,DP,PP'"):
        ParallelLayout.parse("eight")


@given(tp=st.integers(1, 4), dp=st.integers(1, 4), pp=st.integers(1, 4))
def test_layout_groups_partition_the_world(tp, dp, pp):
    layout = ParallelLayout(tp * dp * pp, tp, dp, pp)
    sizes = {"tp": tp, "dp": dp, "pp": pp, "ep": tp * dp, "world": tp * dp * pp}
    for kind in GROUP_KINDS:
        groups = layout.groups(kind)
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(layout.world_size)), kind
        assert {len(g) for g in groups} == {sizes[kind]}, kind
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        assert layout.group_of("tp", rank)[c.tp_rank] == rank
        assert layout.group_of("dp", rank)[c.dp_rank] == rank
        assert layout.group_of("pp", rank)[c.pp_rank] == rank
        assert layout.group_of("ep", rank)[c.ep_rank] == rank
        # ranks of one EP group share a pipeline stage; ranks of one PP group share (dp, tp)
        assert {layout.coords(r).pp_rank for r in layout.group_of("ep", rank)} == {c.pp_rank}
        assert {(layout.coords(r).dp_rank, layout.coords(r).tp_rank)
                for r in layout.group_of("pp", rank)} == {(c.dp_rank, c.tp_rank)}
