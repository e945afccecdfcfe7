from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "a2a-testbed"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    if not SCRIPT.exists():
        pytest.fail(f"console script {SCRIPT} is not installed: run `pip install -e .[test]`")
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_cli_help_lists_commands():
    done = _cli("--help")
    assert done.returncode == 0
    assert "run" in done.stdout and "version" in done.stdout


def test_cli_version():
    done = _cli("version")
    assert done.returncode == 0
    assert done.stdout.startswith("a2a-testbed 0.1.0 (torch ")


def test_cli_run_selfcheck_prints_what_it_ran():
    done = _cli("run", "--layout", "2,1,2,1", "--layout", "w4tp1dp2pp2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS w2tp1dp2pp1" in done.stdout and "PASS w4tp1dp2pp2" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["layouts"] == ["w2tp1dp2pp1", "w4tp1dp2pp2"]
    assert (summary["passed"], summary["failed"]) == (2, 0)


def test_cli_run_wrong_group_barrier_fault_is_caught():
    done = _cli("run", "--layout", "4,1,2,2", "--fault", "wrong-group-barrier", "--timeout", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ScenarioTimeoutError" in done.stdout and "deadlock or hang" in done.stdout
    assert json.loads(done.stdout.strip().splitlines()[-1])["fault"] == "wrong-group-barrier"


def test_cli_run_rejects_bad_layout():
    done = _cli("run", "--layout", "6,4,1,1")
    assert done.returncode == 2
    assert "world_size 6 is not divisible by tp 4" in done.stderr


def test_cli_run_moe_job_checks_the_integration():
    done = _cli("run", "--job", "moe", "--layout", "4,2,2,1", "--path", "two_sided", "--formats", "bf16,mxfp8")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS w4tp2dp2pp1" in done.stdout and "two_sided (FlashInfer 0.7.2), layers bf16/mxfp8" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["job"] == "moe" and summary["passed"] == 1


def test_cli_run_integration_fault_is_caught_or_reported_unnoticed():
    done = _cli("run", "--fault", "double-reduce", "--layout", "4,2,2,1", "--layout", "2,1,2,1")
    assert done.returncode == 1, done.stdout + done.stderr  # TP = 1 cannot show a double reduce
    assert "PASS w4tp2dp2pp1" in done.stdout and "caught: wrong output" in done.stdout
    assert "FAIL w2tp1dp2pp1" in done.stdout and "went unnoticed (needs tp >= 2)" in done.stdout


def test_cli_run_rejects_bad_moe_options():
    done = _cli("run", "--job", "moe", "--formats", "bf16,int4")
    assert done.returncode == 2 and "--formats takes a comma-separated list" in done.stderr
    done = _cli("run", "--job", "moe", "--fault", "crash")
    assert done.returncode == 2 and "is a cluster fault" in done.stderr
