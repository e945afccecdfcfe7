"""``a2a-testbed serve``: the engine's own server, DP + EP on the fake, answering a real client
(:mod:`testbed.harness.serve`)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

from testbed.commands.common import UsageError, output_arguments, source_arguments

NAME = "serve"


def add_parser(sub) -> None:
    from testbed import integrations

    p = sub.add_parser(
        NAME, help="the engine's own server (vllm serve, sglang.launch_server) with DP + EP on the fake, answering "
                   "a real client, checked",
        description=(
            "Writes a tiny MoE checkpoint and tokenizer, starts the engine's own server on the loopback address with "
            "data and expert parallel on the fake FlashInfer (every process it starts has the fake, the run's "
            "shared memory and its recorders), sends concurrent requests of different lengths (streamed and not, "
            "with prompt logprobs) through an OpenAI client, and checks every round every engine process recorded, "
            "the step rule, and the answers against the same requests served at DP 1 without expert parallel. "
            "With no --dp: the serve matrix."))
    p.add_argument("--integration", choices=[i.name for i in integrations.engines() if i.engine.serving],
                   default="vllm", help="whose server (default: %(default)s)")
    p.add_argument("--dp", type=int, metavar="N", help="data-parallel ranks (each its own engine core)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel ranks per DP rank (default 1)")
    p.add_argument("--path", default="one_sided", help="the all-to-all: one_sided (default) or two_sided")
    p.add_argument("--requests", type=int, default=3, metavar="N",
                   help="concurrent requests (default 3; fewer than --dp leaves a DP rank idle)")
    p.add_argument("--offline", action="store_true",
                   help="the engine's offline data parallel as its documentation shows it instead of its server: a "
                        "process per DP rank (vLLM: VLLM_DP_RANK, VLLM_DP_SIZE, ...), each generating its share of "
                        "the requests (without --dp: the matrix's offline entries)")
    p.add_argument("--late-zeroing", action="store_true",
                   help="the last rank of each EP group zeroes its MoeAlltoAll workspace row only once the first has "
                        "moved on (posted its dispatch or entered a collective spanning it), in the engine's own "
                        "processes: the race FlashInfer before 0.7.1 leaves its caller to order, made to happen; the "
                        "report says what ordered it (one-sided; without --dp: the matrix's entries it applies to)")
    p.add_argument("--dtype", default="bfloat16", help="the model's dtype: bfloat16 (default) or float32")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the checkpoint's and the requests' seed")
    p.add_argument("--profile", metavar="RELEASE",
                   help="the fake's FlashInfer release (default: the one the engine's metadata pins)")
    p.add_argument("--mutant", metavar="NAME", help="serve against this mutant of the engine's code")
    p.add_argument("--mutants", action="store_true",
                   help="hunt every mutant only a served engine reaches (its own serving loop): each on the serve "
                        "matrix's entries, those with an idle DP rank first, until one kills it (default --timeout 60)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="per server run, from its readiness to its last answer (default 240; its start-up has "
                        "400 s of its own)")
    p.add_argument("--json", metavar="PATH", help="write the verdicts as JSON")
    output_arguments(p)
    source_arguments(p)


def main(args) -> int:
    from testbed import integrations
    from testbed.harness import engine_tests, serve

    engine = integrations.get(args.integration).engine
    source = getattr(args, f"{args.integration}_source")
    try:
        version, code, _ = engine_tests.engine_source(engine, source)
        pin = engine_tests.engine_pin(engine, source, version, args.profile)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.mutants and (args.mutant or args.dp is not None):
        raise UsageError("--mutants hunts on the serve matrix: give no --mutant or --dp with it")
    log = Path(args.log) if args.log else Path(tempfile.mkstemp(prefix="a2a-serve-", suffix=".log")[1])
    with contextlib.ExitStack() as stack:
        if args.verbose:
            terminal = sys.stdout
        else:
            from testbed import console

            # The servers write to the log themselves; this process's own imports of the engine
            # (taking its release, its findings' and mutants' probes) print there too.
            terminal = stack.enter_context(console.engine_output_to(str(log)))
        scenarios = _scenarios(args, engine, source, version, pin, )
        print(f"{engine.label} {version} served on FlashInfer {pin} (the fake)"
              + ("" if args.verbose else f"; the engine's output: {log} (-v shows it live)"), file=terminal, flush=True)
        if args.mutants:
            return _hunt(args.integration, scenarios, code, args, log, terminal)
        verdicts = _serve_all(scenarios, code, args, log, terminal)
    if args.json:
        Path(args.json).write_text(json.dumps([serve.as_json(v) for v in verdicts], indent=1))
    errors = sum(bool(v.testbed_error) for v in verdicts)
    failed = sum(not v.passed for v in verdicts) - errors
    known = sum(bool(v.known) for v in verdicts)
    print(f"{len(verdicts) - failed - errors} passed ({known} known), {failed} failed"
          + (f", {errors} the testbed's errors" if errors else "") + f"; the engine's output: {log}", flush=True)
    return 1 if failed or errors else 0


def _scenarios(args, engine, source, version: str, pin: str, ) -> list:
    """The engine's release taken (this process judges it: its findings' and mutants' probes
    read its code), the mutant checked, and the scenarios the flags name (the matrix without
    --dp)."""
    from testbed.harness import mutants, serve
    from testbed.integrations.served import named
    from testbed.scenario.model import ScenarioInputError

    why = engine.use(source)
    if why:
        raise UsageError(why)
    flag = f"--{args.integration}-source {source}" if source else f"--integration {args.integration}"
    if engine.serving.plugins and importlib.util.find_spec(engine.serving.plugins) is None:
        raise UsageError(f"{flag}: {engine.label} {version} has no "
                         f"{engine.serving.plugins}, the plugin loader through which the testbed's stand-ins and "
                         "recorders go into the processes it starts: it cannot be served")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout: must be > 0, got {args.timeout}")
    if args.mutant:
        try:
            owner = mutants.owner_of(args.mutant)
        except ValueError as e:
            raise UsageError(f"--mutant: {e}") from None
        if owner.name != args.integration:
            raise UsageError(f"--mutant: {args.mutant} changes --integration {owner.name}'s code, not "
                              f"{args.integration}'s")
        na = mutants.get(args.mutant).not_applicable_served()
        if na:
            raise UsageError(f"--mutant: {args.mutant} is {na[0]} on {engine.label} {version}: {na[1]}")
    try:
        if args.dp is None:
            entries = serve.matrix(args.integration, pin, args.dtype, args.seed)
            entries = [ss for ss in entries if ss.offline] if args.offline else entries
            entries = _late_zeroing(entries) if args.late_zeroing else entries
        else:
            entries = [serve.ServeScenario(dp=args.dp, tp=args.tp, path=args.path, requests=args.requests,
                                           integration=args.integration, dtype=args.dtype, profile=pin, seed=args.seed,
                                           offline=args.offline, late_zeroing=args.late_zeroing)]
    except ScenarioInputError as e:
        raise UsageError(str(e)) from None
    refusal = named(engine.serving.refusal) if engine.serving.refusal else None
    for ss in entries:
        why = refusal and refusal(ss.engine_scenario())
        if why:
            raise UsageError(f"{flag}: {ss.describe()}: {why}")
    return entries


def _late_zeroing(entries: list) -> list:
    """The entries the late zeroing applies to, with it; the first entry's refusal where it
    applies to none."""
    from dataclasses import replace

    from testbed.scenario.model import ScenarioInputError

    kept, refused = [], None
    for ss in entries:
        try:
            kept.append(replace(ss, late_zeroing=True))
        except ScenarioInputError as e:
            refused = refused or e
    if not kept and refused:
        raise refused
    return kept


def _serve_all(scenarios, code, args, log: Path, terminal) -> list:
    """Each scenario served and judged against one reference server (DP 1) of the most
    requests any of them sends; each report printed as it ends."""
    from testbed.harness import serve
    from testbed.harness.invariants import Failure

    timeout = args.timeout or serve.DEFAULT_TIMEOUT_S
    live = args.verbose
    most = max(scenarios, key=lambda s: s.requests)
    started = time.monotonic()
    reference, trouble = serve.serve_reference(most, most.requests, code=code, timeout_s=timeout,
                                               log=None if live else log, live=live)
    print(f"  reference: {most.requests} requests served at DP 1 without expert parallel in "
          f"{time.monotonic() - started:.1f} s" + (f": {trouble}" if trouble else ""), file=terminal, flush=True)
    verdicts = []
    for i, ss in enumerate(scenarios, 1):
        v = serve.run(ss, code=code, reference=reference, mutant=args.mutant, timeout_s=timeout,
                      log=None if live else log, live=live)
        if trouble:
            v.failures.insert(0, Failure("completes", f"the reference server (DP 1, expert parallel off): {trouble}"))
        verdicts.append(v)
        print("\n".join(serve.report_lines(i, len(scenarios), v, mutant=args.mutant)), file=terminal, flush=True)
    return verdicts


HUNT_TIMEOUT_S = 60.0  # answers normally take 20-30 s here; a mutant that hangs the served engine ends at this


def _hunt(integration: str, scenarios, code, args, log: Path, terminal) -> int:
    """Each mutant only a served engine reaches (:attr:`Mutant.served`), served on the matrix's
    entries (an idle DP rank first) until one of its ``expect`` pairs shows
    (:func:`runner.killing_failure`); printed and written as ``a2a-testbed mutants`` does."""
    from testbed.harness import mutants, report, runner, serve

    started = time.monotonic()
    timeout = args.timeout or HUNT_TIMEOUT_S
    catalogue = [m for m in mutants.catalogue(integration) if m.served]
    absent = {m.name: na for m in catalogue if (na := m.not_applicable_served())}
    order = sorted(scenarios, key=lambda ss: ss.requests >= ss.dp)
    hunts = []
    print(report.hunt_header(), file=terminal, flush=True)
    for name, (kind, why) in absent.items():
        print(report.not_applicable_line(name, kind, why), file=terminal, flush=True)
    for m in (m for m in catalogue if m.name not in absent):
        began, h = time.monotonic(), None
        for ss in order:
            v = serve.run(ss, code=code, reference={}, mutant=m.name, timeout_s=timeout, log=log)
            if v.testbed_error:  # a mutant the testbed cannot apply is broken, never killed
                h = runner.Hunt(m.name, False, f"broken: {v.testbed_error}", time.monotonic() - began)
                break
            f = runner.killing_failure(m, v.failures + v.known_failures)
            if f is not None:
                h = runner.Hunt(m.name, True, f"{f.invariant} @ {ss.label}", time.monotonic() - began,
                                f.evidence.splitlines()[0][:300], ss.label)
                break
        hunts.append(h or runner.Hunt(m.name, False, "survived", time.monotonic() - began))
        print(report.hunt_line(hunts[-1]), file=terminal, flush=True)
    if args.json:
        report.dump_json(args.json, report.hunts_json(hunts, absent, time.monotonic() - started))
    print(report.hunts_summary(hunts, absent, time.monotonic() - started), file=terminal, flush=True)
    return 0 if hunts and all(h.killed for h in hunts) else 1
