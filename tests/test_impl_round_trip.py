"""End-to-end numerics of impl: prepare (quantize + dispatch) -> experts -> finalize (combine)
against the dense single-process reference, per activation format, on both paths; and the
reduce contract of seed 002 with TP = 2 x DP = 2."""

from __future__ import annotations

import pytest
import torch

from impl_programs import run_layers_mutated
from test_impl_one_sided import assert_matches_reference
from testbed.cluster.layout import ParallelLayout
from testbed.integrations.impl.cases import FORMATS, MoECase, reference_output, run_layers

# (kind, profile): the two-sided path does not depend on the one-sided signature history.
PATHS = [("one_sided", "0.6.8"), ("one_sided", "0.7.2"), ("two_sided", "0.7.2")]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind, profile", PATHS)
def test_impl_round_trip_per_format(cluster, kind, profile, world, fmt):
    tokens = (0, 5, 3, 6)[:world]  # rank 0 has no tokens
    # hidden 512: the two-sided kernels move rows in 16-byte units (fp8 block scales: 4 * H/128).
    case = MoECase(num_experts=4 * world, top_k=6, hidden=512, tokens_per_dp=tokens, fmt=fmt,
                   seed=world, mx_alignment=256 if fmt == "mxfp8" else 0)
    results = cluster.run(run_layers, ParallelLayout(world, dp=world), (((case,),),),
                          {"kind": kind, "profile": profile})
    for res in results:
        out = res.outputs[0]
        assert out.shape == (tokens[res.dp_rank], 512) and out.dtype == torch.bfloat16
        assert_matches_reference(case, res.dp_rank, out)


@pytest.mark.parametrize("kind", ["one_sided", "two_sided"])
def test_reduce_contract_tp2_dp2(cluster, kind):
    """Each TP rank dispatches its DP rank's tokens and gets the full sum back from combine;
    honouring output_is_reduced() gives the reference, the seed-002 bug gives twice it."""
    case = MoECase(num_experts=8, top_k=2, hidden=256, tokens_per_dp=(4, 3), seed=5)
    layout = ParallelLayout(4, tp=2, dp=2)
    good = cluster.run(run_layers, layout, (((case,),),), {"kind": kind})
    bad = cluster.run(run_layers_mutated, layout, (f"double-reduce-{kind.replace('_', '-')}", ((case,),)), {"kind": kind})
    for g, b in zip(good, bad):
        assert_matches_reference(case, g.dp_rank, g.outputs[0])
        ref = reference_output(case, b.dp_rank)
        torch.testing.assert_close(b.outputs[0].float(), 2 * ref, rtol=2e-2, atol=4e-2 * max(1.0, ref.abs().max().item()))
