"""Cost: what an integration's scenario costs, split into its parts, and its matrix as a whole command.

``python -m testbed.bench cost --integration vllm [--source 0.27.0] [--no-reuse]``: in this
process, the engine's import and the rules' probes (``parent_s``), the rank pool's start (its
fork server importing the engine, ``pool_start_s``), then each scenario of the matrix with the
slowest rank's seconds per part (``engine``: standing the integration up, the engine's
parallel state and process groups; ``build``: the layers; ``passes``; ``teardown``), what the
pool adds around them (the world, messaging: ``pool``) and the verdict (``verdict``), summed
over the scenarios after the first (which pays for the workers' start). ``--whole`` also runs
``a2a-testbed run`` of the same matrix as a command and divides its wall time by the
scenarios it ran (``whole_s_per_scenario``): how the goal of a scenario's cost compares
integrations. ``--no-reuse``: every scenario makes its process groups afresh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

PARTS = ("engine", "build", "passes", "teardown", "pool", "verdict")


def add_arguments(parser) -> None:
    parser.add_argument("--integration", default="impl", metavar="NAME", help="impl (default), vllm or sglang")
    parser.add_argument("--source", metavar="RELEASE", help="an engine release other than the installed one")
    parser.add_argument("--no-reuse", action="store_true", help="every scenario makes its own process groups")
    parser.add_argument("--scenarios", type=int, metavar="N", help="the matrix's first N scenarios (default: all)")
    parser.add_argument("--whole", action="store_true", help="also time the matrix as one a2a-testbed command")


def run(args) -> dict:
    from testbed import integrations
    from testbed.cluster.pool import REUSE_ENV
    from testbed.harness import runner
    from testbed.harness.matrix import on_integration

    if args.no_reuse:
        os.environ[REUSE_ENV] = "0"  # the pool here and the whole command's
    started = time.monotonic()
    engine = integrations.get(args.integration).engine
    if engine is not None:
        why = engine.use(args.source)
        if why:
            raise SystemExit(f"python -m testbed.bench cost: {why}")
    scenarios, _ = on_integration(args.integration, engine.pinned() if engine else None)
    scenarios = scenarios[:args.scenarios]
    if len(scenarios) < 2:
        raise SystemExit("python -m testbed.bench cost: --scenarios: at least 2 (the first pays for the workers' start)")
    parent_s = time.monotonic() - started
    totals = dict.fromkeys(PARTS, 0.0)
    with runner.scenario_pool() as pool:
        began = time.monotonic()
        pool.start(scenarios[0].layout.world_size)
        pool_start_s = time.monotonic() - began
        for n, sc in enumerate(scenarios):
            began = time.monotonic()
            v = runner.run(pool, sc)
            whole = time.monotonic() - began
            if n == 0:
                first_s = whole
                continue
            for part in PARTS[:4]:
                totals[part] += v.phases.get(part, 0.0)
            totals["pool"] += v.seconds - sum(v.phases.get(part, 0.0) for part in PARTS[:4])
            totals["verdict"] += whole - v.seconds
    counted = max(len(scenarios) - 1, 1)
    result = {"bench": "cost", "integration": args.integration, "release": engine.release(args.source)[0] if engine
              else None, "reuse": not args.no_reuse, "scenarios": len(scenarios), "parent_s": round(parent_s, 2),
              "pool_start_s": round(pool_start_s, 2), "first_scenario_s": round(first_s, 2),
              "per_scenario_s": round(sum(totals.values()) / counted, 3),
              "per_scenario_parts_s": {part: round(t / counted, 3) for part, t in totals.items()}}
    if args.whole:
        result.update(_whole(args, len(scenarios)))
    return result


def _whole(args, scenarios: int) -> dict:
    flags = ["--integration", args.integration] + ([f"--{args.integration}-source", args.source] if args.source else [])
    with tempfile.TemporaryDirectory() as tmp:
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "testbed", "run", *flags, "--json", f"{tmp}/out.json"],
                       capture_output=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        seconds = time.monotonic() - began
        ran = len(json.load(open(f"{tmp}/out.json"))["scenarios"])
    return {"whole_s": round(seconds, 2), "whole_scenarios": ran, "whole_s_per_scenario": round(seconds / ran, 3)}
