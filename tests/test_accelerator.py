"""The accelerator stand-in (:mod:`fakes.accelerator`) with ``pytest --fake-flashinfer
--fake-devices``: an engine's multi-GPU test, in the shape vLLM's own take (one spawned process
per GPU, ``cuda:{rank}`` tensors, NCCL, skips below two accelerators and without SYS_PTRACE),
runs on the CPU with the fake's NVLink memory shared between its processes; what a CPU cannot
do is a skip naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fakes.accelerator import parse_count
from fakes.arena import pid_alive, scenario_prefix
from testbed.harness import engine_tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ENGINE_TEST = textwrap.dedent('''
    import os, sys, traceback

    import pytest
    import torch
    import multiprocessing as mp

    requires_multi_gpu = pytest.mark.skipif(torch.accelerator.device_count() < 2, reason="Need >= 2 GPUs")
    requires_ptrace = pytest.mark.skipif(True, reason="SYS_PTRACE required (docker run --cap-add=SYS_PTRACE)")


    def _worker(rank, world_size, port, errors):
        try:
            torch.accelerator.set_device_index(rank)
            torch.distributed.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                                 rank=rank, world_size=world_size)
            from flashinfer.comm import Mapping
            from flashinfer.comm.comm_backend import TorchDistBackend
            from flashinfer.comm.mnnvl import MnnvlConfig, MnnvlMemory

            mapping = Mapping(world_size=world_size, rank=rank, gpus_per_node=world_size, tp_size=world_size)
            MnnvlMemory.initialize()
            MnnvlMemory.set_comm_from_config(mapping, MnnvlConfig(comm_backend=TorchDistBackend()))
            rows = MnnvlMemory(mapping, 4096).as_torch_strided_tensor(torch.int32)
            x = torch.full((4,), rank + 1, dtype=torch.int32, device=f"cuda:{rank}")
            rows[rank, :4] = x.cuda()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                event = stream.record_event()
            torch.cuda.current_stream().wait_event(event)
            torch.accelerator.synchronize()
            torch.distributed.barrier()
            assert rows[:, :4].tolist() == [[r + 1] * 4 for r in range(world_size)], rows[:, :4]
            assert torch.accelerator.current_device_index() == rank
            torch.distributed.destroy_process_group()
        except Exception:
            errors.put(f"[Rank {rank}] {traceback.format_exc()}")
            sys.exit(1)


    @requires_multi_gpu
    @requires_ptrace
    def test_nvlink_memory_between_spawned_ranks():
        mp.set_start_method("spawn", force=True)
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        errors = mp.Queue()
        procs = [mp.Process(target=_worker, args=(rank, 2, port, errors)) for rank in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        found = []
        while not errors.empty():
            found.append(errors.get_nowait())
        assert not found, "\\n".join(found)
        assert [p.exitcode for p in procs] == [0, 0]


    @requires_multi_gpu
    def test_graph_capture():
        graph = torch.cuda.CUDAGraph()
''')


def _pytest(tmp_path, *options):
    (tmp_path / "test_engine_alltoall.py").write_text(ENGINE_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("A2A_FAKE")}
    env["PYTHONPATH"] = ROOT
    junit = tmp_path / "report.xml"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                             f"--junitxml={junit}", *options, "test_engine_alltoall.py"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    done.pid = proc.pid  # the session's arena is named by it
    return done, {o.test.split("::")[1]: o for o in engine_tests.read_junit(junit)}


def test_accelerator_engine_test_runs_on_stand_in_devices(tmp_path):
    done, outcomes = _pytest(tmp_path, "--fake-flashinfer=0.7.2.post1", "--fake-devices", "2")
    assert outcomes["test_nvlink_memory_between_spawned_ranks"].outcome == "passed", done.stdout[-4000:]
    graph = outcomes["test_graph_capture"]
    assert (graph.outcome, graph.why.split(":")[0]) == ("skipped", "[needs a GPU] CUDA graph capture and replay "
                                                                   "(torch.cuda.CUDAGraph)"), graph
    assert "2 CPU stand-ins" in done.stdout
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(scenario_prefix(done.pid, "pytest"))]


def test_accelerator_without_stand_in_the_engine_skips_as_on_a_cpu(tmp_path):
    # the SYS_PTRACE condition stays: it is lifted only where the stand-in runs
    done, outcomes = _pytest(tmp_path, "--fake-flashinfer=0.7.2.post1")
    assert {name: (o.outcome, o.why) for name, o in outcomes.items()} == {
        "test_nvlink_memory_between_spawned_ranks": ("skipped", "SYS_PTRACE required (docker run --cap-add=SYS_PTRACE)"),
        "test_graph_capture": ("skipped", "Need >= 2 GPUs")}, done.stdout[-3000:]


@pytest.mark.parametrize("given", ["0", "-1", "two", "2.5", ""])
def test_accelerator_count_refused_naming_the_flag(given):
    with pytest.raises(ValueError, match=r"^--fake-devices: the number of stand-in accelerators must be a whole "):
        parse_count(given, "--fake-devices")


def test_accelerator_devices_option_needs_the_fake(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fake-devices", "2"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--fake-devices: needs --fake-flashinfer" in done.stdout + done.stderr


def test_engine_tests_summary_names_each_failure_groups_skips_and_ends_with_the_verdict(tmp_path):
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase file="tests/a.py" name="test_ok"/>'
        '<testcase file="tests/a.py" name="test_bad"><failure message="Failed: Worker(s) failed:&#10;'
        '[Rank 1]&#10;AssertionError: rows differ">x</failure></testcase>'
        '<testcase file="tests/a.py" name="test_torn"/>'
        '<testcase file="tests/a.py" name="test_torn"><error message="RuntimeError: teardown"/></testcase>'
        '<testcase file="tests/b.py" name="test_g[1]"><skipped message="[needs a GPU] graphs"/></testcase>'
        '<testcase file="tests/b.py" name="test_g[2]"><skipped message="[needs a GPU] graphs"/></testcase>'
        '</testsuite></testsuites>')
    outcomes = engine_tests.read_junit(junit)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "a.py").write_text("def test_gpu_only(world_size):\n    pass\n")
    off_cpu = (("tests/a.py::test_gpu_only", "a device index"), ("tests/a.py::test_not_in_this_release", "x"))
    plan = engine_tests.Plan("vLLM 9.9.9", tmp_path, ("tests/a.py", "tests/b.py"), None, "0.7.2.post1", 2, "here",
                             off_cpu)
    lines = engine_tests.summary_lines(plan, outcomes, None)
    assert lines[1:] == ["  FAILED tests/a.py::test_bad: AssertionError: rows differ",
                         "  FAILED tests/a.py::test_torn: RuntimeError: teardown",
                         "  not run on the CPU: tests/a.py::test_gpu_only: needs a device index",
                         "  skipped 2 in tests/b.py: [needs a GPU] graphs",
                         "FAIL 1 passed, 2 failed, 2 skipped"]
    command = engine_tests.command(plan, tmp_path / "r.xml")
    assert command[command.index("--deselect") + 1] == "tests/a.py::test_gpu_only"


HANGING = textwrap.dedent('''
    import tempfile
    import threading

    import multiprocessing as mp


    def _stuck_rank(rank):
        tempfile.mkstemp(prefix=LEFT)  # as vLLM's ZMQ sockets, which it never removes
        threading.Event().wait()  # a rank that never returns, as one waiting on a peer that is gone


    def test_hangs():
        ctx = mp.get_context("spawn")
        workers = [ctx.Process(target=_stuck_rank, args=(rank,)) for rank in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
''')


def test_engine_tests_timeout_names_every_stuck_process_and_leaves_none(tmp_path):
    """Every process of the timed-out session is named with the frame it waits in, and none
    outlives the watchdog. The hang is timed out at 15 s: pytest and both workers are in their
    waits within ~5 s alone and ~11 s beside the suite's two workers on two cores (a fresh
    clone's suite once had one still starting at 10 s). Where one is still starting then, the
    whole runs again timed out at 30 s. Each run's every process is named and gone either way."""
    left = f"a2atb-left-{tmp_path.name}-"
    (tmp_path / "test_hang.py").write_text(f"LEFT = {left!r}\n" + HANGING)
    plan = engine_tests.Plan("an engine", tmp_path, ("test_hang.py",), None, "0.7.2.post1", 2, "here")
    for timeout in (15, 30):
        log = tmp_path / f"log-{timeout}.txt"
        outcomes, trouble = engine_tests.run(plan, log, tmp_path / "r.xml", timeout=timeout)
        assert outcomes == [] and trouble.startswith(f"timed out after {timeout} s"), trouble
        stuck = trouble.splitlines()[1:]
        pids = [int(line.split()[1]) for line in stuck]
        assert not [pid for pid in pids if pid_alive(pid)], "a process of the session outlived it"
        # pytest's own process (its test joining) and both workers (each in the wait), by their stacks
        joining = sum("test_hang.py" in line and "in test_hangs" in line for line in stuck)
        waiting = sum("test_hang.py" in line and "in _stuck_rank" in line for line in stuck)
        if (joining, waiting) == (1, 2):
            break
    assert (joining, waiting) == (1, 2), trouble
    assert "Thread 0x" in log.read_text() or "Current thread" in log.read_text()
    assert not list(Path(tempfile.gettempdir()).glob(left + "*")), "the session's temporary files outlived it"
