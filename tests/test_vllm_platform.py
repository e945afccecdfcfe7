"""vLLM's platform where the testbed stands in for the accelerators
(:mod:`testbed.integrations.vllm.platform`, a ``vllm.platform_plugins`` entry point): chosen by
vLLM itself in a process with ``A2A_FAKE_DEVICES``, never elsewhere; its communicator's
variable-size all-gather and reduce-scatter against a reference built from every rank's seed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PLATFORM = "from vllm.platforms import current_platform as p; print(type(p).__name__, p.is_cpu())"

COLLECTIVES = textwrap.dedent('''
    import json, socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp

    SIZES = [3, 0, 5]

    def made(seed, n, width=4):  # every rank can rebuild every other rank's input from its seed
        return torch.randn(n, width, generator=torch.Generator().manual_seed(seed))

    def rank_main(rank, world, port, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        from testbed.integrations.vllm.platform import StandInCommunicator
        comm = object.__new__(StandInCommunicator)
        comm.world_size, comm.rank_in_group, comm.device_group = world, rank, dist.group.WORLD
        gathered = comm.all_gatherv(made(rank, SIZES[rank]), 0, SIZES)
        full = made(100, sum(SIZES))  # the same rows on every rank, each rank a multiple
        scattered = comm.reduce_scatterv(full * (rank + 1), 0, SIZES)
        out.put((rank, gathered.tolist(), scattered.tolist()))
        dist.destroy_process_group()

    if __name__ == "__main__":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        ctx = mp.get_context("spawn"); out = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, len(SIZES), port, out)) for r in range(len(SIZES))]
        [p.start() for p in procs]
        got = sorted(out.get(timeout=120) for _ in procs)
        [p.join(60) for p in procs]
        assert [p.exitcode for p in procs] == [0] * len(procs)
        print(json.dumps(got))
''')


def _python(tmp_path, code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("VLLM_TARGET_DEVICE", "A2A_FAKE_DEVICES")}
    (tmp_path / "script.py").write_text(code)  # spawned ranks import their function from a file
    return subprocess.run([sys.executable, "script.py"], cwd=tmp_path, env=base | env | {"PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=300)


@pytest.mark.needs("vllm")
def test_vllm_platform_is_the_stand_in_only_where_the_process_has_stand_in_accelerators(tmp_path):
    here = _python(tmp_path, PLATFORM, A2A_FAKE_DEVICES="2")
    assert here.stdout.split() == ["StandInPlatform", "True"], here.stderr[-2000:]
    elsewhere = _python(tmp_path, PLATFORM, VLLM_TARGET_DEVICE="cpu")
    assert elsewhere.stdout.split() == ["CpuPlatform", "True"], elsewhere.stderr[-2000:]


@pytest.mark.needs("vllm")
def test_vllm_platform_communicator_gathers_and_scatters_uneven_sizes(tmp_path):
    import torch

    done = _python(tmp_path, COLLECTIVES)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = [3, 0, 5]
    expect_gather = torch.cat([torch.randn(n, 4, generator=torch.Generator().manual_seed(r))
                               for r, n in enumerate(sizes)])
    full = torch.randn(sum(sizes), 4, generator=torch.Generator().manual_seed(100)) * sum(range(1, len(sizes) + 1))
    for rank, gathered, scattered in json.loads(done.stdout):
        torch.testing.assert_close(torch.tensor(gathered), expect_gather, rtol=0, atol=0)
        start = sum(sizes[:rank])
        want = full[start:start + sizes[rank]]
        assert torch.tensor(scattered).reshape(want.shape).allclose(want, rtol=1e-6, atol=1e-6), rank
