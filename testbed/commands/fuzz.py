"""``a2a-testbed fuzz``: Hypothesis over the scenario model; each failure printed as its
``run`` line."""

from __future__ import annotations

import time

from testbed.commands.common import integrations, need_engine, positive

NAME = "fuzz"


def add_parser(sub) -> None:
    fz = sub.add_parser("fuzz", help="Hypothesis over the scenario model; failures printed as run lines")
    fz.add_argument("--examples", type=int, default=50, metavar="N", help="scenarios to draw (default 50)")
    fz.add_argument("--seed", type=int, default=None, metavar="S",
                    help="random draw from this seed (default: derandomized, the same every time)")
    fz.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per-scenario timeout")
    fz.add_argument("--integration", choices=integrations().names(), default="impl",
                    help="draw scenarios of impl (default) or of the installed vLLM's or SGLang's classes")
    fz.add_argument("--junit-xml", metavar="PATH",
                    help="write JUnit XML: a test case per example run (shrinking's included), failures with "
                         "their evidence and reproducing line")


def main(args) -> int:
    from testbed.harness import report, runner
    from testbed.harness.fuzz import ScenarioFailed, fuzz

    positive("--examples", args.examples)
    if integrations().get(args.integration).engine is not None:
        need_engine(args.integration)
    positive("--timeout", args.timeout)
    progress = report.Progress()
    started = time.monotonic()
    verdicts = []
    with runner.scenario_pool() as pool:
        def check(sc):
            progress.show(f"[{len(verdicts) + 1}] {sc.short()}")
            verdicts.append(runner.run(pool, sc, timeout_s=args.timeout))
            return verdicts[-1]

        try:
            fuzz(check, examples=args.examples, seed=args.seed,
                 strategy=integrations().get(args.integration).strategy())
        except ScenarioFailed as e:
            progress.clear()
            print(f"FAIL (shrunk) {e.verdict.scenario.short()}")
            print(report.failure_text(e.verdict))
            print(f"fuzz: a failing scenario after {len(verdicts)} runs in {time.monotonic() - started:.1f} s")
            _fuzz_junit(args, verdicts, started)
            return 1
    progress.clear()
    count = len(verdicts)
    _fuzz_junit(args, verdicts, started)
    print(f"fuzz: {count} scenarios passed every invariant in {time.monotonic() - started:.1f} s "
          f"({'seed ' + str(args.seed) if args.seed is not None else 'derandomized'})")
    return 0


def _fuzz_junit(args, verdicts, started: float) -> None:
    from testbed.harness import junit

    if args.junit_xml:
        junit.write(args.junit_xml, "fuzz", [junit.verdict_case(i, v, f"fuzz.{args.integration}")
                                             for i, v in enumerate(verdicts, 1)], time.monotonic() - started)
