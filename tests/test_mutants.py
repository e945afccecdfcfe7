"""Mutants of impl: the catalogue applies cleanly, a kill counts only as the expected failure,
and one mutant end to end through the command line."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import impl.one_sided
from testbed import integrations
from testbed.harness import invariants, mutants, runner
from testbed.harness.matrix import MATRIX

SCRIPT = Path(sys.executable).parent / "a2a-testbed"


@pytest.mark.parametrize("m", mutants.catalogue("impl"), ids=lambda m: m.name)
def test_mutant_applies_and_undoes_exactly(m):
    module_name, _, path = m.target.partition(":")
    *owner_path, attr = path.split(".")
    owner = importlib.import_module(module_name)
    for part in owner_path:
        owner = getattr(owner, part)
    before = inspect.getattr_static(owner, attr)
    undo = mutants.apply(m.name)
    try:
        assert m.expect and all(kind in invariants.INVARIANTS or (kind == "tests" and m.tests)
                                for kind, _ in m.expect)
        for test_id in m.tests:  # the tests a mutant names exist
            path, _, func = test_id.partition("::")
            assert f"def {func}(" in (Path(__file__).parent.parent / path).read_text(), test_id
    finally:
        undo()
    assert inspect.getattr_static(owner, attr) is before


def test_mutant_catalogue_is_large_and_named_uniquely():
    assert len(mutants.catalogue("impl")) >= 25
    every = [m.name for name in integrations.names() for m in mutants.catalogue(name)]
    assert len(every) == len(set(every))  # names unique across all integrations


def test_mutant_changes_behaviour_in_this_process():
    """The patched function really runs (and the original comes back)."""
    undo = mutants.apply("combine-bytes-8bit")
    try:
        assert impl.one_sided.combine_bytes_per_token(64) == 64
    finally:
        undo()
    assert impl.one_sided.combine_bytes_per_token(64) == 128


def _substitute(monkeypatch, changed):
    """``changed`` stands for the catalogue's mutant of its name in this process."""
    get = mutants.get
    monkeypatch.setattr(mutants, "get", lambda name: changed if name == changed.name else get(name))


def test_mutant_that_no_longer_matches_is_broken_not_killed(cluster, monkeypatch):
    stale = dataclasses.replace(mutants.get("double-reduce-one-sided"), old="return Maybe")
    _substitute(monkeypatch, stale)
    hunt = runner.hunt(cluster, stale.name, MATRIX[:1], timeout_s=20)
    assert not hunt.killed and hunt.by.startswith("broken") and "occurs 0 times" in hunt.by


def test_mutant_killed_only_by_the_expected_failure(cluster, monkeypatch):
    """A double reduce fails output and reduce; a catalogue entry that expected the probe
    to catch it must not count as killed (a misspelt expectation reads as a survivor)."""
    real = mutants.get("double-reduce-one-sided")
    hunt = runner.hunt(cluster, real.name, MATRIX[:1], timeout_s=20)
    assert hunt.killed and hunt.by == "reduce @ 1", hunt
    wrong = dataclasses.replace(real, expect=(("probe", "output="),))
    _substitute(monkeypatch, wrong)
    hunt = runner.hunt(cluster, real.name, MATRIX[:1], timeout_s=20)
    assert not hunt.killed and "only unexpected failures" in hunt.by and "reduce @ 1" in hunt.by


def test_mutant_not_killed_by_what_the_release_already_shows(cluster, monkeypatch):
    """On a scenario a known finding of the release fails, the expected failure counts only where
    the unmutated scenario does not show it too (the release's own bug is no kill)."""
    from testbed.harness import findings
    from testbed.integrations.base import Finding

    real = mutants.get("double-reduce-one-sided")
    known = Finding("TOY-1", "toy", lambda sc: True, (("reduce", "output_is_reduced()"),))
    monkeypatch.setattr(findings, "known", lambda sc: [known])
    already = runner.run(cluster, MATRIX[0], mutant=real.name, timeout_s=20)
    assert already.failed("reduce") or already.known_failures
    monkeypatch.setattr(runner, "unmutated", lambda pool, sc, timeout_s: already)
    hunt = runner.hunt(cluster, real.name, MATRIX[:1], timeout_s=20)
    assert not hunt.killed, hunt
    clean = invariants.Verdict(MATRIX[0])
    monkeypatch.setattr(runner, "unmutated", lambda pool, sc, timeout_s: clean)
    hunt = runner.hunt(cluster, real.name, MATRIX[:1], timeout_s=20)
    assert hunt.killed and hunt.by == "reduce @ 1", hunt


def test_mutant_target_in_the_first_module_a_release_has(monkeypatch):
    """A release that moved the module (``a|b:Function``): the mutant changes it where it is, and
    is absent only where no alternative has it."""
    real = mutants.get("combine-bytes-8bit")
    moved = dataclasses.replace(real, target="impl.not_here|" + real.target)
    _substitute(monkeypatch, moved)
    undo = mutants.apply(moved.name)
    try:
        assert impl.one_sided.combine_bytes_per_token(64) == 64
    finally:
        undo()
    assert impl.one_sided.combine_bytes_per_token(64) == 128


def test_mutants_cli_world_barrier_end_to_end(tmp_path):
    """Historical bug 3 through `a2a-testbed mutants`: the deadlock is reported by the
    collective audit (a barrier on the world group from _barrier_after_build)."""
    out = tmp_path / "m.json"
    done = subprocess.run([str(SCRIPT), "mutants", "--only", "world-barrier-rebuild", "--json", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("killed 1 of 1")
    data = json.loads(out.read_text())
    (hunt,) = data["mutants"]
    assert hunt["killed"] and hunt["by"].startswith("collectives @")
    assert "barrier on group" in hunt["evidence"] and "_barrier_after_build" in hunt["evidence"]


@pytest.mark.parametrize("name, message", [
    ("two-sided-rtm-local", "max_token_count_per_rank differs across the EP group"),
    ("two-sided-combine-top1", "the real kernel does not check and would write outside it"),
    ("ids-index-off-by-one", "expert_ids must be int32"),
])
def test_mutant_stopped_by_the_fakes_named_check(cluster, name, message):
    """Where the real kernels would corrupt memory, the fake stops the mutant with its own check."""
    two_sided = next(sc for sc in MATRIX if sc.path == "two_sided")
    sc = two_sided if name.startswith("two-sided") else MATRIX[0]
    verdict = runner.run(cluster, sc, mutant=name, timeout_s=20)
    (failure,) = verdict.failed("completes")
    assert message in failure.evidence


def test_mutant_killed_by_the_tests_it_names_and_only_by_them(cluster, monkeypatch):
    """A refusal no scenario reaches: the named unit test must fail under the mutant (run in a
    pytest of its own with A2A_MUTANT set); naming a test that does not exercise it survives."""
    real = mutants.get("stale-context-accepted")
    hunt = runner.hunt(cluster, real.name, MATRIX, timeout_s=20)
    assert hunt.killed and hunt.by == "tests" and "test_runtime_max_tokens_is_max_over_dp" in hunt.evidence
    unrelated = dataclasses.replace(real, tests=("tests/test_impl_units.py::test_supports_kw_positional_only_is_not_a_keyword",))
    _substitute(monkeypatch, unrelated)
    hunt = runner.hunt(cluster, real.name, MATRIX, timeout_s=20)
    assert not hunt.killed and hunt.by == "survived"


@pytest.mark.parametrize("m", [pytest.param(m, marks=pytest.mark.needs(e), id=m.name)
                               for e in ("vllm", "sglang") for m in mutants.catalogue(e)])
def test_engine_mutant_applies_and_undoes_exactly(m):
    """Each mutant of the installed release changes its target and undoes it; one whose probe
    finds its code absent there cannot be applied (broken, never killed)."""
    if (m.not_applicable() or ("",))[0] == "absent":
        with pytest.raises(mutants.MutantError):
            mutants.apply(m.name)
        return
    modules, _, paths = m.target.partition(":")  # a|b:F|G: the first module and function the release has
    module = next(importlib.import_module(n) for n in modules.split("|") if importlib.util.find_spec(n))
    def has(path):
        owner = module
        for part in path.split("."):
            if not hasattr(owner, part):
                return False
            owner = getattr(owner, part)
        return True

    path = next(p for p in paths.split("|") if has(p))
    owner = module
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
