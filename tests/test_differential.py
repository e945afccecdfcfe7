"""The fake-vs-real harness (testbed/differential.py) on CPU: two runs of the fake that lay
rows out differently compare equal, and the comparison catches what a wrong backend would do.
On GPUs, gpu_tests/test_gpu_differential.py runs it against the real FlashInfer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from testbed.cluster.layout import ParallelLayout
from testbed.differential import (
    INVALID_ID,
    FusedCase,
    FusedSide,
    Side,
    differences,
    differential,
    expected_counts,
    fused_differences,
    fused_differential,
    fused_side,
    reference_TH,
)
from testbed.integrations.impl.cases import MoECase


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
    from testbed.integrations.impl.cases import rank_inputs

    x_TH, ids_TK, w_TK = rank_inputs(case, 0)
    dense = torch.stack([sum(float(w_TK[t, k]) * (int(ids_TK[t, k]) + 1) * x_TH[t].float() for k in range(2))
                         for t in range(3)])
    torch.testing.assert_close(reference_TH(case, 0), dense)
    for me, experts in ((0, range(0, 4)), (1, range(4, 8))):
        want = [sum(any(int(e) in experts for e in rank_inputs(case, src)[1][t]) for t in range(n))
                for src, n in enumerate((3, 5))]
        assert expected_counts(case, 2, me) == want


@pytest.mark.parametrize("case", [
    FusedCase("bf16", seed=1), FusedCase("nvfp4", seed=2), FusedCase("bf16", tokens=0),
    FusedCase("nvfp4", tokens=5, experts=16, local=range(15, 16), top_k=8, seed=4),
    FusedCase("bf16", tokens=9, experts=4, local=range(0, 4), top_k=1, seed=5),
], ids=["bf16", "nvfp4", "0-tokens", "one-local-expert", "all-local"])
@pytest.mark.parametrize("profile", ["0.7.2", "0.6.8"])
def test_differential_fused_triple_slot_orders_compare_equal(case, profile):
    found, (a, b) = fused_differential(case, ({"backend": "fake", "profile": profile, "slot_order": "shuffled"},
                                              {"backend": "fake", "profile": profile, "slot_order": "deterministic"}))
    assert found == []
    if case.tokens and case.top_k > 1:  # not vacuous: the permuted rows were laid out differently
        assert a.raw_digest != b.raw_digest


def _fused(**changes) -> tuple[FusedSide, FusedCase]:
    case = FusedCase("bf16", seed=6)
    return dataclasses.replace(fused_side(case, "fake"), **changes), case


@pytest.mark.parametrize("change, expect", [
    (lambda s: {"local_TK": s.local_TK.logical_not()}, "local where the routing says otherwise"),
    (lambda s: {"distinct": False}, "share permuted rows"),
    (lambda s: {"weights_TK": s.weights_TK.flip(1)}, "expert_weights differ"),
    (lambda s: {"rows_TKH": s.rows_TKH * 1.2}, "GEMM2 rows"),
    (lambda s: {"rows_TKH": s.rows_TKH.flip(1)}, "GEMM2 rows"),  # rows of the wrong lanes
    (lambda s: {"rows_TKH": torch.full_like(s.rows_TKH, float("nan"))}, "GEMM2 rows"),
    (lambda s: {"contract": "expert_weights must match the activation dtype"}, "breaks its contract"),
], ids=["local-lanes", "shared-rows", "weights", "scaled-rows", "swapped-lanes", "nan", "contract"])
def test_differential_fused_triple_reports_a_wrong_side(change, expect):
    good, case = _fused()
    bad = dataclasses.replace(good, backend="wrong", **change(good))
    found = fused_differences(good, bad, case)
    assert any(expect in f and "wrong" in f for f in found), found


@pytest.mark.parametrize("kwargs, error", [({"fmt": "mxfp8"}, "fmt:"), ({"local": range(3, 3)}, "local:"),
                                           ({"local": range(6, 9)}, "local:"), ({"top_k": 9}, "top_k:")])
def test_differential_fused_case_rejects_bad_input(kwargs, error):
    with pytest.raises(ValueError, match=error):
        FusedCase(**kwargs)
