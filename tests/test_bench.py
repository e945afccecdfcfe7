from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture
def bench(capsys):
    """``python -m testbed.bench ARGS`` in this process: its final JSON line, parsed."""
    from testbed.bench.__main__ import main

    def run(*args: str) -> dict:
        assert main(list(args)) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return run


def _refused(*args: str) -> str:
    """What the bench says, refusing ``ARGS`` (its ``SystemExit`` message, which the console shows)."""
    from testbed.bench.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    assert e.value.code not in (0, None)
    return str(e.value.code)


def test_bench_cluster_prints_json_line(bench):
    result = bench("cluster", "--per-size", "1")
    assert result["bench"] == "cluster" and result["scenarios"] == 2
    assert result["pool_s_per_scenario"] > 0 and result["spawn_s_per_scenario"] > 0
    ratio = result["pool_s_per_scenario"] / result["spawn_s_per_scenario"]
    assert result["ratio"] == pytest.approx(ratio, rel=0.01, abs=1e-4)


def test_bench_a2a_prints_json_line(bench):
    result = bench("a2a", "--ranks", "2", "--hidden", "256", "--tokens", "16", "--iters", "2")
    assert result["bench"] == "a2a"
    for key in ("fake_gbps", "gloo_gbps", "memcpy_gbps", "fake_vs_gloo", "fake_vs_memcpy", "memcpy_all_ranks_gbps",
                "fake_vs_ceiling"):
        assert result[key] > 0, key
    assert result["fake_vs_gloo"] == pytest.approx(result["fake_gbps"] / result["gloo_gbps"], rel=0.02)


def test_bench_scale_prints_json_line(bench):
    result = bench("scale", "--worlds", "2,4", "--repeats", "1")
    assert result["bench"] == "scale" and [w["world"] for w in result["worlds"]] == [2, 4]
    assert result["preload_s"] > 0
    for w in result["worlds"]:
        for key in ("start_s", "rendezvous_s", "scenario_s", "warm_scenario_s", "rank_uss_mb", "rank_uss_mb_max"):
            assert w[key] > 0, key
        assert w["rank_uss_mb"] <= w["rank_uss_mb_max"]
    small, large = result["worlds"]
    assert result["scaling"]["from"] == 2 and result["scaling"]["to"] == 4
    assert result["scaling"]["scenario_s"] == pytest.approx(large["scenario_s"] / small["scenario_s"] / 2, abs=0.01)


def test_bench_scenarios_prints_json_line(bench):
    result = bench("scenarios", "--matrix", "2", "--fuzz-examples", "2")
    assert result["bench"] == "scenarios" and result["matrix_passed"] == result["matrix_scenarios"] == 2
    assert result["fuzz_examples"] == 2 and result["matrix_s"] > 0


def test_bench_cost_splits_a_scenario_into_its_parts(bench):
    from testbed.bench.cost import PARTS

    result = bench("cost", "--integration", "impl", "--scenarios", "3")
    assert result["bench"] == "cost" and result["scenarios"] == 3 and result["reuse"] is True
    parts = result["per_scenario_parts_s"]
    assert set(parts) == set(PARTS) and parts["passes"] > 0 and parts["verdict"] > 0
    assert result["per_scenario_s"] == pytest.approx(sum(parts.values()), abs=0.01)
    assert result["parent_s"] >= 0 and result["pool_start_s"] > 0  # impl: no engine to import


@pytest.mark.parametrize("profile, with_output", [("0.7.2", True), ("0.6.8", False)])
def test_bench_combine_prints_json_line(bench, profile, with_output):
    result = bench("combine", "--profile", profile, "--ranks", "2", "--hidden", "256", "--tokens", "8",
                    "--iters", "3", "--warmup", "1")
    assert result["bench"] == "combine" and result["timer"] == "wall clock"
    assert result["copy_us"] > 0 and result["resident_us"] > 0 and result["outputs_agree"] is True
    assert (result["output_us"] is not None) == with_output  # 0.6.8's combine has no output=
    separate = result["output_us"] if with_output else result["copy_us"]
    assert result["resident_vs_separate"] == pytest.approx(result["resident_us"] / separate, rel=0.01)


def test_bench_combine_refuses_what_it_cannot_run():
    from testbed.gpu_env import missing_for_gpu_tests

    cases = [(["--profile", "0.7.4"], "no MoeAlltoAll"), (["--iters", "0"], "--iters: must be >= 1")]
    if missing_for_gpu_tests():  # here the real backend cannot run: it says what is missing
        cases.append((["--backend", "flashinfer"], "--backend flashinfer:"))
    for args, error in cases:
        said = _refused("combine", *args)
        assert error in said, (args, said)


@pytest.mark.parametrize("args, corrupted", [([], True), (["--no-stall", "--between-rounds", "collective"], False)])
def test_bench_race_on_the_fake(bench, args, corrupted):
    """The fake's answer to the cross-round race: a late combine reads rows the next, larger
    dispatch overwrote; a collective between the rounds orders the fake's ranks (whose
    kernels run on the host), so every round is clean. Without either it depends on how the
    ranks are scheduled, so that case is not asserted."""
    result = bench("race", "--trials", "4", "--hidden", "256", *args)
    assert result["bench"] == "race" and result["trials"] == 4
    assert result["corrupted"] == (4 if corrupted else 0) and result["clean"] == 4 - result["corrupted"]


def test_bench_race_refuses_a_deadlock_on_the_fake():
    assert "a deadlock, not a race" in _refused("race", "--between-rounds", "collective")


@pytest.mark.needs("vllm")
def test_bench_scale_vllm_integration_prints_json_line():
    # In a process of its own: taking the engine sets the environment every later pool inherits.
    done = subprocess.run([sys.executable, "-m", "testbed.bench", "scale", "--worlds", "2", "--repeats", "1",
                           "--integration", "vllm"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["bench"] == "scale" and result["integration"] == "vllm" and [w["world"] for w in result["worlds"]] == [2]
    (w,) = result["worlds"]
    assert w["scenario_s"] > 0 and w["warm_scenario_s"] > 0 and w["rank_uss_mb"] > 0
