"""Fake against real FlashInfer (testbed/differential.py): the same routing and payloads
through the fake's and the real ``MoeAlltoAll`` on every GPU rank, and the same tokens through
the fake's and the real TRT-LLM fused MoE with ``do_finalize=False`` (one GPU); any difference
is printed with both sides. Never run by this project's CPU CI; its comparisons are tested on
CPU with two runs of the fake (tests/test_differential.py)."""

from __future__ import annotations

import pytest
import torch

from testbed.cluster.layout import ParallelLayout
from testbed.differential import FusedCase, differential, fused_differential
from testbed.integrations.impl.cases import MoECase


@pytest.mark.parametrize("top_k, tokens", [(2, lambda w: tuple(3 + r for r in range(w))),
                                           (8, lambda w: (0,) + (16,) * (w - 1))])
def test_gpu_differential_fake_vs_real_moe_alltoall(cluster, backend, top_k, tokens):
    from testbed.scenario.rank import resolve_backend

    if backend == "fake":
        pytest.skip("--backend fake: the differential compares the fake with the real FlashInfer")
    if not resolve_backend(backend).has("comm"):
        pytest.skip("this FlashInfer has no MoeAlltoAll (0.7.4 moved it to moe_ep): the harness drives MoeAlltoAll")
    world = min(torch.cuda.device_count(), 4)
    case = MoECase(num_experts=8 * world, top_k=top_k, hidden=1024, tokens_per_dp=tokens(world), seed=top_k)
    results = cluster.run(differential, ParallelLayout(world, dp=world),
                          (case, ({"backend": "fake"}, {"backend": backend})), timeout_s=900)  # a cold JIT cache
    found = [f"rank {r['rank']}: {d}" for r in results for d in r["differences"]]
    sides = [f"rank {r['rank']}: {side.describe()}" for r in results for side in r["sides"]]
    assert not found, "\n".join(found + ["both sides:"] + sides)


@pytest.mark.parametrize("case", [FusedCase("bf16", tokens=64, experts=16, local=range(4, 12), top_k=4, hidden=1024,
                                            intermediate=512, seed=1),
                                  FusedCase("nvfp4", tokens=64, experts=16, local=range(0, 8), top_k=8, hidden=1024,
                                            intermediate=512, seed=2)], ids=["bf16", "nvfp4"])
def test_gpu_differential_fake_vs_real_fused_moe_triple(backend, case):
    if backend == "fake":
        pytest.skip("--backend fake: the differential compares the fake with the real FlashInfer")
    found, sides = fused_differential(case, ({"backend": "fake"}, {"backend": backend}))
    assert not found, "\n".join(found + ["both sides:"] + [side.describe() for side in sides])
