"""``a2a-testbed sweep``'s machinery on small cases: the catalogue follows the adapters, each
judge finds what it exists to find in a verdict it is handed, a sweep's command runs in a
process of its own with its output in a log, and a hunt meets every kind of deployment early.
The catalogues themselves run in CI as sweeps, never here."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from types import SimpleNamespace

import pytest

from testbed import integrations
from testbed.cli import main
from testbed.harness import sweeps
from testbed.harness.matrix import MATRIX
from testbed.harness.runner import features, kill_order

PASSING = {"cli": "run --layout 2,1,2,1 --profile 0.7.1 --seed 0", "label": "two ranks", "passed": True,
           "worst_x_tolerance": 0.2, "layer_errors": {"s0.l0": 0.2}, "failures": [], "known": []}


@pytest.mark.parametrize("name", [pytest.param(i.name, marks=pytest.mark.needs(i.name)) for i in integrations.engines()])
def test_sweep_catalogue_has_every_release_the_adapter_drives(name):
    """Nothing sampled: the engine's whole history is one sweep (every release's matrix,
    mutants and findings, each release held to their judges), the installed release's matrix
    runs through the reuse differential, the engine and serve levels on the installed and the
    newest release, and the model matrix with every release."""
    integration = integrations.get(name)
    engine = integration.engine
    catalogue = sweeps.catalogue()
    (history,) = [s for s in catalogue if s.argv[0] == "history" and s.engine == name]
    assert history.argv[:3] == ("history", "--integration", name) and "--release" not in history.argv
    assert ("--findings" in history.argv) == bool(integration.findings()) and history.keeps
    assert {r for r, _ in sweeps.releases(engine)} == set(engine.history) | set(engine.other_releases)
    installed = engine.release()[0]
    assert f"{name} {installed} reuse differential" in {s.name for s in catalogue}
    key = lambda r: tuple(int(x) for x in re.findall(r"\d+", r))  # noqa: E731
    newest = max(engine.releases(), key=key)
    # The newest release where it is newer than the installed one (SGLang's installed 0.5.23 is its newest).
    releases = [installed] + ([newest] if key(newest) > key(installed) else [])
    for level in ("engine", "serve"):
        on = [s.name for s in catalogue if s.argv[0] == level and s.engine == name and "--mutants" not in s.argv]
        if on:
            assert on == [f"{name} {r} {level} matrix" for r in releases]
    models = next(s for s in catalogue if s.name == "models")
    assert "--rotate" not in models.argv and "impl matrix" in {s.name for s in catalogue}
    heaviest = sweeps.groups(catalogue)[0]
    assert sum(map(sweeps.weight, heaviest)) >= sweeps.weight(history)  # the heaviest group starts first


def _kept(root, release, matrix=None, mutants=None, cells=None):
    kept = root / release
    kept.mkdir()
    for name, data in (("matrix", matrix), ("mutants", mutants), ("findings", cells)):
        if data is not None:
            (kept / f"{name}.json").write_text(json.dumps(data))
            (kept / f"{name}.txt").write_text("")
    return str(kept)


def test_sweep_history_judge_holds_each_release_to_its_matrix_mutants_and_findings(tmp_path):
    written = sweeps.documented_first()
    born, _, flashinfer = written["VLLM-002"].partition(" on FlashInfer ")
    first = born.rsplit(" ", 1)[1]
    history = (first, "90.0.0", "91.0.0", "92.0.0", "93.0.0")
    engine = SimpleNamespace(name="vllm", label="vLLM", history=history, default_pin="0.7.1",
                             release=lambda source=None: (source or first, "0.7.1"), releases=lambda: history[1:])
    integration = SimpleNamespace(name="vllm", engine=engine, findings=lambda: ["VLLM-002"])
    hunted = {"mutants": [{"mutant": "m", "killed": True, "by": "reduce @ 1"}], "not_applicable": []}
    cell = {"finding": "VLLM-002", "engine": born, "flashinfer": flashinfer, "outcome": "reproduces"}
    failed = dict(PASSING, passed=False, failures=[{"invariant": "reduce", "evidence": "reduced twice"}])
    row = {"refused": "", "failures": []}
    rows = [dict(row, release=first, kept=_kept(tmp_path, first, {"scenarios": [PASSING]}, hunted, [cell])),
            dict(row, release="90.0.0", refused="--integration vllm: vLLM 90.0.0 has no FusedMoE"),
            dict(row, release="91.0.0", kept=_kept(tmp_path, "91.0.0", {"scenarios": [failed]}, hunted,
                                                  [dict(cell, engine="vLLM 91.0.0")])),
            dict(row, release="92.0.0", kept=_kept(tmp_path, "92.0.0", {"scenarios": [PASSING]}),
                 failures=["REUSE DIFFERS 1: with reuse FAIL; without PASS", "FAIL a"])]
    judge = sweeps.judge_history(integration)
    assert judge({"releases": rows[:1]}, "") == [f"{r}: not in the history's rows" for r in history[1:]]
    problems = judge({"releases": rows}, "")
    assert problems[0] == "93.0.0: not in the history's rows"
    assert problems[1] == "90.0.0: refused: --integration vllm: vLLM 90.0.0 has no FusedMoE"
    assert problems[2].startswith("91.0.0 matrix: FAIL two ranks: [reduce] reduced twice  reproduce: ")
    assert problems[3:5] == [f"92.0.0 {name}: no JSON was kept  reproduce: a2a-testbed history --integration vllm "
                             f"--release 92.0.0" for name in ("mutants", "findings")]
    assert problems[5:] == ["92.0.0: REUSE DIFFERS 1: with reuse FAIL; without PASS"]
    assert judge({"releases": []}, "")[-1] == "no release ran"


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


def test_sweep_whole_matrix_judge_finds_a_scenario_left_out():
    assert sweeps.judge_whole({"scenarios": [PASSING]}, "PASS ...\n") == []
    (problem,) = sweeps.judge_whole({"scenarios": [PASSING]}, "NOT RUN  2 (--show-not-run lists each): 2 x rule\n")
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
            "not_applicable": [{"mutant": m.name, "kind": "absent", "why": "no such code"}]}
    assert sweeps.judge_mutants(engine, str(tmp_path / "9.0.0"))(data, "") == []
    equivalent = copy.deepcopy(data)  # an equivalent mutant's code is there: its probe names the guard
    equivalent["not_applicable"][0].update(kind="equivalent", why="a guard undoes it")
    assert sweeps.judge_mutants(engine, str(tmp_path / "9.0.1"))(equivalent, "") == []
    equivalent["not_applicable"][0]["why"] = ""
    (problem,) = sweeps.judge_mutants(engine, str(tmp_path / "9.0.1"))(equivalent, "")
    assert problem == f"{m.name} was left out as equivalent without a reason"
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


def test_sweep_lineage_judge_holds_docs_findings_first_appearance_release_by_release():
    written = sweeps.documented_first()
    vllm = integrations.get("vllm")
    ids = [f.id for i in integrations.engines() for f in i.findings()]
    assert set(ids) <= set(written), set(ids) - set(written)  # every finding has its row
    born, _, flashinfer = written["VLLM-002"].partition(" on FlashInfer ")
    release = born.rsplit(" ", 1)[1]
    cell = {"finding": "VLLM-002", "engine": born, "flashinfer": flashinfer, "outcome": "reproduces"}
    assert sweeps.judge_lineage(vllm, release)([cell], "") == []
    later = dict(cell, flashinfer="9.9.9")
    assert sweeps.judge_lineage(vllm, release)([later], "") == [
        f"VLLM-002 first reproduces {born} on FlashInfer 9.9.9; docs/findings.md says {written['VLLM-002']}"]
    gone = dict(cell, outcome="passes")
    assert "first reproduces on no FlashInfer release" in sweeps.judge_lineage(vllm, release)([gone], "")[0]
    earlier = dict(cell, engine="vLLM 0.0.1")
    assert "before where docs/findings.md says" in sweeps.judge_lineage(vllm, "0.0.1")([earlier], "")[0]
    assert sweeps.judge_lineage(vllm, "99.0.0")([dict(cell, engine="vLLM 99.0.0")], "") == []  # later: not bound
    assert sweeps.judge_lineage(vllm, release)([dict(cell, finding="VLLM-999")], "")[0].startswith(
        "VLLM-999: docs/findings.md's lineage table says nothing (no row)")
    assert sweeps.judge_lineage(vllm, release)([], "") == ["no cell was surveyed"]


def test_sweep_group_runs_its_commands_in_one_process_and_logs_them(tmp_path):
    one = sweeps.Sweep("one scenario", ("run", "--layout", "2,1,2,1", "--tokens", "3,1"), sweeps.judge_whole, group="g")
    refused = sweeps.Sweep("refused", ("run", "--tokens", "x"), sweeps.judge_whole, group="g")
    passed, bad = sweeps.run([one, refused], str(tmp_path))
    assert passed.passed, passed.problems
    assert passed.seconds > 0 and passed.summary.startswith("1 passed, 0 failed")
    log = (tmp_path / "g.log").read_text()
    assert log.startswith("$ a2a-testbed run --layout 2,1,2,1 --tokens 3,1\n$ a2a-testbed run --tokens x\n")
    (problem,) = bad.problems
    assert problem.startswith("exited 2 without writing its JSON")
    slow, never = sweeps.run([one, refused], str(tmp_path), timeout_s=0.5)
    assert slow.problems == ["did not finish in 1 s"]
    assert never.problems == ["did not run: its group's process ended before it (see its log)"]


def test_sweep_shard_partitions_the_catalogue():
    items = list(range(7))
    parts = [sweeps.shard(items, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(x for p in parts for x in p) == items and all(parts)
    for bad in ("0/3", "4/3", "1-3", "a/b"):
        with pytest.raises(ValueError, match=r"--shard: I/N with 1 <= I <= N"):
            sweeps.shard(items, bad)


@pytest.mark.parametrize("argv, message", [
    (("--only", "no-such-sweep"), "--only: no sweep 'no-such-sweep' here"),
    (("--skip", "no-such-sweep"), "--skip: no sweep 'no-such-sweep' here"),
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


def test_hunt_meets_every_feature_within_the_first_scenarios():
    order = kill_order(MATRIX)
    assert sorted(i for i, _ in order) == list(range(1, len(MATRIX) + 1))
    assert all(MATRIX[i - 1] is sc for i, sc in order)
    every = frozenset().union(*map(features, MATRIX))
    firsts = [n for n in range(1, len(order) + 1) if frozenset().union(*(features(sc) for _, sc in order[:n])) == every]
    assert firsts and firsts[0] < len(MATRIX) / 2
    brought = [features(sc) - frozenset().union(*(features(s) for _, s in order[:n])) for n, (_, sc) in enumerate(order)]
    assert all(brought[:firsts[0]])  # each scenario tried first brought a feature not yet met
    lone = [f for f in every if sum(f in features(sc) for sc in MATRIX) == 1]  # one scenario has it
    assert lone and all(any(f in features(sc) for _, sc in order[:firsts[0]]) for f in lone)
    rest = [i for i, _ in order[firsts[0]:]]
    assert rest == sorted(rest)  # then matrix order




def test_hunt_tries_the_hinted_scenario_first_whatever_release_it_was_moved_to():
    from testbed.harness.matrix import on_integration
    from testbed.harness.runner import same_entry

    moved = on_integration("impl", "0.6.16")[0]
    for pick in (moved[0], moved[len(moved) // 2], moved[-1]):
        hint = pick.label.replace("on 0.6.16]", "on 0.7.2.post1]")  # the label another release's run gave it
        assert hint != pick.label and same_entry(pick.label, hint)
        order = kill_order(moved, hint)
        assert order[0][1] is pick and sorted(i for i, _ in order) == list(range(1, len(moved) + 1))
    assert kill_order(moved, "no such scenario [impl on 0.6.16]") == kill_order(moved)
    assert not same_entry(moved[0].label, moved[1].label)


def test_sweep_skip_leaves_out_that_sweep_alone_and_says_so(capsys):
    """A time-boxed job leaves a sweep to another (--skip): every other sweep still runs, and
    the one left out is named with the command that runs it."""
    assert main(["sweep", "--list"]) == 0
    every = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("left out")]
    assert main(["sweep", "--list", "--skip", "models"]) == 0
    out = capsys.readouterr().out.splitlines()
    kept = [line for line in out if not line.startswith("left out")]
    assert sorted(kept) == sorted(line for line in every if not line.startswith("models "))
    assert "left out: models (--skip; a2a-testbed sweep --only 'models' runs it)" in out


def test_sweep_served_run_apart_or_with_the_others(capsys):
    """CI runs the served sweeps after the others (--served without, then only): between them,
    the whole catalogue, each sweep once."""
    listed = {}
    for served in ("with", "without", "only"):
        assert main(["sweep", "--list", "--served", served]) == 0
        listed[served] = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("left out")]
    assert all(("a2a-testbed serve " in line) for line in listed["only"])
    assert not any("a2a-testbed serve " in line for line in listed["without"])
    assert sorted(listed["only"] + listed["without"]) == sorted(listed["with"])


def _served(counts: list[tuple[int, ...]], world: int) -> dict:
    steps = {str(r): [{"forward": f, "rows": c[r], "dp_tokens": list(c)} for f, c in enumerate(counts)]
             for r in range(world)}
    return {"scenario": "DP entry", "reproduce": "a2a-testbed serve", "passed": True, "failures": [],
            "dispatches_per_rank": {str(r): 2 * len(counts) for r in range(world)}, "steps": steps}


@pytest.mark.parametrize("name, idle, refused", [
    ("vllm", (2, 1, 1, 1), (2, 1, 0, 0)),   # vLLM's idle DP rank enters with its 1-token dummy batch
    ("sglang", (2, 1, 0, 0), None),         # SGLang's with its 0-token idle batch
])
def test_sweep_serve_judge_holds_each_engine_to_its_own_step_rule(name, idle, refused):
    """An idle DP rank's step is what the integration's step rule says it is: a 0 where vLLM
    would run its dummy batch is a problem, the same 0 of SGLang's idle batch is not; and
    every engine process steps every forward with the same DP token counts."""
    judge = sweeps.judge_serve(integrations.get(name))
    out = "own output: /tmp/x.log\n  line\nPASS   1/1   DP entry\n"
    counts = [(3, 2, 1, 1), idle, idle]
    assert judge([_served(counts, 4)], out) == []
    if refused is not None:
        problems = judge([_served([(3, 2, 1, 1), refused], 4)], out)
        assert len(problems) == 1 and f"counts {refused}" in problems[0] and "step rule" in problems[0]
    short = _served(counts, 4)
    short["steps"]["3"].pop()
    assert "not every engine process stepped every forward" in judge([short], out)[0]
    other = _served(counts, 4)
    other["steps"]["1"][0]["dp_tokens"] = [3, 2, 2, 1]
    assert "rank 1's forwards had other DP token counts" in judge([other], out)[0]
    assert judge([_served(counts, 4)], out.replace("PASS", "pass")) == ["0 verdict lines for 1 entries"]
