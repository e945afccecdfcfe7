"""``a2a-testbed mutants``: an integration's catalogue of mutants, each hunted by its matrix
until a scenario kills it."""

from __future__ import annotations

import json
import time

from testbed.commands.common import (MUTANT_TIMEOUT_S, UsageError, campaign, each, engine_in_use, integrations,
                                     output_arguments, positive, ray_arguments, source_arguments)

NAME = "mutants"


def add_parser(sub) -> None:
    mu = sub.add_parser("mutants", help="run the catalogue of mutants of an integration; each must be killed")
    mu.add_argument("--integration", choices=integrations().names(), default="impl",
                    help="whose code the mutants change: impl (default) or the installed vLLM's or SGLang's, hunted "
                         "by its matrix")
    mu.add_argument("--only", action="append", metavar="NAME", help="just this mutant (repeatable)")
    output_arguments(mu)
    mu.add_argument("--touching", action="append", metavar="FILE",
                    help="just the mutants of this file of the integration's code, as a checkout or a pull request's "
                         "diff names it (repeatable; e.g. vllm/distributed/device_communicators/all2all.py)")
    mu.add_argument("--list", action="store_true", help="list the mutants and exit")
    mu.add_argument("--timeout", type=float, default=MUTANT_TIMEOUT_S, metavar="S", help="per-scenario timeout")
    ray_arguments(mu)
    mu.add_argument("--json", metavar="PATH", help="write the table as JSON")
    mu.add_argument("--hints", metavar="PATH",
                    help="the --json of an earlier mutants run (another release's, say): each mutant is hunted "
                         "first by the scenario that killed it there; only the order changes, never the verdict")
    source_arguments(mu)
    mu.add_argument("--junit-xml", metavar="PATH",
                    help="write JUnit XML: a test case per mutant, a survivor a failure with why")


def main(args) -> int:
    from testbed.harness import mutants

    catalogue = mutants.catalogue(args.integration)
    if args.list:
        for m in catalogue:
            print(f"{m.name:32s} {m.description}")
        return 0
    names = args.only or [m.name for m in catalogue]
    for name in names:
        if name not in {m.name for m in catalogue}:
            raise UsageError(f"--only: unknown {args.integration} mutant {name!r} (a2a-testbed mutants "
                             f"--integration {args.integration} --list)")
    if args.touching:
        names = [m.name for m in catalogue if m.name in names and mutants.touches(m, args.touching)]
        if not names:
            print(f"no {args.integration} mutant changes {', '.join(args.touching)}: nothing to hunt", flush=True)
            return 0
    positive("--timeout", args.timeout)
    for other in integrations().engines():
        if getattr(args, f"{other.name}_source") and args.integration != other.name:
            raise UsageError(f"--{other.name}-source goes with --integration {other.name}")
    engine = integrations().get(args.integration).engine
    if engine is None:
        return _hunt(args, catalogue, names, engine)
    with engine_in_use(args, args.integration, getattr(args, f"{args.integration}_source")):
        return _hunt(args, catalogue, names, engine)


def _hunt(args, catalogue, names, engine) -> int:
    """``mutants`` on ``args.integration``, its engine (None for impl) in use."""
    from testbed.harness import mutants, report, runner
    from testbed.harness.matrix import on_integration

    # An engine's matrix on the FlashInfer it pins; impl's, each scenario on its own.
    scenarios = on_integration(args.integration, engine.pinned() if engine else None)[0]
    started = time.monotonic()
    hunts = []
    print(report.hunt_header())
    absent = {m.name: mutants.not_applicable(m) for m in catalogue if m.name in names}
    absent = {name: found for name, found in absent.items() if found}
    for name, (kind, why) in absent.items():
        print(report.not_applicable_line(name, kind, why), flush=True)
    names = [name for name in names if name not in absent]
    hints = _kill_hints(args.hints)

    def show(h) -> None:
        print(report.hunt_line(h), flush=True)
        hunts.append(h)

    if args.ray:
        with campaign(args) as hosts:
            for _, h in hosts.hunt(names, scenarios, timeout_s=args.timeout, hints=hints):
                show(h)
    else:
        with runner.scenario_pool() as pool:
            for _, h in each(names, str, lambda name: runner.hunt(pool, name, scenarios, timeout_s=args.timeout,
                                                                    first=hints.get(name))):
                show(h)
    killed = sum(h.killed for h in hunts)
    if args.junit_xml:
        from testbed.harness import junit

        junit.write(args.junit_xml, "mutants", [
            junit.Case(h.mutant, f"mutants.{args.integration}", h.seconds, output=f"killed by {h.by}: {h.evidence}")
            if h.killed else junit.Case(h.mutant, f"mutants.{args.integration}", h.seconds,
                                        failure=f"{h.mutant} SURVIVED: {h.by}\nreproduce: a2a-testbed mutants "
                                                f"--integration {args.integration} --only {h.mutant}")
            for h in hunts], time.monotonic() - started)
    if args.json:
        report.dump_json(args.json, report.hunts_json(hunts, absent, time.monotonic() - started))
    print(report.hunts_summary(hunts, absent, time.monotonic() - started))
    return 0 if killed == len(hunts) else 1


def _kill_hints(path: str | None) -> dict[str, str]:
    """``{mutant: label of the scenario that killed it}`` from ``--hints PATH`` (a mutants
    ``--json``); empty without one."""
    if not path:
        return {}
    try:
        with open(path) as f:
            hunts = json.load(f)["mutants"]
        return {h["mutant"]: h["scenario"] for h in hunts if h.get("killed") and h.get("scenario")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--hints: {path} is not the --json of a2a-testbed mutants ({type(e).__name__}: {e})") from None
