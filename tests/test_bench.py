from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_cluster_prints_json_line():
    done = subprocess.run(
        [sys.executable, "-m", "testbed.bench", "cluster", "--per-size", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["bench"] == "cluster" and result["scenarios"] == 2
    assert result["pool_s_per_scenario"] > 0 and result["spawn_s_per_scenario"] > 0
    ratio = result["pool_s_per_scenario"] / result["spawn_s_per_scenario"]
    assert result["ratio"] == pytest.approx(ratio, rel=0.01, abs=1e-4)
