"""What every engine integration (``--integration vllm``, ``--integration sglang``) does the
same way: its mutants are killed by the invariants they name, a checkout's Python by flag, and
the fuzz strategy of the engine's scenarios. Its whole matrix and mutant catalogue, on every
release it drives, are sweeps (``a2a-testbed sweep``)."""

from __future__ import annotations

import os

import pytest

from testbed import integrations
from testbed.harness import invariants, mutants, runner
from testbed.harness.matrix import on_integration

ENGINES = tuple(i.name for i in integrations.engines())
# Each engine's tests skip (or, required, fail) without the engine installed.
INSTALLED = [pytest.param(name, marks=pytest.mark.needs(name)) for name in ENGINES]

TIMEOUT_S = 60.0


@pytest.mark.parametrize("name", ENGINES)
def test_engine_source_must_hold_the_package(name, tmp_path, monkeypatch):
    engine = integrations.get(name).engine
    monkeypatch.delenv(engine.source_env, raising=False)
    why = engine.use(str(tmp_path))
    assert why.startswith(f"--{name}-source") and f"no {name}/ package" in why
    assert engine.source_env not in os.environ


@pytest.mark.parametrize("name", INSTALLED)
def test_engine_fuzz_bounded_derandomized(name, cluster):
    from testbed.harness.fuzz import fuzz

    seen = []

    def check(sc):
        seen.append(sc)
        return runner.run(cluster, sc, timeout_s=TIMEOUT_S)

    fuzz(check, examples=5, strategy=integrations.get(name).strategy())
    assert seen and all(sc.integration == name for sc in seen)


@pytest.mark.parametrize("name, least", [("vllm", 15), ("sglang", 10)])
def test_engine_mutants_catalogue_targets_the_engine(name, least):
    catalogue = mutants.catalogue(name)
    assert len(catalogue) >= least
    assert all(mutants.owner_of(m.name).name == name and m.target.startswith(f"{name}.") and m.needs_scenarios
               for m in catalogue)
    assert all(kind in invariants.INVARIANTS for m in catalogue for kind, _ in m.expect)


@pytest.mark.parametrize("name, mutant, invariant", [
    pytest.param(name, mutant, invariant, marks=pytest.mark.needs(name)) for name, mutant, invariant in [
        ("vllm", "v-one-sided-not-reduced", "reduce"), ("vllm", "v-step-is-local-count", "runtime-max-tokens"),
        ("vllm", "v-replace-when-covered", "workspace"), ("sglang", "s-no-namespace-padding", "workspace"),
        ("sglang", "s-runtime-max-of-smallest", "runtime-max-tokens"),
        ("sglang", "s-combine-not-in-workspace", "expert-output"), ("sglang", "s-reduce-after-combine", "output"),
    ]])
def test_engine_mutant_killed_by_the_invariant_it_names(name, mutant, invariant, cluster):
    h = runner.hunt(cluster, mutant, on_integration(name, "0.7.2")[0], timeout_s=TIMEOUT_S)
    assert h.killed and h.by.startswith(invariant), (h.by, h.evidence)
