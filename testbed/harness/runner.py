"""Run scenarios on the rank pool and judge them: one :class:`Verdict` per scenario."""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fakes.arena import PREFIX_ROOT, SHM_DIR
from testbed import integrations
from testbed.cluster.pool import RankPool, ScenarioError, open_pools_worker_pids
from testbed.harness import findings, invariants, mutants
from testbed.harness.audit import certain_mismatch
from testbed.harness.invariants import Failure, Verdict
from testbed.harness.program import run_scenario
from testbed.scenario import footprint
from testbed.scenario.events import Event, LogTail, SharedMemoryCreated
from testbed.scenario.model import Scenario

DEFAULT_TIMEOUT_S = 30.0
# The engine modules the ranks of this process's scenarios loaded (a run's report lists them).
IMPORTED: set[str] = set()
NAMED_TESTS_TIMEOUT_S = 300.0


def scenario_pool(**kwargs) -> RankPool:
    """A rank pool whose fork server has the rank program loaded (and whatever
    ``A2A_PRELOAD_MODULES`` names: the engines an integration drives)."""
    return RankPool(preload=(run_scenario.__module__,) + tuple(kwargs.pop("preload", ())), **kwargs)


def process_group_backend(backend: str) -> str:
    """The ranks' ``torch.distributed`` backend for a scenario's FlashInfer ``backend``: gloo,
    plus NCCL for CUDA tensors where the real FlashInfer runs on GPUs (vLLM's device groups)."""
    import torch
    import torch.distributed as dist

    if backend != "fake" and torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def run(pool: RankPool, sc: Scenario, *, mutant: Optional[str] = None,
        timeout_s: float = DEFAULT_TIMEOUT_S) -> Verdict:
    """Run ``sc`` (optionally against ``mutant`` of impl) and check every invariant."""
    machine = footprint.Machine.here()  # before the ranks take theirs
    log_dir = tempfile.mkdtemp(prefix="a2atb-log-")
    started = time.monotonic()
    try:
        try:
            tails = {r: LogTail(f"{log_dir}/rank{r}.jsonl") for r in range(sc.layout.world_size)}
            watch = lambda finished: certain_mismatch(_logs(tails), finished)  # noqa: E731
            program_args = (sc, log_dir, mutant, integrations.module_of(sc.integration))
            results, error = pool.run(run_scenario, sc.layout, program_args, timeout_s=timeout_s,
                                      name=f"scenario{'-' + mutant if mutant else ''}", seed=sc.seed,
                                      monitor=watch, pg_backend=process_group_backend(sc.flashinfer_backend)), None
        except ScenarioError as exc:
            results, error = None, exc
        seconds = time.monotonic() - started
        logs = _logs(tails)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    verdict = invariants.check(sc, logs, results, error)
    verdict.seconds = seconds
    if results:
        IMPORTED.update(m for r in results for m in r.get("engine_modules", ()))
        verdict.phases = {part: max(r.get("phases", {}).get(part, 0.0) for r in results)
                          for part in ("engine", "build", "passes")} | {"teardown": pool.last_teardown_s}
    killed = killed_note(sc, error, machine)
    if killed:
        verdict.failures.append(Failure("completes", killed))
    leaks = "; ".join(filter(None, (_leaks(), _posix_shm_left(logs, counted=error is None))))
    if leaks:
        verdict.failures.append(Failure("no-leaks", leaks))
    findings.judge(verdict)
    if mutant is None:
        _UNMUTATED[sc] = verdict  # what a later hunt in this process compares a mutated run with
    return verdict


def killed_note(sc: Scenario, error, machine: "footprint.Machine") -> str | None:
    """What to say of ranks killed by SIGKILL (what the kernel's out-of-memory killer sends):
    which, and the scenario's estimated needs against what the machine had when it started."""
    if error is None:
        return None
    killed = sorted(r for r, rep in error.reports.items() if rep.status == "died" and "SIGKILL" in rep.summary)
    if not killed:
        return None
    fp = footprint.estimate(sc)
    return (f"ranks {killed} were killed by SIGKILL, as the kernel's out-of-memory killer kills: the scenario was "
            f"estimated at ~{fp.resident / footprint.GB:.3g} GB in all ({fp.shm / footprint.GB:.3g} GB of shared "
            f"memory, {fp.per_rank / footprint.MIB:.4g} MiB per rank), and this machine had "
            f"{machine.memory / footprint.GB:.3g} GB available and {machine.shm_free / footprint.GB:.3g} GB free in "
            "/dev/shm when it started (`a2a-testbed run ... --dry-run` prints the estimate)")


def run_launched(env, sc: Scenario, *, index: int, mutant: Optional[str] = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> Optional[Verdict]:
    """``sc`` as this rank of a launched job (:mod:`testbed.cluster.launched`): every rank runs
    its share and sends rank 0 its result, event log and leftover segments; rank 0 checks
    every invariant and returns the verdict (the others None). ``index`` numbers the job's
    scenarios. Unlike :func:`run`, a rank that raises or hangs ends the job (the launcher's
    handling), so ``completes`` is judged by the job's exit, not here."""
    from testbed.cluster.launched import run_here

    log_dir = tempfile.mkdtemp(prefix="a2atb-log-")
    started = time.monotonic()
    try:
        gathered = run_here(env, run_scenario, sc.layout, (sc, log_dir, mutant, integrations.module_of(sc.integration)),
                            timeout_s=timeout_s, seed=sc.seed,
                            name="scenario", index=index,
                            after=lambda result: (result, list(LogTail(f"{log_dir}/rank{env.rank}.jsonl").events())))
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    if gathered is None:
        return None
    verdict = invariants.check(sc, {rank: events for rank, ((_, events), _) in enumerate(gathered)},
                               [result for (result, _), _ in gathered], None)
    verdict.seconds = time.monotonic() - started
    leaks = sorted(name for _, names in gathered for name in names)
    if leaks:
        verdict.failures.append(Failure("no-leaks", f"shared-memory segments left after the scenario: {leaks}"))
    return verdict


def _logs(tails: dict[int, LogTail]) -> dict[int, list[Event]]:
    return {r: list(tail.events()) for r, tail in tails.items()}


def _leaks() -> str:
    segments = sorted(p.name for p in SHM_DIR.glob(f"{PREFIX_ROOT}-{os.getpid()}-*"))
    workers = open_pools_worker_pids()  # this pool's, and those of another open in this process
    strays = [p.pid for p in multiprocessing.active_children() if p.pid not in workers]
    found = []
    if segments:
        found.append(f"shared-memory segments left in {SHM_DIR}: {segments}")
    if strays:
        found.append(f"child processes left running: {strays}")
    return "; ".join(found)


def _posix_shm_left(logs: dict[int, list[Event]], counted: bool) -> str:
    """Remove the ``multiprocessing.shared_memory`` segments the ranks created that are still
    there; a leak when the scenario completed (its code should have removed them), the
    testbed's own clean-up when a rank was killed or raised first."""
    from multiprocessing import resource_tracker

    left = []
    for name in dict.fromkeys(e.name for events in logs.values() for e in events if isinstance(e, SharedMemoryCreated)):
        path = SHM_DIR / name.lstrip("/")
        if path.exists():
            path.unlink(missing_ok=True)
            resource_tracker.unregister(name, "shared_memory")  # the ranks registered it with this tracker
            left.append(name)
    return f"POSIX shared memory left by the ranks (removed now): {left}" if left and counted else ""


@dataclass(frozen=True)
class Hunt:
    """How a mutant fared: killed (by which invariant, in which scenario) or not."""

    mutant: str
    killed: bool
    by: str  # "workspace @ 2" or why not
    seconds: float
    evidence: str = ""
    scenario: str = ""  # the label of the scenario that killed it


def hunt(pool: RankPool, name: str, scenarios, *, timeout_s: float, first: Optional[str] = None) -> Hunt:
    """Run ``scenarios`` against mutant ``name`` until one fails the way the mutant says it
    must (:attr:`Mutant.expect`); failures of any other kind do not count. ``first``: the
    label of a scenario to try before the others (the one that killed this mutant in another
    run, say; :func:`kill_order`): only the order changes, never what counts as a kill."""
    m = mutants.get(name)
    started = time.monotonic()
    try:
        mutants.apply(name)()  # a mutant that no longer matches impl is broken, not killed
    except mutants.MutantError as e:
        return Hunt(name, False, f"broken: {e}", 0.0)
    other = []
    for index, sc in kill_order(scenarios if m.needs_scenarios else (), first):
        # On a scenario a known finding fails, a failure the release's own code shows too (the
        # finding's, or one that follows from it) is no kill: only what the mutant adds. Run
        # first, on ranks the mutated run has not left behind (a rank it killed is restarted).
        already = unmutated(pool, sc, timeout_s) if findings.known(sc) else None
        v = run(pool, sc, mutant=name, timeout_s=timeout_s)
        f = killing_failure(m, v.failures + v.known_failures, already)
        if f is not None:
            return Hunt(name, True, f"{f.invariant} @ {index}", time.monotonic() - started,
                        f.evidence.splitlines()[0][:300], sc.label)
        other += [f"{f.invariant} @ {index}" for f in v.failures]
    if m.tests:
        failed = _named_tests_failing(m)
        for kind, piece in m.expect:
            hit = next((line for line in failed if kind == "tests" and piece in line), None)
            if hit:
                return Hunt(name, True, "tests", time.monotonic() - started, hit[:300])
        other += ["tests"] if failed else []
    why = "survived" + (f" (only unexpected failures: {', '.join(other[:4])})" if other else "")
    return Hunt(name, False, why, time.monotonic() - started)


def killing_failure(m, failures, already: Optional[Verdict] = None):
    """The first of ``failures`` (a mutated run's, known ones included) that kills mutant ``m``:
    one of its ``expect`` pairs, in their order, that the unmutated run ``already`` does not
    show too (None: none ran); None where none kills it."""
    for invariant, piece in m.expect:
        for f in failures:
            if f.invariant == invariant and piece in f.evidence and not (already and _shows(already, invariant, piece)):
                return f
    return None


_UNMUTATED: dict[Scenario, Verdict] = {}


def unmutated(pool: RankPool, sc: Scenario, timeout_s: float) -> Verdict:
    """``sc``'s verdict without a mutant, run once per process (a hunt of every mutant asks for
    the same scenarios, the findings' reproducers share theirs; a matrix run before in this
    process already ran them). A scenario is the same whatever its label."""
    if sc not in _UNMUTATED:
        _UNMUTATED[sc] = run(pool, sc, timeout_s=timeout_s)
    return _UNMUTATED[sc]


def _shows(v: Verdict, invariant: str, piece: str) -> bool:
    return any(f.invariant == invariant and piece in f.evidence for f in v.failures + v.known_failures)


def kill_order(scenarios, first: Optional[str] = None) -> list[tuple[int, Scenario]]:
    """``(matrix index from 1, scenario)`` in the order a hunt tries them: the scenario
    labelled ``first`` where there is one (a label matches whatever integration and FlashInfer
    release :func:`~testbed.harness.matrix.on_integration` moved it to); then, greedily, the
    scenario that brings the most features not yet met (:func:`features`: the all-to-all path,
    pipeline, tensor and sequence parallel, shared experts, each layer format, ...), until every
    feature has been met; then the rest in matrix order. A mutant of code only one kind of
    deployment runs (the two-sided path, a PP stage's rebuild, the shared experts' reduce) then
    meets that kind within the first few scenarios, not after every scenario of the others;
    the verdict names the matrix index."""
    left = list(enumerate(scenarios, 1))
    met: set = set()
    hinted = [n for n, (_, sc) in enumerate(left) if first and same_entry(sc.label, first)]
    order = [left.pop(hinted[0])] if hinted else []
    met |= {fact for _, sc in order for fact in features(sc)}
    while left:
        gain, pick = max((len(features(sc) - met), -n) for n, (_, sc) in enumerate(left))
        if gain == 0:
            break
        index, sc = left.pop(-pick)
        met |= features(sc)
        order.append((index, sc))
    return order + left


def same_entry(label: str, other: str) -> bool:
    """Whether two scenario labels name the same matrix entry, whichever integration and
    FlashInfer release each was moved to (the ``[vllm on 0.7.0.post1]`` that ends a label)."""
    def entry(text: str) -> str:
        return re.sub(r" \[\S+ on \S+\]$", "", text)

    return entry(label) == entry(other)


def features(sc: Scenario) -> frozenset:
    """What a scenario exercises, as a hunt tells deployments apart: each a ``(name, value)``."""
    lay = sc.layout
    facts = {("path", sc.path), ("api", sc.api), ("profile", sc.profile), ("level", sc.level),
             ("pp", lay.pp > 1), ("tp", lay.tp > 1), ("dp", lay.dp > 1), ("sp", sc.splits_tokens),
             ("shared", sc.shared_experts), ("scaled", sc.routed_scaling != 1.0),
             ("weight on input", sc.router_weight_on_input), ("defer", sc.defer_finalize),
             ("kernel", sc.expert_kernel), ("expert output", sc.expert_output), ("invalid id", sc.invalid_expert_id),
             ("router ids", sc.router_ids), ("combine", sc.combine_signature), ("draft", sc.draft_layers > 0),
             ("idle", any(0 in p for p in sc.passes)), ("layers", max(map(len, sc.stages)) > 1)}
    return frozenset(facts | {("format", ly.fmt) for st in sc.stages for ly in st})


def _named_tests_failing(m) -> list[str]:
    """The ``FAILED ...`` lines of the tests ``m`` names, run under the mutant."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *m.tests],
        cwd=root, env=os.environ | {"A2A_MUTANT": m.name}, capture_output=True, text=True,
        timeout=NAMED_TESTS_TIMEOUT_S)
    if done.returncode != 1:  # 0: passed; 2-5: errors, interrupted, no tests: not a kill either
        return []
    return [line for line in done.stdout.splitlines() if line.startswith("FAILED ")]
