"""``a2a-testbed sweep``'s machinery on small cases: the catalogue follows the adapters, each
judge finds what it exists to find in a verdict it is handed, a sweep's command runs in a
process of its own with its output in a log, and a hunt meets every kind of deployment early.
The catalogues themselves run in CI as sweeps, never here."""

from __future__ import annotations

import copy
import importlib.util

import pytest

from testbed import integrations
from testbed.cli import main
from testbed.harness import sweeps
from testbed.harness.matrix import MATRIX
from testbed.harness.runner import kill_order

PASSING = {"cli": "run --layout 2,1,2,1 --profile 0.7.1 --seed 0", "label": "two ranks", "passed": True,
           "worst_x_tolerance": 0.2, "layer_errors": {"s0.l0": 0.2}, "failures": [], "known": []}


@pytest.mark.parametrize("name", [pytest.param(i.name, marks=pytest.mark.needs(i.name)) for i in integrations.engines()])
def test_sweep_catalogue_has_every_release_the_adapter_drives(name):
    engine = integrations.get(name).engine
    names = {s.name for s in sweeps.catalogue()}
    for release, _ in sweeps.releases(engine):
        assert {f"{name} {release} matrix", f"{name} {release} mutants"} <= names
    assert set(engine.other_releases) <= {r for r, _ in sweeps.releases(engine)}
    assert "models" in names


def test_sweep_catalogue_names_the_engines_it_leaves_out():
    missing = sweeps.missing()
    for i in integrations.engines():
        installed = importlib.util.find_spec(i.engine.name) is not None
        assert installed != any(line.startswith(f"{i.name}: ") for line in missing)
        assert installed == any(s.engine == i.name for s in sweeps.catalogue())


def test_sweep_matrix_judge_finds_a_failure_an_unjudged_pass_and_another_pin():
    judge = sweeps.judge_matrix("0.7.1")
    assert judge({"scenarios": [PASSING]}, "") == []
    failed = dict(PASSING, passed=False, failures=[{"invariant": "reduce", "evidence": "reduced twice\nmore"}])
    (problem,) = judge({"scenarios": [failed]}, "")
    assert problem.startswith("FAIL two ranks: [reduce] reduced twice") and PASSING["cli"] in problem
    unjudged = dict(PASSING, layer_errors={})
    assert "dense reference" in judge({"scenarios": [unjudged]}, "")[0]
    beyond = dict(PASSING, worst_x_tolerance="inf")
    assert "dense reference" in judge({"scenarios": [beyond]}, "")[0]
    other = dict(PASSING, cli="run --layout 2,1,2,1 --profile 0.7.2 --seed 0")
    assert "not on the release's pin 0.7.1" in judge({"scenarios": [other]}, "")[0]
    assert judge({"scenarios": []}, "") == ["no scenario ran"]


def test_sweep_matrix_judge_wants_the_serving_profile_named():
    """A pin no profile has by name (0.7.0.post1, served by 0.7.0) is named with its server."""
    from fakes.flashinfer.profiles import resolve

    assert resolve("0.7.0.post1").name == "0.7.0"
    judge = sweeps.judge_matrix("0.7.0.post1")
    ran = {"scenarios": [dict(PASSING, cli="run --profile 0.7.0.post1 --seed 0")]}
    assert "0.7.0 serves the pin 0.7.0.post1" in judge(ran, "PASS 1/1 ... on 0.7.0.post1")[0]
    assert judge(ran, "PASS 1/1 ... on 0.7.0.post1 (served by 0.7.0)") == []


def test_sweep_models_judge_finds_a_scenario_left_out():
    assert sweeps.judge_models({"scenarios": [PASSING]}, "PASS ...\n") == []
    (problem,) = sweeps.judge_models({"scenarios": [PASSING]}, "NOT RUN  2 (--show-not-run lists each): 2 x rule\n")
    assert problem.endswith("NOT RUN  2 (--show-not-run lists each): 2 x rule")


def test_sweep_mutants_judge_finds_a_survivor_and_an_excuse_the_source_contradicts(tmp_path):
    """A mutant is N/A only where the release's source of its target lacks the code it changes."""
    m = next(m for m in integrations.get("sglang").mutants() if m.requires is not None)
    module = m.target.partition(":")[0]
    for version, text in (("9.0.0", "nothing of it here\n"), ("9.0.1", f"before\n{m.old}\nafter\n")):
        root = tmp_path / version
        (root / module.replace(".", "/")).parent.mkdir(parents=True)
        (root / (module.replace(".", "/") + ".py")).write_text(text)
        (root / f"sglang-{version}.dist-info").mkdir()
        (root / f"sglang-{version}.dist-info" / "METADATA").write_text(f"Name: sglang\nVersion: {version}\n")
    engine = integrations.get("sglang").engine
    data = {"mutants": [{"mutant": "s-capacity-halved", "killed": True, "by": "workspace @ 1"}],
            "not_applicable": [{"mutant": m.name, "why": "no such code"}]}
    assert sweeps.judge_mutants(engine, str(tmp_path / "9.0.0"))(data, "") == []
    (problem,) = sweeps.judge_mutants(engine, str(tmp_path / "9.0.1"))(data, "")
    assert problem.startswith(f"{m.name} was left out as N/A (no such code), but {module}")
    survived = copy.deepcopy(data)
    survived["mutants"][0].update(killed=False, by="survived")
    (problem,) = sweeps.judge_mutants(engine, str(tmp_path / "9.0.0"))(survived, "")
    assert problem.startswith("s-capacity-halved SURVIVED: survived  reproduce: a2a-testbed mutants --integration "
                              f"sglang --sglang-source {tmp_path / '9.0.0'} --only s-capacity-halved")


def test_sweep_engine_judge_holds_the_step_rule():
    from testbed.integrations.vllm.matrix import ENGINE_MATRIX

    es = next(es for es in ENGINE_MATRIX if es.tp == 1 and es.path == "one_sided" and all(es.prompts))
    layers, world = es.checkpoint().layers, es.layout.world_size
    counts = [len(p) for p in es.prompts]
    steps = {str(r): [{"forward": f, "rows": counts[r // es.tp], "dp_tokens": counts} for f in range(2)]
             for r in range(world)}
    n = 2 * layers * world
    verdict = {"scenario": es.describe(), "reproduce": es.to_cli(), "passed": True, "failures": [],
               "events": {"forward": n, "dispatch": n, "combine": n}, "steps": steps}
    judge = sweeps.judge_engine(integrations.get("vllm"))
    others = [{"scenario": e.describe(), "passed": False, "reproduce": "x", "failures": [
        {"invariant": "logprobs", "evidence": "moved"}]} for e in ENGINE_MATRIX if e is not es]
    out = "vLLM's and the ranks' own output: /tmp/x.log (-v shows it live)\nPASS 1/5 ...\n"
    problems = judge({"verdicts": [verdict] + others}, out)
    assert len(problems) == len(others) and all(p.startswith("FAIL ") for p in problems)
    wrong = copy.deepcopy(verdict)
    wrong["steps"]["0"][1]["rows"] += 1
    assert "not the step rule's" in judge({"verdicts": [wrong]}, out)[0]
    idle = copy.deepcopy(verdict)
    idle["events"]["combine"] -= 1
    assert "differ" in judge({"verdicts": [idle]}, out)[0]
    assert judge({"verdicts": []}, out)[-1].startswith("entries not run: ")
    noisy = judge({"verdicts": [verdict] + others}, out + "(a2atb-rank-worker-0 pid=7) INFO 12-03 [core.py] x\n")
    assert noisy[-1].startswith("the engine's own output reached the terminal: '(a2atb-rank-worker-0")
    assert "does not name the log" in judge({"verdicts": [verdict] + others}, "PASS 1/5 ...\n")[-1]


def test_sweep_lineage_judge_holds_docs_findings_first_appearance():
    written = sweeps.documented_first()
    ids = [f.id for i in integrations.engines() for f in i.findings()]
    assert set(ids) <= set(written), set(ids) - set(written)  # every finding has its row
    engine_release, _, flashinfer = written["VLLM-002"].partition(" on FlashInfer ")
    fields = {"finding": "VLLM-002", "engine": engine_release, "flashinfer": flashinfer, "outcome": "reproduces"}
    assert sweeps.judge_lineage([dict(fields)], "") == []
    later = dict(fields, flashinfer="9.9.9")
    assert sweeps.judge_lineage([later], "") == [
        f"VLLM-002 first reproduces {engine_release} on FlashInfer 9.9.9; docs/findings.md says {written['VLLM-002']}"]
    gone = dict(fields, outcome="passes")
    assert "first reproduces nowhere" in sweeps.judge_lineage([gone], "")[0]


def test_sweep_runs_its_command_apart_and_logs_it(tmp_path):
    one = sweeps.Sweep("one scenario", ("run", "--layout", "2,1,2,1", "--tokens", "3,1"), sweeps.judge_models)
    o = sweeps.run(one, str(tmp_path))
    assert o.passed, o.problems
    assert (tmp_path / "one-scenario.log").read_text().startswith("$ a2a-testbed run --layout 2,1,2,1")
    refused = sweeps.Sweep("refused", ("run", "--tokens", "x"), sweeps.judge_models)
    (problem,) = sweeps.run(refused, str(tmp_path)).problems
    assert problem.startswith("exited 2 without writing its JSON")
    slow = sweeps.run(one, str(tmp_path), timeout_s=0.5)
    assert len(slow.problems) == 1 and slow.problems[0].startswith("did not finish in")


def test_sweep_shard_partitions_the_catalogue():
    items = list(range(7))
    parts = [sweeps.shard(items, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(x for p in parts for x in p) == items and all(parts)
    for bad in ("0/3", "4/3", "1-3", "a/b"):
        with pytest.raises(ValueError, match=r"--shard: I/N with 1 <= I <= N"):
            sweeps.shard(items, bad)


@pytest.mark.parametrize("argv, message", [
    (("--only", "no-such-sweep"), "--only: no sweep 'no-such-sweep' here"),
    (("--jobs", "0"), "--jobs: must be > 0"),
    (("--shard", "3/2"), "--shard: I/N with 1 <= I <= N, got '3/2'"),
])
def test_sweep_cli_refuses_bad_input_in_one_line(capsys, argv, message):
    assert main(["sweep", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"a2a-testbed sweep: error: {message}") and "\n" not in err


def test_sweep_list_names_each_command(capsys):
    assert main(["sweep", "--list"]) == 0
    out = capsys.readouterr().out
    assert "models" in out and "a2a-testbed run --models" in out


def test_hunt_meets_every_kind_of_deployment_first():
    order = kill_order(MATRIX)
    assert sorted(i for i, _ in order) == list(range(1, len(MATRIX) + 1))
    assert all(MATRIX[i - 1] is sc for i, sc in order)
    kinds = {(sc.path, sc.layout.pp > 1, sc.layout.tp > 1, sc.sequence_parallel) for sc in MATRIX}
    first = order[:len(kinds)]
    assert {(sc.path, sc.layout.pp > 1, sc.layout.tp > 1, sc.sequence_parallel) for _, sc in first} == kinds
