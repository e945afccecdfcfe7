"""Run an engine scenario and judge it: the integration's own engine on the pool's ranks,
then the same checkpoint and prompts on one rank with expert parallel off, and one
:class:`EngineVerdict`.

What an engine run is checked for:

- ``completes``, and every invariant that judges rounds from the event log
  (:func:`testbed.harness.invariants.check_rounds`: workspace, collectives of the MoE layer,
  reduce, runtime max, arguments, set-up calls, round ordering), on the run as a layer
  scenario whose passes are the token counts the engine's forward context gave each DP rank;
- ``engine-steps``: every rank saw the same DP token counts in the same forward, and the
  scenario model's step rule for the integration (:meth:`Integration.engine_passes`) leaves
  what the engine ran unchanged (the model of the engine is what the engine does);
- ``logprobs``: every prompt token's logprob within :data:`LOGPROB_TOLERANCE` of the reference
  run's (DP 1, expert parallel off: no all-to-all at all; vLLM's own model code with the
  same experts), where the engine's scheduler batched the prompts its own way;
- ``no-leaks``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Optional

from testbed import integrations
from testbed.cluster.layout import ParallelLayout
from testbed.cluster.pool import RankPool, ScenarioError
from testbed.harness import findings, invariants
from testbed.harness.audit import certain_mismatch
from testbed.harness.invariants import Failure, Verdict
from testbed.harness.program import run_engine
from testbed.harness.runner import _leaks, _logs, _posix_shm_left, process_group_backend
from testbed.scenario import checkpoint
from testbed.scenario.engine import EngineScenario
from testbed.scenario.events import ForwardStart, LogTail
from testbed.scenario.model import Scenario, ScenarioInputError

# |logprob - reference| per prompt token, nats, by the model's dtype. In fp32 the EP run and
# the reference agree to rounding (measured: bit for bit on the matrix). In bf16 they differ
# in where partial sums are rounded (TP-sharded attention, the combine's sum), and that moves a
# near-tie of the gate: measured 0.008 at DP 2, 0.22 on one token of 24 at TP 2 x DP 2.
# A dropped expert, a lost router weight or a token's output on another token's row moves
# logprobs by far more than the fp32 bound; the bf16 bound catches only gross errors.
LOGPROB_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.3}
DEFAULT_TIMEOUT_S = 150.0
STEPS_SHOWN = 8  # forwards the steps table prints; a verdict stays one screen


@dataclass
class EngineVerdict:
    engine: EngineScenario
    scenario: Optional[Scenario] = None  # the run's rounds as a layer scenario
    failures: list[Failure] = field(default_factory=list)
    # Per rank: (forward, this rank's rows at layer 0, every DP rank's tokens) in order.
    steps: dict[int, list[tuple[int, int, tuple[int, ...]]]] = field(default_factory=dict)
    generate_from: int = 0  # the first forward of generation (before it: the engine's own build)
    worst_logprob: float = 0.0
    known: list[str] = field(default_factory=list)  # the known findings it reproduced
    known_failures: list[Failure] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)  # what the invariants judged: events by kind, all ranks
    seconds: float = 0.0
    reference_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures


def run(pool: RankPool, es: EngineScenario, *, mutant: Optional[str] = None,
        timeout_s: float = DEFAULT_TIMEOUT_S) -> EngineVerdict:
    """Run ``es`` (optionally against ``mutant`` of the integration's code) and its reference
    (never mutated), and check them."""
    module = integrations.module_of(es.integration)
    v = EngineVerdict(es)
    model_dir = tempfile.mkdtemp(prefix="a2atb-ckpt-")
    try:
        checkpoint.write(es.checkpoint(), model_dir)
        model = es.scenario(passes=(tuple(1 for _ in range(es.dp)),), sequence_parallel=False)
        model = replace(model, raw_passes=True)
        started = time.monotonic()
        logs, results, error = _run(pool, es.layout, model, es, model_dir, module, timeout_s, mutant=mutant)
        v.seconds = time.monotonic() - started
        started = time.monotonic()
        reference = replace(model, path="none", layout=ParallelLayout(world_size=1, tp=1, dp=1, pp=1))
        _, ref_results, ref_error = _run(pool, reference.layout, reference, es, model_dir, module, timeout_s)
        v.reference_seconds = time.monotonic() - started
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    if ref_error is not None:
        v.failures.append(Failure("completes", f"the reference run (DP 1, expert parallel off): {ref_error}"))
    v.events = dict(sorted(Counter(e.kind for events in logs.values() for e in events).items()))
    sc = rounds_scenario(es, logs, results, v)
    if sc is not None:
        v.scenario = sc
        v.failures += invariants.check_rounds(sc, logs, error).failures
    elif error is not None:
        v.failures.append(Failure("completes", f"{type(error).__name__}: {error}"))
    if results is not None and ref_results is not None:
        _logprobs(es, results, ref_results[0]["logprobs"], v)
    leaks = "; ".join(filter(None, (_leaks(), _posix_shm_left(logs, counted=error is None))))
    if leaks:
        v.failures.append(Failure("no-leaks", leaks))
    if v.scenario is not None:
        judge_known(v)
    return v


def judge_known(v) -> None:
    """The layer scenario's known findings (:mod:`testbed.harness.findings`) judge the engine
    run ``v`` (its ``scenario``, ``failures``, ``known`` and ``known_failures``, as an
    :class:`EngineVerdict` has them) as they judge a layer run: ``KNOWN`` where it fails
    exactly as they say."""
    layer = Verdict(v.scenario, failures=v.failures)
    findings.judge(layer)
    v.known, v.known_failures, v.failures = layer.known, layer.known_failures, layer.failures


def _run(pool, layout, model: Scenario, es, model_dir, module, timeout_s, mutant: Optional[str] = None):
    reference = model.path == "none"
    log_dir = tempfile.mkdtemp(prefix="a2atb-log-")
    try:
        tails = {r: LogTail(f"{log_dir}/rank{r}.jsonl") for r in range(layout.world_size)}
        watch = lambda finished: certain_mismatch(_logs(tails), finished)  # noqa: E731
        try:
            results = pool.run(run_engine, layout, (model, es, model_dir, log_dir, module, reference, mutant),
                               timeout_s=timeout_s, name="engine-reference" if reference else "engine", seed=es.seed,
                               monitor=watch, pg_backend=process_group_backend(model.flashinfer_backend))
            error = None
        except ScenarioError as exc:
            results, error = None, exc
        return _logs(tails), results, error
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def rounds_scenario(es: EngineScenario, logs, results, v: EngineVerdict) -> Optional[Scenario]:
    """The run's rounds as a layer scenario: its passes what the ranks' forward contexts said,
    sequence parallel where vLLM's runner said so; None (and why, as a failure) where the
    ranks disagree or returned nothing."""
    if results is None:
        return None
    counts: dict[int, tuple[int, ...]] = {}
    for rank, result in enumerate(results):
        layer0 = [(rows, dp) for layer, rows, dp in result["prepares"] if layer == 0]
        v.steps[rank] = [(p, rows, dp) for p, (rows, dp) in enumerate(layer0)]
        v.generate_from = sum(1 for layer, _, _ in result["prepares"][:result["generate_from"]] if layer == 0)
        for p, (_, dp) in enumerate(layer0):
            if counts.setdefault(p, dp) != dp:
                v.failures.append(Failure("engine-steps", f"forward {p}: rank {rank}'s forward context gave the DP "
                                          f"ranks {dp} tokens, an earlier rank's {counts[p]}"))
                return None
    if not counts or len({len(steps) for steps in v.steps.values()}) != 1:
        v.failures.append(Failure("engine-steps", "the ranks ran different numbers of MoE forwards: "
                                  + ", ".join(f"rank {r} {len(s)}" for r, s in v.steps.items())))
        return None
    passes = tuple(counts[p] for p in range(len(counts)))
    sp = any(e.sp for events in logs.values() for e in events if isinstance(e, ForwardStart))
    sc = replace(es.scenario(passes, sp), forwards_ordered=False)
    if sc.passes != passes:
        changed = [p for p, (a, b) in enumerate(zip(passes, sc.passes)) if a != b] if len(sc.passes) == len(passes) \
            else "the number of forwards"
        v.failures.append(Failure("engine-steps", f"the scenario model's step rule for --integration {es.integration} "
                                  f"changes what the engine ran (forwards {changed}): the testbed's passes for it are "
                                  "not the engine's"))
        sc = replace(sc, passes=passes, raw_passes=True)
    try:
        sc.validate()
    except ScenarioInputError as e:
        v.failures.append(Failure("engine-steps", f"the scenario model refuses what the engine ran: {e}"))
    return sc


def _logprobs(es: EngineScenario, results, reference: list[list[float]], v: EngineVerdict) -> None:
    """Each rank's prompt logprobs against the reference's (its prompts in DP rank order)."""
    offsets, n = [], 0
    for d in range(es.dp):
        offsets.append(n)
        n += len(es.prompts[d])
    bad, tolerance = [], LOGPROB_TOLERANCE[es.dtype]
    for rank, result in enumerate(results):
        d = rank // es.tp
        for i, got in enumerate(result["logprobs"]):
            want = reference[offsets[d] + i]
            for j, (a, b) in enumerate(zip(got, want)):
                v.worst_logprob = max(v.worst_logprob, abs(a - b))
                if abs(a - b) > tolerance:
                    bad.append(f"rank {rank} (DP {d}) prompt {i} token {j + 1}: logprob {a:.4f}, the reference "
                               f"{b:.4f} (|diff| {abs(a - b):.3g} > {tolerance} for {es.dtype})")
            if len(got) != len(want):
                bad.append(f"rank {rank} prompt {i}: {len(got)} logprobs, the reference {len(want)}")
    if bad:
        more = f"\n(+{len(bad) - 8} more)" if len(bad) > 8 else ""
        v.failures.append(Failure("logprobs", "\n".join(bad[:8]) + more))


def verdict_line(index: int, total: int, v: EngineVerdict) -> str:
    """``PASS  1/5  <label>  [<deployment>]  worst logprob 0 (tol 0.0001)  12.3 s + reference 4.5 s``."""
    status = "FAIL" if not v.passed else "KNOWN" if v.known else "PASS"
    known = f"  {', '.join(v.known)} (docs/findings.md)" if v.known else ""
    es = v.engine
    where = f"{es.label}  [{es.describe()}]" if es.label else es.describe()
    return (f"{status} {index:>3}/{total:<3} {where}  worst logprob "
            f"{v.worst_logprob:.2g} (tol {LOGPROB_TOLERANCE[es.dtype]:g})  {v.seconds:.1f} s + reference "
            f"{v.reference_seconds:.1f} s{known}")


def steps_text(v: EngineVerdict) -> str:
    """Per engine forward: the rows each rank's prepare received at the first MoE layer, and
    the DP ranks' token counts its forward context gave."""
    if not v.steps:
        return "    (no forward reached a prepare)"
    ranks = sorted(v.steps)
    lines = ["    forward  " + " ".join(f"r{r:<4}" for r in ranks) + " DP token counts"]
    forwards = max(len(s) for s in v.steps.values())
    for p in range(min(forwards, STEPS_SHOWN)):
        cells = [v.steps[r][p] if p < len(v.steps[r]) else None for r in ranks]
        rows = " ".join(f"{c[1]:<5}" if c else "-    " for c in cells)
        counts = next((c[2] for c in cells if c), ())
        mark = "  (the engine's build)" if p < v.generate_from else ""
        lines.append(f"    {p:<8} {rows} {counts}{mark}")
    if forwards > STEPS_SHOWN:
        lines.append(f"    ... {forwards - STEPS_SHOWN} more forwards (--json holds every one)")
    return "\n".join(lines)


def failure_text(v: EngineVerdict) -> str:
    lines = [f"    [{f.invariant}] " + f.evidence.replace("\n", "\n      ") for f in v.failures]
    lines += [f"    [{f.invariant}, known] " + f.evidence.splitlines()[0][:300] for f in v.known_failures]
    lines.append(f"    reproduce: {v.engine.to_cli()}")
    return "\n".join(lines)


def as_json(v: EngineVerdict) -> dict:
    return {"label": v.engine.label, "scenario": v.engine.describe(), "reproduce": v.engine.to_cli(),
            "passed": v.passed, "known": v.known, "seconds": round(v.seconds, 3),
            "reference_seconds": round(v.reference_seconds, 3), "worst_logprob": v.worst_logprob,
            "failures": [{"invariant": f.invariant, "evidence": f.evidence} for f in v.failures],
            "events": v.events,
            "steps": {str(r): [{"forward": p, "rows": rows, "dp_tokens": list(dp)} for p, rows, dp in s]
                      for r, s in v.steps.items()}}
