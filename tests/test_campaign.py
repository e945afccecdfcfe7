"""Campaigns fanned out over Ray: a local Ray cluster of this machine runs matrix scenarios and
mutant hunts, each on one host's rank pool, with the verdicts a local run gives."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.harness.matrix import MATRIX

SCRIPT = Path(sys.executable).parent / "a2a-testbed"


@pytest.fixture(scope="module")
def ray_hosts():
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("A2A_REQUIRE_RAY"):
            pytest.fail("A2A_REQUIRE_RAY is set but Ray is not installed (pip install -e '.[ray]')")
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    from testbed.harness import campaign

    with campaign.cluster("local", hosts=2) as hosts:
        yield hosts


def test_campaign_runs_scenarios_on_every_host(ray_hosts):
    """Four matrix scenarios over two hosts: each comes back once, judged as a local run judges
    it, and both hosts took some (the driver hands the next scenario to whichever is idle)."""
    picked = [sc for sc in MATRIX if sc.layout.world_size <= 4][:4]
    verdicts = dict(ray_hosts.run(picked, timeout_s=60))
    assert sorted(verdicts) == [0, 1, 2, 3]
    for i, v in verdicts.items():
        assert v.passed and v.scenario == picked[i], v.failures
    assert ray_hosts.hosts == 2 and len(ray_hosts.nodes()) == 2


def test_campaign_hunts_mutants_on_the_hosts(ray_hosts):
    hunts = dict(ray_hosts.hunt(["double-reduce-one-sided", "scaling-dropped"], list(MATRIX), timeout_s=30))
    assert all(h.killed for h in hunts.values()), hunts
    assert hunts[0].by.startswith("reduce @") and hunts[1].mutant == "scaling-dropped"


def test_campaign_cli_runs_on_a_local_ray_cluster():
    if importlib.util.find_spec("ray") is None and not os.environ.get("A2A_REQUIRE_RAY"):
        pytest.skip("Ray is not installed (pip install -e '.[ray]')")
    done = subprocess.run([str(SCRIPT), "run", "--ray", "--ray-hosts", "2", "--layout", "2,1,2,1", "--stages",
                           "nvfp4:8,bf16:8", "--tokens", "3,5"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "ray: 2 hosts on 1 node(s) of local"
    assert lines[1].startswith("PASS   1/1") and lines[-1].startswith("1 passed, 0 failed in ")
    assert lines[-1].endswith(" on Ray (local)")
