"""Ranks a launcher started (torchrun) instead of the pool: the environment they read and a
scenario judged across them, on the fake, with no pool and no spawning of our own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.arena import PREFIX_ROOT, SHM_DIR
from testbed.cluster.launched import launch_env

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job7"}


def test_launched_env_absent_is_none():
    assert launch_env({"PATH": "/bin"}) is None


def test_launched_env_read_from_a_launcher():
    env = launch_env(GOOD)
    assert (env.rank, env.world_size, env.local_rank, env.master_port, env.run_id, env.single_node) == \
        (1, 2, 1, 29500, "job7", True)
    assert not launch_env({**GOOD, "LOCAL_WORLD_SIZE": "1"}).single_node
    assert not launch_env({k: v for k, v in GOOD.items() if k != "LOCAL_WORLD_SIZE"}).single_node  # unknown


@pytest.mark.parametrize("change, rule", [
    ({"MASTER_PORT": None}, "MASTER_PORT not set"),
    ({"MASTER_ADDR": None, "MASTER_PORT": None}, "MASTER_ADDR, MASTER_PORT not set"),
    ({"RANK": "one"}, "RANK='one' must be a non-negative integer"),
    ({"RANK": "2"}, "RANK=2 must be in [0, WORLD_SIZE=2)"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 must be a TCP port"),
])
def test_launched_env_bad_variable_named(change, rule):
    env = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(ValueError) as e:
        launch_env(env)
    assert rule in str(e.value)


def _torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    return subprocess.run([torchrun, "--standalone", f"--nproc-per-node={nproc}", "-m", "testbed", "run", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_launched_torchrun_scenario_passes_on_the_fake():
    # Only the launched job's segments (token "tr<port>x<n>"): the other test workers' pools
    # create and unlink segments of their own meanwhile.
    before = set(SHM_DIR.glob(f"{PREFIX_ROOT}-*-tr*"))
    done = _torchrun("--layout", "2,1,2,1", "--profile", "0.7.4", "--tokens", "3,0", "--tokens", "0,0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS   1/1   w2tp1dp2pp1 one_sided 0.7.4" in done.stdout
    assert "1 passed, 0 failed" in done.stdout and "(ranks from the launcher)" in done.stdout
    assert set(SHM_DIR.glob(f"{PREFIX_ROOT}-*-tr*")) <= before


def test_launched_torchrun_judges_a_mutant_as_failed():
    done = _torchrun("--layout", "2,1,2,1", "--mutant", "double-reduce-one-sided")
    assert done.returncode != 0
    assert "FAIL" in done.stdout and "[reduce]" in done.stdout and "0 passed, 1 failed" in done.stdout, \
        done.stdout + done.stderr
