"""``a2a-testbed history``: every release of an engine since its FlashInfer all-to-all
appeared, each run or refused."""

from __future__ import annotations

import shlex
import sys
import time

from testbed.commands.common import UsageError, integrations, positive

NAME = "history"


def add_parser(sub) -> None:
    hi = sub.add_parser(
        "history", help="every release of an engine since its FlashInfer all-to-all appeared: run or refused",
        description=(
            "For each release of the engine's history (or --release), in a process of its own (--jobs at once): its "
            "layer matrix on the FlashInfer its metadata pins, then its mutants, or the one line the adapter refuses it with. "
            "Prints a row per release (the profile serving its pin; passed / failed / known / testbed errors / not "
            "run; mutants killed of applicable) and writes them, dated, with --json. Exit 1 on a FAIL, a testbed "
            "error or a surviving mutant."))
    hi.add_argument("--integration", required=True, metavar="NAME", help="an engine (vllm, sglang)")
    hi.add_argument("--release", action="append", metavar="RELEASE", help="just this release (repeatable)")
    hi.add_argument("--no-mutants", action="store_true", help="the matrices alone")
    hi.add_argument("--reuse-differential", action="store_true",
                    help="each release's matrix again on fresh process groups (run --reuse-differential); a verdict "
                         "that differs is a failure of the release's row")
    hi.add_argument("--findings", action="store_true",
                    help="each release's findings' survey too (findings --here), in the release's process")
    hi.add_argument("--keep", metavar="DIR",
                    help="keep what each release's commands wrote (JSON and output) in DIR/<release>/")
    hi.add_argument("--jobs", type=int, default=3, metavar="N",
                    help="releases run at once, each in a process of its own (default %(default)s: a release's "
                         "ranks mostly wait on each other, so two cores carry three)")
    hi.add_argument("--json", metavar="PATH", help="write the rows as JSON, with the date and the command")


def main(args) -> int:
    from pathlib import Path

    from testbed.harness import history, report

    if args.integration not in integrations().names() or integrations().get(args.integration).engine is None:
        raise UsageError(f"--integration {args.integration}: not an engine (engines: "
                         + ", ".join(i.name for i in integrations().engines()) + ")")
    engine = integrations().get(args.integration).engine
    releases = args.release or list(engine.history)
    positive("--jobs", args.jobs)
    started = time.monotonic()
    if args.findings and not integrations().get(args.integration).findings():
        raise UsageError(f"--findings: {args.integration} has no findings to survey")
    rows = history.survey(integrations().get(args.integration), releases, mutants=not args.no_mutants,
                          log=lambda line: print(line, flush=True), jobs=args.jobs,
                          differential=args.reuse_differential, findings=args.findings,
                          keep=Path(args.keep).resolve() if args.keep else None)
    print(history.markdown(rows))
    if args.json:
        report.dump_json(args.json, history.as_json(rows, shlex.join(["a2a-testbed", *sys.argv[1:]]),
                                                    time.monotonic() - started))
    print(history.summary(rows, time.monotonic() - started))
    return 1 if any(row.failures for row in rows) else 0
