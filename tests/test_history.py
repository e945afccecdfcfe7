"""``a2a-testbed history``: each engine release run (its matrix, then its mutants) or refused in
one line, from the JSON its commands write; the commands themselves stand in here."""

from __future__ import annotations

import json
from types import SimpleNamespace

from testbed.harness import history


def _integration(pins):
    engine = SimpleNamespace(label="vLLM", release=lambda source=None: ("0.33.0", pins[source or "0.33.0"]),
                             pinned=lambda source=None: pins[source or "0.33.0"])
    return SimpleNamespace(name="vllm", engine=engine)


def _fake_commands(monkeypatch, outcomes):
    """Each release's group of commands answers from ``outcomes[(command, release)]``: a dict
    written as its --json, or a refusal line on stderr with exit 2."""
    calls = []

    def group(commands):
        codes, stderr, texts = [], "", []
        for cmd in commands:
            command = cmd[0]
            release = cmd[cmd.index("--vllm-source") + 1] if "--vllm-source" in cmd else "0.33.0"
            calls.append((command, release))
            answer = outcomes.get((command, release), "refused as its matrix was")
            if isinstance(answer, str):
                codes.append(2)
                stderr += f"a2a-testbed {command}: error: {answer}\n"
                texts.append("")
                continue
            with open(cmd[cmd.index("--json") + 1], "w") as f:
                json.dump(answer, f)
            codes.append(0)
            texts.append(f"{command} of {release} printed this\n")
        return codes, stderr, texts

    monkeypatch.setattr(history, "_group", group)
    return calls


def test_history_rows_run_refused_and_failed(monkeypatch):
    scenarios = [{"label": "a", "passed": True, "known": []}, {"label": "b", "passed": True, "known": ["VLLM-005"]},
                 {"label": "c", "passed": False, "known": [], "testbed_error": ""},
                 {"label": "d", "passed": False, "known": [], "testbed_error": "rank 0: AdapterSetupError: ..."}]
    calls = _fake_commands(monkeypatch, {
        ("run", "0.33.0"): {"failed": 1, "testbed_errors": 1, "not_run": 31, "seconds": 9.0, "scenarios": scenarios},
        ("mutants", "0.33.0"): {"killed": 2, "total": 3, "seconds": 5.0, "not_applicable": [{"mutant": "x"}],
                                "mutants": [{"mutant": "m1", "killed": True}, {"mutant": "m2", "killed": True},
                                            {"mutant": "m3", "killed": False}]},
        ("run", "0.22.0"): "--integration vllm: vLLM 0.22.0 has no ...FusedMoEFactory, which the adapter drives",
    })
    rows = history.survey(_integration({"0.33.0": "0.7.2.post1", "0.22.0": "0.6.11.post2"}), ["0.22.0", "0.33.0"],
                          log=lambda line: None)
    assert calls == [("run", "0.22.0"), ("mutants", "0.22.0"), ("run", "0.33.0"), ("mutants", "0.33.0")]
    refused, ran = rows
    assert refused.refused.endswith("which the adapter drives") and not refused.matrix and not refused.mutants
    assert refused.served_by == "0.6.11.post2 (served by 0.6.11)"
    assert ran.matrix == {"passed": 1, "failed": 1, "known": 1, "testbed_errors": 1, "not_run": 31, "seconds": 9.0}
    assert ran.mutants == {"killed": 2, "total": 3, "not_applicable": 1, "seconds": 5.0}
    assert ran.failures == ["FAIL c", "ERROR d", "SURVIVED m3"]
    table = history.markdown(rows).splitlines()
    assert table[2].startswith("| 0.22.0 | 0.6.11.post2 (served by 0.6.11) | refused: --integration vllm: vLLM 0.22.0")
    assert table[3] == ("| 0.33.0 | 0.7.2.post1 | 1 / 1 / 1 / 1 / 31 | 2 of 3 (1 N/A) | "
                        "FAIL c; ERROR d; SURVIVED m3 |")


def test_history_unserved_pin_named_without_the_served_list(monkeypatch):
    _fake_commands(monkeypatch, {("run", "0.18.0"): "--integration vllm: vLLM 0.18.0 pins flashinfer-python 0.5.3, "
                                                    "which no profile of the fake serves: it serves 0.6.3, 0.6.4"})
    (row,) = history.survey(_integration({"0.33.0": "0.7.2.post1", "0.18.0": "0.5.3"}), ["0.18.0"],
                            log=lambda line: None)
    assert row.served_by == "" and row.cells()[1] == "0.5.3 (none)"
    assert row.cells()[2].endswith("which no profile of the fake serves")


def _engine_with_trees(trees: dict, pin: str = "0.6.16.post3"):
    """An engine whose releases all pin ``pin`` and whose files are ``trees[release]``."""
    class Package:
        def __init__(self, files):
            self.files = files

        def read(self, path):
            return self.files[path]

    engine = SimpleNamespace(label="vLLM", release=lambda source=None: (source or "0.33.0", pin),
                             pinned=lambda source=None: pin,
                             package=lambda source=None: Package(trees[source or "0.33.0"]))
    return SimpleNamespace(name="vllm", engine=engine)


def test_history_identical_release_takes_its_twins_verdicts(monkeypatch):
    """0.27.1 holds every file 0.27.0's run loaded byte for byte (its version file aside): it is
    not run, its row is 0.27.0's and says so; 0.28.0 changed one of them, so it runs."""
    run = {"failed": 0, "testbed_errors": 0, "not_run": 38, "seconds": 9.0,
           "scenarios": [{"label": "a", "passed": True, "known": []}], "engine_modules": ["vllm", "vllm._version", "vllm.config"]}
    hunts = {"killed": 1, "total": 1, "seconds": 1.0, "not_applicable": [], "mutants": [{"mutant": "m", "killed": True}]}
    calls = _fake_commands(monkeypatch, {(c, r): (run if c == "run" else hunts)
                                         for c in ("run", "mutants") for r in ("0.27.0", "0.28.0")})
    tree = {"vllm/__init__.py": "x", "vllm/_version.py": "v = '0.27.0'", "vllm/config.py": "c"}
    trees = {"0.27.0": tree, "0.27.1": tree | {"vllm/_version.py": "v = '0.27.1'"},
             "0.28.0": tree | {"vllm/config.py": "c2"}}
    lines = []
    rows = history.survey(_engine_with_trees(trees), ["0.27.0", "0.27.1", "0.28.0"], log=lines.append)
    assert [r for _, r in calls] == ["0.27.0", "0.27.0", "0.28.0", "0.28.0"]
    first, twin, changed = rows
    assert twin.same_as == "0.27.0 (2 files identical, the version file aside)" and not changed.same_as
    assert (twin.matrix, twin.mutants) == (first.matrix, first.mutants) and twin.release == "0.27.1"
    assert any(line.startswith("vLLM 0.27.1: same all-to-all code as 0.27.0 (2 files identical") for line in lines)
    assert history.markdown(rows).splitlines()[3].endswith("| verdicts of 0.27.0: same all-to-all code "
                                                          "(2 files identical, the version file aside) |")
    assert history.summary(rows, 12.0) == ("3 releases: 2 run, 1 with an identical earlier release's verdicts, "
                                           "0 refused; 0 with failures, in 12.0 s")


def test_history_findings_in_the_release_process_kept_per_release_and_copied_for_a_twin(monkeypatch, tmp_path):
    """With findings, a release's survey runs third in its process; with keep, each command's
    JSON and output stay in a folder of the release, and a twin's copy names its own release."""
    run = {"failed": 0, "testbed_errors": 0, "not_run": 0, "seconds": 1.0,
           "scenarios": [{"label": "a", "passed": True, "known": []}], "engine_modules": ["vllm", "vllm.config"]}
    hunts = {"killed": 1, "total": 1, "seconds": 1.0, "not_applicable": [], "mutants": [{"mutant": "m", "killed": True}]}
    cells = [{"finding": "VLLM-001", "engine": "vLLM 0.27.0", "flashinfer": "0.6.16", "outcome": "reproduces"},
             {"finding": "VLLM-002", "engine": "vLLM 0.27.0", "flashinfer": "0.6.16", "outcome": "passes"}]
    calls = _fake_commands(monkeypatch, {("run", "0.27.0"): run, ("mutants", "0.27.0"): hunts,
                                         ("findings", "0.27.0"): cells})
    tree = {"vllm/__init__.py": "x", "vllm/config.py": "c"}
    first, twin = history.survey(_engine_with_trees({"0.27.0": tree, "0.27.1": tree}), ["0.27.0", "0.27.1"],
                                 log=lambda line: None, findings=True, keep=tmp_path)
    assert calls == [("run", "0.27.0"), ("mutants", "0.27.0"), ("findings", "0.27.0")]
    assert first.findings == {"reproduce": ["VLLM-001"], "surveyed": 2}
    assert first.kept == str(tmp_path / "0.27.0") and twin.kept == str(tmp_path / "0.27.1")
    for name in ("matrix", "mutants", "findings"):
        assert (tmp_path / "0.27.0" / f"{name}.txt").read_text().endswith("of 0.27.0 printed this\n")
    assert json.loads((tmp_path / "0.27.0" / "mutants.json").read_text()) == hunts
    assert {c["engine"] for c in json.loads((tmp_path / "0.27.1" / "findings.json").read_text())} == {"vLLM 0.27.1"}
    released = history.as_json([first], "history", 1.0)["releases"][0]
    assert released["kept"] and released["findings"]["reproduce"] == ["VLLM-001"]
    plain = history.survey(_engine_with_trees({"0.27.0": tree}), ["0.27.0"], log=lambda line: None)
    assert not {"kept", "findings"} & set(history.as_json(plain, "history", 1.0)["releases"][0])


def test_history_hunts_first_with_what_killed_each_mutant_in_an_ended_release(monkeypatch):
    """A release's mutants are hunted first by the scenarios that killed them in releases that
    ended before it (the nearest winning); the first release, with none ended, gets no hints."""
    hints_seen = {}
    run = {"failed": 0, "testbed_errors": 0, "not_run": 0, "seconds": 1.0, "scenarios": []}

    def hunts(killer):
        return {"killed": 2, "total": 3, "seconds": 1.0, "not_applicable": [],
                "mutants": [{"mutant": "m1", "killed": True, "scenario": f"{killer} [vllm on 0.6.16]"},
                            {"mutant": "m2", "killed": True, "scenario": ""},
                            {"mutant": "m3", "killed": False, "scenario": ""}]}

    calls = _fake_commands(monkeypatch, {("run", r): run for r in ("0.20.0", "0.21.0", "0.22.0")}
                           | {("mutants", "0.20.0"): hunts("far"), ("mutants", "0.21.0"): hunts("near"),
                              ("mutants", "0.22.0"): hunts("x")})
    group = history._group

    def spy(commands):
        for cmd in commands:
            if "--hints" in cmd:
                with open(cmd[cmd.index("--hints") + 1]) as f:
                    hints_seen[cmd[cmd.index("--vllm-source") + 1]] = json.load(f)["mutants"]
        return group(commands)

    monkeypatch.setattr(history, "_group", spy)
    pins = {"0.33.0": "0.6.16", "0.20.0": "0.6.16", "0.21.0": "0.6.16", "0.22.0": "0.6.16"}
    rows = history.survey(_integration(pins), ["0.20.0", "0.21.0", "0.22.0"], log=lambda line: None, jobs=1)
    assert [r for _, r in calls] == ["0.20.0", "0.20.0", "0.21.0", "0.21.0", "0.22.0", "0.22.0"]
    assert "0.20.0" not in hints_seen
    assert hints_seen["0.21.0"] == [{"mutant": "m1", "killed": True, "scenario": "far [vllm on 0.6.16]"}]
    assert hints_seen["0.22.0"] == [{"mutant": "m1", "killed": True, "scenario": "near [vllm on 0.6.16]"}]
    assert rows[1].kills == {"m1": "near [vllm on 0.6.16]"}
    assert all("kills" not in row for row in history.as_json(rows, "history", 1.0)["releases"])


def test_history_reuse_differential_runs_each_matrix_again_and_a_difference_fails_the_row(monkeypatch):
    run = {"failed": 0, "testbed_errors": 0, "not_run": 0, "seconds": 1.0, "scenarios": [],
           "reuse_differs": ["2: vLLM ...: with reuse FAIL ...; without PASS ..."]}
    seen = []
    calls = _fake_commands(monkeypatch, {("run", "0.33.0"): run})
    group = history._group
    monkeypatch.setattr(history, "_group", lambda commands: (seen.extend(commands), group(commands))[1])
    (row,) = history.survey(_integration({"0.33.0": "0.7.2.post1"}), ["0.33.0"], mutants=False,
                            log=lambda line: None, differential=True)
    assert calls == [("run", "0.33.0")] and "--reuse-differential" in seen[0]
    assert row.failures == ["REUSE DIFFERS 2: vLLM ...: with reuse FAIL ...; without PASS ..."]
