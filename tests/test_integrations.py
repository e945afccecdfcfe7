"""The seam an integration plugs into: a package and one registry line, and the harness runs
its matrix, its mutants and its scenario rules without knowing its name."""

from __future__ import annotations

import pytest

from testbed import integrations
from testbed.harness import mutants, runner
from testbed.harness.matrix import on_integration
from testbed.scenario.model import ScenarioInputError, from_text


@pytest.fixture(scope="module")
def toy():
    return integrations.register("toy_integration")


def test_integrations_toy_registered_by_one_line_runs_its_matrix(toy, no_leaks):
    assert "toy" in integrations.names() and integrations.get("toy") is toy
    scenarios, refused = on_integration("toy")
    assert scenarios[0].label == "toy: two layers" and all(sc.integration == "toy" for sc in scenarios)
    assert any("one_sided only" in rule for _, rule in refused)  # its own rule, asked by the model
    v = runner.run(no_leaks, scenarios[0], timeout_s=30)
    assert v.passed, [(f.invariant, f.evidence[:300]) for f in v.failures]
    assert v.worst <= 1.0 and v.layer_errors  # compared with the dense reference


def test_integrations_toy_mutant_killed_by_the_invariant_it_names(toy, cluster):
    (m,) = mutants.catalogue("toy")
    assert mutants.owner_of(m.name) is toy
    h = runner.hunt(cluster, m.name, on_integration("toy")[0][:2], timeout_s=30)
    assert h.killed and h.by.startswith("output"), (h.by, h.evidence)


def test_integrations_model_asks_the_scenarios_integration(toy):
    with pytest.raises(ScenarioInputError) as e:
        from_text("2,1,2,1", "bf16:8", "3,5", path="two_sided", hidden=512, integration="toy")
    assert e.value.flag == "--path" and "one_sided only" in str(e.value)
    with pytest.raises(ScenarioInputError) as e:
        from_text("2,1,2,1", "bf16:8", "3,5", integration="nobody")
    assert e.value.flag == "--integration" and "toy" in str(e.value)


def test_integrations_register_refuses_a_name_taken_by_another_module(toy):
    integrations.register("toy_integration")  # idempotent
    with pytest.raises(ValueError, match="toy_integration"):
        integrations.register("toy_integration.other")
