"""Hypothesis over routing and shapes: combine(identity experts) == top_k * x, and every
rank receives exactly the tags of the tokens that route to it."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from a2a_programs import FuzzCase, fuzz_inputs, identity_round_trip, owner_of
from fakes.flashinfer.profiles import PROFILES
from testbed.cluster.layout import ParallelLayout


@st.composite
def cases(draw):
    ep = draw(st.integers(2, 4))
    num_experts = draw(st.integers(ep, 24))
    return FuzzCase(
        ep=ep,
        num_experts=num_experts,
        top_k=draw(st.sampled_from([k for k in PROFILES["0.7.2"].top_k_kernels if k <= min(8, num_experts)])),
        tokens_per_rank=tuple(draw(st.lists(st.integers(0, 6), min_size=ep, max_size=ep))),
        dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
        same_rank_lanes=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@given(case=cases())
def test_fake_a2a_fuzz_identity_experts(cluster, case):
    per_rank = cluster.run(identity_round_trip, ParallelLayout(case.ep, dp=case.ep), (case,), timeout_s=60)
    for me, (out_TH, arrived) in enumerate(per_rank):
        x_TH, _, _ = fuzz_inputs(case, me)
        want = x_TH.float() * case.top_k
        torch.testing.assert_close(out_TH.float(), want, rtol=1e-2, atol=1e-2)
        for src in range(case.ep):
            x_src, ids_src, tag_src = fuzz_inputs(case, src)
            expected = sorted(
                bytes(tag_src[t].tolist()) for t in range(x_src.size(0))
                if any(owner_of(int(e), case.num_experts, case.ep) == me for e in ids_src[t])
            )
            assert arrived[src] == expected, (me, src)
