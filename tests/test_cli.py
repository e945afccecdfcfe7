from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "a2a-testbed"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    if not SCRIPT.exists():
        pytest.fail(f"console script {SCRIPT} is not installed: run `pip install -e .[test]`")
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def _here(capsys, *args: str) -> subprocess.CompletedProcess:
    """``a2a-testbed ARGS`` in this process (no interpreter to start; a scenario still runs on
    its own rank processes)."""
    from testbed.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def test_cli_help_lists_commands(capsys):
    from testbed.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert all(command in out for command in ("run", "mutants", "engine", "findings", "sweep", "version"))


def test_cli_version():
    done = _cli("version")
    assert done.returncode == 0
    assert done.stdout.startswith("a2a-testbed 0.1.0 (torch ")


def test_cli_run_selfcheck_prints_what_it_ran(capsys):
    done = _here(capsys, "run", "--job", "selfcheck", "--layout", "2,1,2,1", "--layout", "w4tp1dp2pp2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS w2tp1dp2pp1" in done.stdout and "PASS w4tp1dp2pp2" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["layouts"] == ["w2tp1dp2pp1", "w4tp1dp2pp2"]
    assert (summary["passed"], summary["failed"]) == (2, 0)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def test_cli_sigterm_ends_the_command_with_its_clean_up():
    """SIGTERM (a cancelled CI job, an orchestrator's stop) ends a command as Ctrl-C does: the
    command's own exit (status 143), its processes and its shared memory gone with it."""
    from fakes.arena import PREFIX_ROOT, SHM_DIR, pid_alive

    p = subprocess.Popen([str(SCRIPT), "run", "--job", "selfcheck", "--fault", "stall", "--timeout", "60"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(SHM_DIR.glob(f"{PREFIX_ROOT}-{p.pid}-*")) and time.monotonic() < deadline:
            time.sleep(0.05)  # observing the run's start, not synchronising with it
        assert list(SHM_DIR.glob(f"{PREFIX_ROOT}-{p.pid}-*")), "the run never mapped its arena"
        started = _descendants(p.pid)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        p.kill()
    assert not list(SHM_DIR.glob(f"{PREFIX_ROOT}-{p.pid}-*"))
    deadline = time.monotonic() + 10
    while [d for d in started if pid_alive(d)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started and not [d for d in started if pid_alive(d)]


def test_cli_run_wrong_group_barrier_fault_is_caught_as_expected(capsys):
    done = _here(capsys, "run", "--job", "selfcheck", "--layout", "4,1,2,2", "--fault", "wrong-group-barrier",
                  "--timeout", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "caught as expected: ScenarioTimeoutError" in done.stdout and "deadlock or hang" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1])["fault"] == "wrong-group-barrier"


@pytest.mark.parametrize("argv, message", [
    (("--job", "selfcheck", "--layout", "6,4,1,1"), "--layout: ParallelLayout: world_size 6 is not divisible by tp 4"),
    (("--layout", "6,4,1,1"), "--layout: ParallelLayout: world_size 6 is not divisible by tp 4"),
    (("--top-k", "11"), "--top-k: FlashInfer 0.7.2's one-sided kernels are instantiated for top_k in {1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22} (SWITCH_TOP_K), got 11"),
    (("--hidden", "100", "--stages", "nvfp4:8"), "--hidden: nvfp4 needs hidden divisible by 16"),
    (("--stages", "nvfp4:8;bf16:8"), "--stages: has 2 stage(s)"),
    (("--fault", "crash"), "--fault crash is a cluster fault"),
    (("--mutant", "nope"), "--mutant: unknown mutant 'nope'"),
    (("--backend", "flashinfer", "--matrix-profile", "0.7.4"), "--matrix-profile moves the fake to a release"),
])
def test_cli_run_rejects_bad_input_in_one_line(capsys, argv, message):
    from testbed.cli import main

    assert main(["run", *argv]) == 2  # refused before any rank starts, so in this process
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"a2a-testbed run: error: {message}"), line


def test_cli_run_scenario_writes_json_and_html(tmp_path, capsys):
    line = ("--layout 4,2,2,1 --stages nvfp4:8,bf16:12 --tokens 0,5 --tokens 3,3 --routing spread "
            "--profile 0.6.14").split()
    done = _here(capsys, "run", *line, "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("1 passed, 0 failed")
    data = json.loads((tmp_path / "r.json").read_text())
    (sc,) = data["scenarios"]
    assert sc["passed"] and sc["cli"].startswith("a2a-testbed run --layout 4,2,2,1 --stages ")
    assert " --path one_sided --profile 0.6.14 " in sc["cli"]
    assert [len(stage) for stage in sc["builds"]] == [2]
    page = (tmp_path / "r.html").read_text()
    assert "1 passed, 0 failed" in page and "<svg" in page and "workspace per build (KiB per rank)" in page


def test_cli_run_against_a_mutant_fails_with_the_evidence(tmp_path, capsys):
    done = _here(capsys, "run", "--layout", "4,2,2,1", "--stages", "bf16:8", "--tokens", "2,3",
                "--mutant", "double-reduce-one-sided", "--junit-xml", str(tmp_path / "r.xml"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[reduce]" in done.stdout and "output ~ 2 x the reference" in done.stdout
    assert "reproduce: a2a-testbed run --layout 4,2,2,1" in done.stdout
    suite = ET.parse(tmp_path / "r.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("1", "1")
    (failure,) = suite.iter("failure")
    assert failure.get("message").startswith("[") and "output ~ 2 x the reference" in failure.text
    assert "reproduce: a2a-testbed run --layout 4,2,2,1" in failure.text


def _matrix_verdicts():
    """Every matrix scenario judged (one failed), and the scenarios the matrix moved to
    FlashInfer 0.7.4 refuses, with their rules: a run's results without running it."""
    from testbed.harness.invariants import Failure, Verdict
    from testbed.harness.matrix import MATRIX, on_release

    verdicts = [Verdict(sc, seconds=1.0) for sc in MATRIX]
    verdicts[2].failures = [Failure("reduce", "output ~ 2 x the reference")]
    return verdicts, on_release("0.7.4")[1]


def test_cli_junit_xml_one_case_per_scenario_and_not_run(tmp_path):
    import argparse

    from testbed.commands.run import _reports

    verdicts, refused = _matrix_verdicts()
    assert len(refused) > 1  # 0.7.4 has no MoeAlltoAll: custom combine signatures, odd EP sizes
    _reports(argparse.Namespace(json=None, html=None, junit_xml=str(tmp_path / "m.xml")), verdicts, refused, 3.0)
    suite = ET.parse(tmp_path / "m.xml").getroot()
    assert len(list(suite.iter("testcase"))) == len(verdicts) + len(refused)
    assert (int(suite.get("failures")), int(suite.get("skipped"))) == (1, len(refused))
    assert [s.get("message") for s in suite.iter("skipped")] == [f"NOT RUN: {rule}" for _, rule in refused]


def test_cli_not_run_one_line_counted_per_rule_or_each_listed(capsys):
    from collections import Counter

    from testbed.commands.run import _not_run

    _, refused = _matrix_verdicts()
    _not_run(refused, each=False)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(f"NOT RUN  {len(refused)} (--show-not-run lists each): ")
    for rule, n in Counter(rule for _, rule in refused).items():
        assert f"{n} x {rule}" in line
    _not_run(refused, each=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"NOT RUN  {sc.short()}  ({sc.label}): {rule}" for sc, rule in refused]


def test_cli_junit_xml_one_case_per_fuzz_example_and_mutant(tmp_path, capsys):
    fz = _here(capsys, "fuzz", "--examples", "2", "--junit-xml", str(tmp_path / "f.xml"))
    assert fz.returncode == 0, fz.stdout + fz.stderr
    assert [c.get("classname") for c in ET.parse(tmp_path / "f.xml").getroot().iter("testcase")] == ["fuzz.impl"] * 2
    mu = _here(capsys, "mutants", "--only", "double-reduce-one-sided", "--junit-xml", str(tmp_path / "u.xml"))
    assert mu.returncode == 0, mu.stdout + mu.stderr
    (case,) = ET.parse(tmp_path / "u.xml").getroot().iter("testcase")
    assert case.get("name") == "double-reduce-one-sided" and "killed by reduce" in case.find("system-out").text


def test_cli_mutants_hints_try_the_named_scenario_first(tmp_path, capsys):
    """``--hints``: the scenario another run named is tried first; it kills there, so the
    verdict names its matrix index; a file that is no mutants JSON is refused naming the flag."""
    first = _here(capsys, "mutants", "--only", "double-reduce-one-sided", "--json", str(tmp_path / "a.json"))
    assert first.returncode == 0, first.stdout + first.stderr
    (hunt,) = json.loads((tmp_path / "a.json").read_text())["mutants"]
    assert hunt["killed"] and hunt["scenario"]
    # Name a later scenario the mutant also fails (the last of the matrix that reduces one-sided output).
    from testbed.harness.matrix import on_integration
    from testbed.harness.runner import kill_order

    order = kill_order(on_integration("impl")[0])
    later = [sc for index, sc in order if sc.path == "one_sided" and f"@ {index}" not in hunt["by"]][-1]
    index = next(i for i, sc in order if sc is later)
    (tmp_path / "h.json").write_text(json.dumps({"mutants": [{"mutant": hunt["mutant"], "killed": True,
                                                              "scenario": later.label}]}))
    hinted = _here(capsys, "mutants", "--only", "double-reduce-one-sided", "--hints", str(tmp_path / "h.json"),
                   "--json", str(tmp_path / "b.json"))
    assert hinted.returncode == 0, hinted.stdout + hinted.stderr
    (again,) = json.loads((tmp_path / "b.json").read_text())["mutants"]
    assert again["killed"] and again["by"].endswith(f"@ {index}") and again["scenario"] == later.label
    (tmp_path / "bad.json").write_text("[1, 2]")
    bad = _here(capsys, "mutants", "--only", "double-reduce-one-sided", "--hints", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and bad.stderr.strip().startswith(
        f"a2a-testbed mutants: error: --hints: {tmp_path / 'bad.json'} is not the --json of a2a-testbed mutants")


def test_cli_run_reuse_differential_written_to_the_json(tmp_path, capsys):
    done = _here(capsys, "run", "--stages", "bf16:16", "--reuse-differential", "--json", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reuse differential: 1 of 1 scenarios judged the same" in done.stdout
    assert json.loads((tmp_path / "r.json").read_text())["reuse_differs"] == []
    plain = _here(capsys, "run", "--stages", "bf16:16", "--json", str(tmp_path / "p.json"))
    assert plain.returncode == 0 and "reuse_differs" not in json.loads((tmp_path / "p.json").read_text())
