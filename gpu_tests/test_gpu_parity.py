"""Parity: the scenario model's matrix and every invariant on the real FlashInfer
(``a2a-testbed run --backend flashinfer`` runs the same list): each matrix scenario moved to
the installed release, a rank per GPU, CUDA tensors over NCCL, the CPU groups over gloo, the
real MNNVL workspace. Scenarios the release or the machine cannot run are skipped with the
rule. Never run by this project's CPU CI; the same path runs on CPU with the fake under the
real package's name (tests/test_parity.py)."""

from __future__ import annotations

import pytest

from testbed.harness import runner
from testbed.harness.matrix import MATRIX, on_release


@pytest.mark.parametrize("index", range(len(MATRIX)), ids=[sc.label or str(i) for i, sc in enumerate(MATRIX)])
def test_gpu_parity_matrix_scenario_on_real_flashinfer(cluster, backend, index):
    import torch

    from testbed.gpu_env import installed_profile

    if backend == "fake":
        pytest.skip("--backend fake: the CPU suite runs the matrix on the fake")
    try:
        profile = installed_profile()
    except ValueError as e:  # a release the fake has no profile for: its facts are unknown
        pytest.skip(str(e))
    runnable, refused = on_release(profile, backend, torch.cuda.device_count())
    mine = [sc for sc in runnable if sc.label.startswith(MATRIX[index].label + " [on ")]
    if not mine:
        pytest.skip(next(rule for sc, rule in refused if sc is MATRIX[index]))
    (sc,) = mine
    v = runner.run(cluster, sc, timeout_s=600)  # a cold JIT cache compiles the kernels first
    assert v.passed, f"{sc.to_cli()}\n" + "\n".join(f"{f.invariant}: {f.evidence}" for f in v.failures)
