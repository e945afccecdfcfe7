"""``--integration vllm``: vLLM 0.33.0's own FlashInfer all-to-all classes through the scenario
model, its invariants and its known findings (the model's rules need no vLLM)."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os

import pytest

from testbed.scenario import findings, invariants, mutants, runner
from testbed.scenario.invariants import Failure, Verdict, check
from testbed.scenario.matrix import VLLM_MATRIX, on_integration
from testbed.scenario.model import ScenarioInputError
from tests.test_scenario import _parse

VLLM_TIMEOUT_S = 60.0
BASE = ("a2a-testbed run --layout 2,1,2,1 --stages bf16:16 --tokens 5,7 --integration vllm")


@pytest.mark.parametrize("extra, flag", [
    ("--stages nvfp4:16", "--stages"), ("--stages bf16:16,bf16:8", "--stages"),
    ("--path allgather_reducescatter", "--path"), ("--combine-signature opaque", "--combine-signature"),
    ("--shared-experts", "--shared-experts"), ("--expert-kernel trtllm", "--expert-kernel"),
])
def test_vllm_integration_model_refuses_what_vllm_cannot_run(extra, flag):
    with pytest.raises(ScenarioInputError) as e:
        _parse(f"{BASE} {extra}")
    assert e.value.flag == flag


def test_vllm_integration_cli_round_trip():
    sc = _parse(f"{BASE} --stages mxfp8:16,bf16:16 --path two_sided --hidden 512")
    assert sc.integration == "vllm" and sc.api == "comm"
    assert _parse(sc.to_cli()) == sc
    assert _parse(BASE).api == "moe_ep"  # vLLM's one-sided manager drives moe_ep on every release


def test_vllm_integration_matrix_moves_every_entry_or_names_the_rule():
    runnable, refused = on_integration("vllm", "0.7.2")
    assert len(runnable) + len(refused) > len(VLLM_MATRIX)
    assert all(sc.integration == "vllm" for sc in runnable) and all(rule for _, rule in refused)


def _verdict(sc, failures=()):
    v = Verdict(sc)
    v.failures.extend(failures)
    return v


def test_vllm_integration_known_finding_that_stops_reproducing_fails():
    sc = _parse(f"{BASE} --profile 0.7.4")
    v = _verdict(sc)
    assert findings.judge(v) is None and v.failed("known-finding")
    other = _verdict(sc, [Failure("output", "rank 0 ...")])
    assert findings.judge(other) is None and other.failed("output")  # another failure is not the finding
    hit = _verdict(sc, [Failure("completes", "TypeError: ... unexpected keyword argument 'max_tokens_per_rank'")])
    assert findings.judge(hit) == "KNOWN VLLM-001" and hit.passed and hit.known_failures


def _shared_logs(builds, layers=2, dispatch_build=None):
    events = []
    for i in range(layers):
        if i < len(builds):
            tokens, hidden, row = builds[i]
            events.append(dict(ev="ep_build", index=i + 1, max_num_tokens=tokens, hidden=hidden, row_bytes=row,
                               workspace_size=1000 * (i + 1), top_k=2, num_experts=8))
        events.append(dict(ev="layer", layer=i))
    events.append(dict(ev="dispatch", rtm=4, tokens=4, build=dispatch_build or len(builds)))
    return {0: events, 1: events}


def test_vllm_integration_shared_communication_rule():
    sc = _parse(f"{BASE} --stages mxfp8:16,bf16:16")
    mx, bf = 256 + 8, 512
    assert not check(sc, _shared_logs([(16, 256, mx), (16, 256, bf)]), None, None).failed("workspace")
    for logs, piece in ((_shared_logs([(16, 256, mx)]), "does not cover layer 1"),
                        (_shared_logs([(16, 256, bf), (16, 256, mx)]), "shrinks"),
                        (_shared_logs([(16, 256, mx), (16, 256, bf)], dispatch_build=1), "kept a replaced"),
                        (_shared_logs([(16, 256, bf), (16, 256, bf)]), "build(s) for layer 1")):
        found = check(sc, logs, None, None).failed("workspace")
        assert found and piece in found[0].evidence, (piece, found)


@pytest.mark.usefixtures("vllm_installed")
def test_vllm_integration_matrix_passes_or_is_known(no_leaks):
    for sc in VLLM_MATRIX:
        v = runner.run(no_leaks, sc, timeout_s=VLLM_TIMEOUT_S)
        want = [f.id for f in findings.known(sc)]
        assert v.passed, f"{sc.label}: {[(f.invariant, f.evidence[:400]) for f in v.failures]}"
        assert v.known == want, (sc.label, v.known, want)
        if not want:
            assert v.worst <= 1.0 and v.layer_errors, sc.label  # compared with the dense reference


@pytest.mark.usefixtures("vllm_installed")
def test_vllm_integration_flashinfer_074_breaks_vllm(no_leaks):
    sc = dataclasses.replace(VLLM_MATRIX[0], profile="0.7.4")
    v = runner.run(no_leaks, sc, timeout_s=VLLM_TIMEOUT_S)
    assert v.known == ["VLLM-001"]
    assert "TypeError" in v.known_failures[0].evidence


def test_vllm_mutants_catalogue_is_large_and_targets_vllm():
    assert len(mutants.VLLM_CATALOGUE) >= 15
    assert all(m.integration == "vllm" and m.target.startswith("vllm.") and m.needs_scenarios
               for m in mutants.VLLM_CATALOGUE)
    assert all(kind in invariants.INVARIANTS for m in mutants.VLLM_CATALOGUE for kind, _ in m.expect)


@pytest.mark.usefixtures("vllm_installed")
@pytest.mark.parametrize("m", mutants.VLLM_CATALOGUE, ids=lambda m: m.name)
def test_vllm_mutant_applies_and_undoes_exactly(m):
    module_name, _, path = m.target.partition(":")
    owner = importlib.import_module(module_name)
    *owner_path, attr = path.split(".")
    for part in owner_path:
        owner = getattr(owner, part)
    before = inspect.getattr_static(owner, attr)
    undo = mutants.apply(m.name)
    try:
        assert inspect.getattr_static(owner, attr) is not before
    finally:
        undo()
    assert inspect.getattr_static(owner, attr) is before


@pytest.mark.usefixtures("vllm_installed")
@pytest.mark.parametrize("name, invariant", [("v-one-sided-not-reduced", "reduce"),
                                             ("v-step-is-local-count", "runtime-max-tokens"),
                                             ("v-replace-when-covered", "workspace")])
def test_vllm_mutant_killed_by_the_invariant_it_names(cluster, name, invariant):
    h = runner.hunt(cluster, name, on_integration("vllm", "0.7.2")[0], timeout_s=VLLM_TIMEOUT_S)
    assert h.killed and h.by.startswith(invariant), (h.by, h.evidence)


def test_vllm_integration_needs_dp_above_one():
    with pytest.raises(ScenarioInputError) as e:
        _parse("a2a-testbed run --layout 2,2,1,1 --stages bf16:16 --tokens 5 --integration vllm")
    assert e.value.flag == "--layout" and "use_all2all_kernels" in str(e.value)


def test_vllm_integration_source_must_hold_the_package(tmp_path, monkeypatch):
    from testbed.integrations import vllm

    monkeypatch.delenv(vllm.SOURCE_ENV, raising=False)
    why = vllm.use(str(tmp_path))
    assert why.startswith("--vllm-source") and "no vllm/ package" in why
    assert vllm.SOURCE_ENV not in os.environ


@pytest.mark.usefixtures("vllm_installed")
def test_vllm_integration_fuzz_bounded_derandomized(cluster):
    from testbed.scenario.fuzz import fuzz, vllm_scenarios

    seen = []

    def check(sc):
        seen.append(sc)
        return runner.run(cluster, sc, timeout_s=VLLM_TIMEOUT_S)

    fuzz(check, examples=5, strategy=vllm_scenarios())
    assert seen and all(sc.integration == "vllm" for sc in seen)
