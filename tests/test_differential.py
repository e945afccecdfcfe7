"""The fake-vs-real harness (testbed/differential.py) on CPU: two runs of the fake that lay
rows out differently compare equal, and the comparison catches what a wrong backend would do.
On GPUs, gpu_tests/test_gpu_differential.py runs it against the real FlashInfer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from testbed.cluster.layout import ParallelLayout
from testbed.differential import INVALID_ID, Side, differences, differential, expected_counts, reference_TH
from testbed.scenario.moe import MoECase


@pytest.mark.parametrize("world, tokens, top_k, profile", [(2, (3, 0), 2, "0.7.2"), (4, (2, 5, 0, 4), 4, "0.6.8"),
                                                           (3, (4, 4, 1), 8, "0.6.16")])
def test_differential_slot_orders_compare_equal(no_leaks, world, tokens, top_k, profile):
    case = MoECase(num_experts=4 * world, top_k=top_k, hidden=64, tokens_per_dp=tokens, seed=world)
    sides = ({"backend": "fake", "profile": profile, "slot_order": "shuffled"},
             {"backend": "fake", "profile": profile, "slot_order": "deterministic"})
    results = no_leaks.run(differential, ParallelLayout(world, dp=world), (case, sides), timeout_s=60)
    assert [d for r in results for d in r["differences"]] == []
    # Not vacuous: the two runs laid the rows out differently somewhere, and rows did arrive.
    assert any(r["sides"][0].raw_digest != r["sides"][1].raw_digest for r in results)
    assert sum(sum(r["sides"][0].counts_R) for r in results) > 0


def _side(**changes) -> Side:
    base = Side(backend="a", counts_R=[2, 1], rows_R=[["r1", "r2"], ["r3"]], sanitized=True, raw_digest="x",
                out_TH=torch.ones(2, 4))
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("change, expect", [
    ({"counts_R": [2, 2], "rows_R": [["r1", "r2"], ["r3", "r4"]]}, "counts per source"),
    ({"rows_R": [["r1", "rX"], ["r3"]]}, "rows from source 0 differ as sets"),
    ({"sanitized": False}, f"is not {INVALID_ID}"),
    ({"out_TH": torch.ones(2, 4) * 1.5}, "combine"),
    ({"out_TH": torch.ones(3, 4)}, "combine"),
    ({"out_TH": torch.full((2, 4), float("nan"))}, "combine"),
])
def test_differential_catches_what_a_wrong_backend_does(change, expect):
    ref = torch.ones(2, 4)
    assert differences(_side(), _side(backend="b", raw_digest="y"), ref, [2, 1]) == []  # layout alone is no difference
    found = differences(_side(), _side(backend="b", **change), ref, [2, 1])
    assert found and any(expect in f for f in found), found


def test_differential_counts_against_the_routing():
    found = differences(_side(), _side(backend="b"), torch.ones(2, 4), [2, 2])
    assert any("the routing sends [2, 2]" in f for f in found), found


def test_differential_reference_and_counts_from_the_routing():
    """Per-token loops, against the vectorized reference and counts."""
    case = MoECase(num_experts=8, top_k=2, hidden=16, tokens_per_dp=(3, 5), seed=5)
    from testbed.scenario.moe import rank_inputs

    x_TH, ids_TK, w_TK = rank_inputs(case, 0)
    dense = torch.stack([sum(float(w_TK[t, k]) * (int(ids_TK[t, k]) + 1) * x_TH[t].float() for k in range(2))
                         for t in range(3)])
    torch.testing.assert_close(reference_TH(case, 0), dense)
    for me, experts in ((0, range(0, 4)), (1, range(4, 8))):
        want = [sum(any(int(e) in experts for e in rank_inputs(case, src)[1][t]) for t in range(n))
                for src, n in enumerate((3, 5))]
        assert expected_counts(case, 2, me) == want
