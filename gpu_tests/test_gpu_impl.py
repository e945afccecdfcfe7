"""impl against the real FlashInfer on GPUs: the CPU suite's key scenarios, same reference.

Never run by this project's CPU CI (skipped without >= 2 GPUs and flashinfer); written so
that `tox -e gpu` on an NVLink box runs the integration unchanged.
"""

from __future__ import annotations

import pytest
import torch

from testbed.cluster.layout import ParallelLayout
from testbed.integrations.impl.cases import MoECase, reference_output, run_layers


def _check(case, results):
    for res, out in ((r, r.outputs[0]) for r in results):
        ref = reference_output(case, res.dp_rank)
        scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * scale)


@pytest.mark.parametrize("a2a_api", ["auto", "moe_ep"])
@pytest.mark.parametrize("kind", ["one_sided", "two_sided"])
@pytest.mark.parametrize("fmt", ["bf16", "nvfp4"])
def test_gpu_impl_round_trip(cluster, backend, kind, fmt, a2a_api):
    from testbed.scenario.rank import resolve_backend

    api = resolve_backend(backend)
    if a2a_api != "auto" and not api.has(a2a_api, two_sided=kind == "two_sided"):
        pytest.skip(f"this FlashInfer has no {kind} all-to-all in flashinfer.{a2a_api}")
    if a2a_api != "auto" and api.a2a_api(kind == "two_sided") == a2a_api:
        pytest.skip(f"the 'auto' case already runs flashinfer.{a2a_api} on this FlashInfer")
    world = min(torch.cuda.device_count(), 4)
    case = MoECase(num_experts=8 * world, top_k=4, hidden=1024, tokens_per_dp=tuple(3 + r for r in range(world)),
                   fmt=fmt, seed=1)
    results = cluster.run(run_layers, ParallelLayout(world, dp=world), (((case,),),),
                          {"kind": kind, "backend": backend, "a2a_api": None if a2a_api == "auto" else a2a_api},
                          timeout_s=300)
    _check(case, results)


def test_gpu_impl_workspace_grows_for_heterogeneous_layers(cluster, backend):
    """MoeAlltoAll's grow-only workspace (moe_ep sizes each layer's own)."""
    from testbed.scenario.rank import resolve_backend

    if not resolve_backend(backend).has("comm"):
        pytest.skip("this FlashInfer has no MoeAlltoAll (0.7.4): moe_ep sizes each layer's workspace itself")
    world = min(torch.cuda.device_count(), 4)
    layers = tuple(MoECase(num_experts=8 * world, top_k=2, hidden=1024, tokens_per_dp=(4,) * world, fmt=f, seed=i)
                   for i, f in enumerate(["nvfp4", "bf16", "nvfp4"]))
    results = cluster.run(run_layers, ParallelLayout(world, dp=world), ((layers,),), {"backend": backend},
                          timeout_s=300)
    for res in results:
        assert res.builds == [1, 2, 2] and res.rebuilt == [True, True, False]
    for i, case in enumerate(layers):
        _check(case, [type(r)(r.dp_rank, outputs=[r.outputs[i]]) for r in results])
