"""Campaigns fanned out over Ray: a local Ray cluster of this machine runs matrix scenarios and
mutant hunts, each on one host's rank pool, with the verdicts a local run gives, and the CLI
runs on that cluster by its address. One cluster serves the whole file (starting one
costs ~15 s on 2 cores), so its phases are one test."""

from __future__ import annotations

import pytest

from testbed.harness.matrix import MATRIX


@pytest.mark.needs("ray")
def test_campaign_scenarios_hunts_and_the_cli_on_one_local_ray_cluster(capsys):
    import ray

    from testbed.cli import main
    from testbed.harness import campaign

    with campaign.cluster("local", hosts=2) as hosts:
        # Three matrix scenarios over two hosts: each comes back once, judged as a local run judges
        # it (the driver hands the next scenario to whichever host is idle).
        picked = [sc for sc in MATRIX if sc.layout.world_size <= 4][:3]
        verdicts = dict(hosts.run(picked, timeout_s=60))
        assert sorted(verdicts) == [0, 1, 2]
        for i, v in verdicts.items():
            assert v.passed and v.scenario == picked[i], v.failures
        assert hosts.hosts == 2 and len(hosts.nodes()) == 2

        ((_, hunt),) = hosts.hunt(["double-reduce-one-sided"], list(MATRIX), timeout_s=30)
        assert hunt.killed and hunt.by.startswith("reduce @"), hunt

        # The CLI runs its campaign on the cluster by its address (here the one this process is
        # connected to, as `a2a-testbed run --ray ADDRESS` on a cluster's head would).
        address = ray.get_runtime_context().gcs_address
        assert main(["run", "--ray", address, "--ray-hosts", "2", "--layout", "2,1,2,1", "--stages", "nvfp4:8,bf16:8",
                     "--tokens", "3,5"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == f"ray: 2 hosts on 1 node(s) of {address}"
        assert lines[1].startswith("PASS   1/1") and lines[-1].startswith("1 passed, 0 failed in ")
        assert lines[-1].endswith(f" on Ray ({address})")
