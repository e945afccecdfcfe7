"""The scenario model on the real-FlashInfer path (``--backend flashinfer``), checked on CPU:
rank processes whose ``import flashinfer`` is the fake under its real name run the matrix
through the code a GPU runner runs (the installed package's public classes recorded, the
release's version checked against the scenario's profile, tensors on the rank's device) and
every invariant holds. On GPUs, gpu_tests/test_gpu_parity.py runs the same on the real package."""

from __future__ import annotations

import dataclasses
import functools

import pytest

import rankprogs
from testbed.cluster.pool import RankPool
from testbed.harness import runner
from testbed.harness.matrix import MATRIX, on_release
from testbed.scenario.model import ScenarioInputError
from testbed.scenario.reference import REAL_TRTLLM_TOLERANCE, TOLERANCE, tolerance


@pytest.mark.parametrize("profile", ["0.7.2", "0.7.4"])
def test_parity_matrix_on_the_flashinfer_path(profile):
    scenarios, refused = on_release(profile, "flashinfer", gpus=8)
    assert scenarios and all(sc.flashinfer_backend == "flashinfer" for sc in scenarios)
    assert any("GPUs" in rule for _, rule in refused)  # the EP 64 scenario needs 64
    failed = []
    with RankPool(initializer=functools.partial(rankprogs.alias_flashinfer, profile)) as pool:
        for sc in scenarios:
            v = runner.run(pool, sc, timeout_s=60)
            if not v.passed:
                failed.append(f"{sc.to_cli()}\n  " + "\n  ".join(f"{f.invariant}: {f.evidence[:400]}" for f in v.failures))
            elif sc.path == "one_sided" or sc.api == "moe_ep":
                assert any(v.builds), sc.to_cli()  # the recorded public classes saw the builds
    assert not failed, "\n".join(failed)


def test_parity_release_other_than_the_scenarios_is_a_clear_error():
    sc = dataclasses.replace(next(sc for sc in MATRIX if sc.profile == "0.7.2" and sc.layout.world_size <= 4),
                             flashinfer_backend="flashinfer")
    with RankPool(initializer=functools.partial(rankprogs.alias_flashinfer, "0.6.16")) as pool:
        v = runner.run(pool, sc, timeout_s=60)
    assert not v.passed
    assert "--profile 0.7.2: this machine's FlashInfer is 0.6.16" in "\n".join(f.evidence for f in v.failures)


@pytest.mark.parametrize("change, flag", [({"combine_signature": "kw-only"}, "--combine-signature"),
                                          ({"slot_order": "deterministic"}, "--slot-order")])
def test_parity_fake_only_flags_refused_on_the_real_backend(change, flag):
    sc = next(sc for sc in MATRIX if sc.path == "one_sided")
    with pytest.raises(ScenarioInputError, match=flag):
        dataclasses.replace(sc, flashinfer_backend="flashinfer", **change).validate()
    assert "--backend flashinfer" in dataclasses.replace(sc, flashinfer_backend="flashinfer").to_cli()


def test_parity_tolerance_allows_for_the_real_kernels_requantization_only():
    trt = next(sc for sc in MATRIX if sc.expert_kernel == "trtllm" and sc.combine_signature == "release")
    ref = next(sc for sc in MATRIX if sc.expert_kernel == "reference" and sc.combine_signature == "release")
    real = functools.partial(dataclasses.replace, flashinfer_backend="flashinfer")
    assert tolerance(trt, "nvfp4") == tolerance(real(ref), "nvfp4") == TOLERANCE["nvfp4"]
    assert tolerance(real(trt), "nvfp4") == REAL_TRTLLM_TOLERANCE["nvfp4"] > TOLERANCE["nvfp4"]
    assert tolerance(real(trt), "bf16") == TOLERANCE["bf16"]  # nothing requantized
