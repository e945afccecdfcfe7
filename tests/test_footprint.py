"""The experts' linear maps, and a scenario's needs estimated from its shape: what they cost,
and the refusal of a scenario that will not fit, before any rank starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from testbed.harness.runner import killed_note
from testbed.scenario import footprint
from testbed.scenario.model import from_text
from testbed.scenario.reference import MAP_RANK, LinearMap, expert_weight, shared_weight

SCRIPT = Path(sys.executable).parent / "a2a-testbed"
SMALL = footprint.Machine(shm_free=24 * 10 ** 9, memory=24 * 10 ** 9)
TOO_BIG = ("--layout", "64,1,64,1", "--experts", "256", "--top-k", "8", "--hidden", "7168", "--stages", "bf16:8192",
           "--tokens", ",".join(["8192"] * 64))


@pytest.mark.parametrize("hidden", [256, 2880])
def test_linear_map_is_the_dense_map_it_stands_for(hidden):
    """A map applied equals its dense matrix, sums over any split of the input columns (TP
    shards of the contraction dimension), keeps an entry's size, and is full rank."""
    m = expert_weight(3, 0, 1, 5, hidden)
    x = torch.randn(7, hidden, generator=torch.Generator().manual_seed(hidden))
    W = m.dense()
    torch.testing.assert_close(m(x), x @ W, rtol=1e-4, atol=1e-4)
    cut = hidden // 3
    parts = m(x[:, :cut], slice(0, cut)) + m(x[:, cut:], slice(cut, None))
    torch.testing.assert_close(parts, m(x), rtol=1e-5, atol=1e-5)
    assert 0.7 < m(x).std().item() / x.std().item() < 1.4
    if hidden <= 256:
        assert torch.linalg.matrix_rank(W) == hidden


def test_linear_maps_tell_experts_apart_and_cost_linear_in_hidden():
    """Every expert of a layer, and the shared expert, is its own map: any two move a token to
    outputs that hardly correlate; a map holds O(H) numbers."""
    H = 7168
    maps = [expert_weight(0, 0, 0, e, H) for e in range(8)] + [shared_weight(0, 0, 0, H)]
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(1))
    ys = [m(x).flatten() for m in maps]
    for i in range(len(ys)):
        for j in range(i):
            assert abs(torch.nn.functional.cosine_similarity(ys[i], ys[j], dim=0)) < 0.2, (i, j)
    m = maps[0]
    stored = sum(t.numel() * t.element_size() for t in (m.perm, m.sign, m.u, m.v))
    assert stored == H * (8 + 4 + 8 * MAP_RANK) and isinstance(m, LinearMap)


def test_footprint_grows_with_the_shape():
    small = footprint.estimate(from_text("8,1,8,1", "bf16:16", "16,16,16,16,16,16,16,16", hidden=7168, experts=256,
                                         top_k=8))
    big = footprint.estimate(from_text("8,1,8,1", "bf16:64", "16,16,16,16,16,16,16,16", hidden=7168, experts=256,
                                       top_k=8))
    # The window: every EP rank's budget of dispatched and combined rows, on each of the 8 ranks.
    assert small.workspace_per_rank == 8 * 16 * (2 * 7168 + 8 * 8 + 2 * 7168)
    assert small.shm == 8 * small.workspace_per_rank and big.shm == 4 * small.shm
    assert big.per_rank > small.per_rank and big.resident > small.resident
    none = footprint.estimate(from_text("4,4,1,1", "bf16:16", "16", path="none"))
    assert none.shm == 0


def test_footprint_refuses_what_does_not_fit_with_the_numbers():
    sc = from_text("64,1,64,1", "bf16:8192", ",".join(["8192"] * 64), hidden=7168, experts=256, top_k=8)
    why = footprint.refusal(sc, SMALL)
    assert why.startswith("needs ~9") and "GB of shared memory" in why and "this machine has 24 GB" in why
    fit = int(why.rsplit("at most ", 1)[1].split()[0])
    capped = footprint._scaled(sc, fit)
    assert footprint.refusal(capped, SMALL) is None
    assert footprint.refusal(footprint._scaled(sc, fit + 1), SMALL) is not None
    assert footprint.refusal(from_text("8,1,8,1", "bf16:16", "1,2,3,4,5,6,7,8", hidden=7168, experts=256,
                                       top_k=8), SMALL) is None


def test_cli_refuses_a_scenario_too_big_before_any_rank_starts(monkeypatch, capsys):
    """The command exits 2 with one line of numbers; no rank pool was ever asked for."""
    from testbed import cli
    from testbed.harness import runner

    def no_pool(*args, **kwargs):
        raise AssertionError("a rank pool was started for a scenario that does not fit")

    monkeypatch.setattr(runner, "scenario_pool", no_pool)
    assert cli.main(["run", *TOO_BIG]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("a2a-testbed run: error: --stages / --tokens: the scenario needs ~")
    assert "GB of shared memory" in line and "tokens per rank fit" in line


def test_cli_dry_run_prints_the_estimate_and_runs_nothing():
    done = subprocess.run([str(SCRIPT), "run", "--model", "deepseek-v3", "--dry-run"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, machine = done.stdout.splitlines()
    assert first.startswith("FITS") and "E256 K8 H7168" in first and "GB of" not in first and "shm " in first
    assert machine.startswith("machine: ") and "1 fit, 0 do not" in machine
    done = subprocess.run([str(SCRIPT), "run", *TOO_BIG, "--dry-run"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout.startswith("TOO BIG") and "0 fit, 1 do not" in done.stdout


class _Report:
    def __init__(self, status, summary):
        self.status, self.summary = status, summary


class _Error:
    def __init__(self, reports):
        self.reports = reports


def test_killed_rank_is_named_with_the_estimate():
    sc = from_text("4,1,4,1", "bf16:16", "1,2,3,4")
    note = killed_note(sc, _Error({0: _Report("ok", ""), 1: _Report("died", "process 7 killed by signal SIGKILL"),
                                   2: _Report("died", "process 8 exited with code 1")}), SMALL)
    assert note.startswith("ranks [1] were killed by SIGKILL, as the kernel's out-of-memory killer kills")
    assert "estimated at ~" in note and "24 GB available" in note
    assert killed_note(sc, None, SMALL) is None
    assert killed_note(sc, _Error({0: _Report("died", "process 8 exited with code 1")}), SMALL) is None
