"""``a2a-testbed sweep``: the catalogues run whole, a group's in a process of its own; what
CI fails on."""

from __future__ import annotations

import os
import time

from testbed.commands.common import UsageError, positive

NAME = "sweep"


def add_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep", help="run the catalogues whole, a group's in a process of its own; any problem fails",
        description=(
            "Nothing sampled: impl's matrix (as it is and on the newest FlashInfer release), the model matrix with "
            "every release, and each installed engine's whole history (a2a-testbed history --findings: every "
            "release's matrix, mutants and findings' survey, each on the FlashInfer the release pins, held to the "
            "judges of each and to docs/findings.md's lineage table), the installed release's reuse differential, "
            "its engine and serve matrices on the installed and the newest release, and its served mutants. Each an "
            "a2a-testbed command judged from its JSON; a group's commands run one after another in a process of "
            "their own. Exit 1 on any problem; each group's output goes to a log file."))
    sw.add_argument("--list", action="store_true", help="list the sweeps (and the engines left out) and exit")
    sw.add_argument("--only", action="append", metavar="NAME", help="just this sweep (repeatable; --list names them)")
    sw.add_argument("--skip", action="append", metavar="NAME",
                    help="every sweep but this one (repeatable; --list names them): what a time-boxed job leaves to "
                         "another, which runs it with --only")
    sw.add_argument("--served", choices=("with", "without", "only"), default="with",
                    help="the sweeps of an engine served as users serve it (a2a-testbed serve): with the others "
                         "(default), without them, or only them (they start a dozen engine processes each: CI runs "
                         "them after the others, alone)")
    sw.add_argument("--shard", metavar="I/N", help="groups I, I+N, ... of the catalogue (split it over N machines)")
    sw.add_argument("--jobs", type=int, default=1, metavar="N", help="groups of sweeps run at once (default 1)")
    sw.add_argument("--logs", metavar="DIR", help="where each sweep's output goes (default: a new temporary folder)")
    sw.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds per sweep (default 1800; a history, the model matrix and a served matrix have more of their own)")
    sw.add_argument("--json", metavar="PATH", help="write the outcomes as JSON")
    sw.add_argument("--junit-xml", metavar="PATH", help="write JUnit XML: one test case per sweep")


def main(args) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from testbed.harness import report, sweeps

    positive("--jobs", args.jobs)
    positive("--timeout", args.timeout)
    catalogue = [s for s in sweeps.catalogue() if args.served == "with" or (s.argv[0] == "serve") == (args.served == "only")]
    for flag, names in (("--only", args.only), ("--skip", args.skip)):
        for name in names or ():
            if name not in {s.name for s in catalogue}:
                raise UsageError(f"{flag}: no sweep {name!r} here (a2a-testbed sweep --list names them)")
    chosen = sweeps.groups([s for s in catalogue
                            if (not args.only or s.name in args.only) and s.name not in (args.skip or ())])
    left_out = sweeps.missing() + [f"{name} (--skip; a2a-testbed sweep --only {name!r} runs it)"
                                   for name in args.skip or ()]
    if args.list:
        for sweep in (s for group in chosen for s in group):
            print(f"{sweep.name:32s} {sweep.command}" + (f"   [with {sweep.group}]" if sweep.group else ""))
        for why in left_out:
            print(f"left out: {why}")
        return 0
    if args.shard:
        try:
            chosen = sweeps.shard(chosen, args.shard)
        except ValueError as e:
            raise UsageError(str(e)) from None
    log_dir = args.logs or sweeps.default_log_dir()
    os.makedirs(log_dir, exist_ok=True)
    for why in left_out:
        print(f"left out: {why}")
    started = time.monotonic()
    outcomes = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for group in pool.map(lambda g: sweeps.run(g, log_dir, args.timeout or sweeps.SWEEP_TIMEOUT_S), chosen):
            for o in group:
                print(f"{'PASS' if o.passed else 'FAIL'}  {o.sweep.name:32s} {o.seconds:6.1f} s  {o.summary}", flush=True)
                for problem in o.problems[:8]:
                    print(f"    {problem}")
                if len(o.problems) > 8:
                    print(f"    ... {len(o.problems) - 8} more (all in --json)")
                if not o.passed:
                    print(f"    log: {o.log}\n    rerun: {o.sweep.command}")
                outcomes.append(o)
    seconds = time.monotonic() - started
    failed = sum(not o.passed for o in outcomes)
    if args.junit_xml:
        from testbed.harness import junit

        junit.write(args.junit_xml, "sweeps", [
            junit.Case(o.sweep.name, "sweeps", o.seconds, output=o.summary) if o.passed else
            junit.Case(o.sweep.name, "sweeps", o.seconds, failure="\n".join(o.problems) + f"\nrerun: {o.sweep.command}")
            for o in outcomes], seconds)
    if args.json:
        report.dump_json(args.json, {"passed": len(outcomes) - failed, "failed": failed, "seconds": round(seconds, 3),
                                     "sweeps": [{"name": o.sweep.name, "command": o.sweep.command, "passed": o.passed,
                                                 "problems": o.problems, "seconds": round(o.seconds, 3),
                                                 "log": o.log} for o in outcomes]})
    print(f"sweeps: {len(outcomes) - failed} passed, {failed} failed in {seconds:.1f} s (logs in {log_dir})")
    return 1 if failed or not outcomes else 0
