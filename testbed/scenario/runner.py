"""Run scenarios on the rank pool and judge them: one :class:`Verdict` per scenario."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from typing import Optional

from fakes.arena import PREFIX_ROOT, SHM_DIR
from testbed.cluster.pool import RankPool, ScenarioError
from testbed.scenario import invariants
from testbed.scenario.audit import read_log
from testbed.scenario.invariants import Failure, Verdict
from testbed.scenario.model import Scenario
from testbed.scenario.program import run_scenario

DEFAULT_TIMEOUT_S = 30.0


def run(pool: RankPool, sc: Scenario, *, mutant: Optional[str] = None,
        timeout_s: float = DEFAULT_TIMEOUT_S) -> Verdict:
    """Run ``sc`` (optionally against ``mutant`` of impl) and check every invariant."""
    log_dir = tempfile.mkdtemp(prefix="a2atb-log-")
    started = time.monotonic()
    try:
        try:
            results, error = pool.run(run_scenario, sc.layout, (sc, log_dir, mutant), timeout_s=timeout_s,
                                      name=f"scenario{'-' + mutant if mutant else ''}", seed=sc.seed), None
        except ScenarioError as exc:
            results, error = None, exc
        seconds = time.monotonic() - started
        logs = {r: read_log(f"{log_dir}/rank{r}.jsonl") for r in range(sc.layout.world_size)}
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    verdict = invariants.check(sc, logs, results, error)
    verdict.seconds = seconds
    leaks = _leaks(pool)
    if leaks:
        verdict.failures.append(Failure("no-leaks", leaks))
    return verdict


def _leaks(pool: RankPool) -> str:
    segments = sorted(p.name for p in SHM_DIR.glob(f"{PREFIX_ROOT}-{os.getpid()}-*"))
    workers = set(pool.worker_pids)
    strays = [p.pid for p in multiprocessing.active_children() if p.pid not in workers]
    found = []
    if segments:
        found.append(f"shared-memory segments left in {SHM_DIR}: {segments}")
    if strays:
        found.append(f"child processes left running: {strays}")
    return "; ".join(found)
