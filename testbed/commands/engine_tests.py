"""``a2a-testbed engine-tests``: the engine repository's own multi-GPU tests of its FlashInfer
all-to-all, run on the CPU on stand-in accelerators (:mod:`testbed.harness.engine_tests`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from testbed.commands.common import UsageError, output_arguments, source_arguments

NAME = "engine-tests"


def add_parser(sub) -> None:
    from testbed import integrations

    p = sub.add_parser(
        NAME, help="the engine's own multi-GPU tests of its FlashInfer all-to-all, run on the CPU",
        description=(
            "Runs the engine repository's own tests of its FlashInfer all-to-all (a checkout's, or a release's from "
            "its source distribution) with pytest --fake-flashinfer=PIN --fake-devices N: the fake in every process "
            "the tests spawn, N stand-in accelerators. The engine's output goes to a log; one line per test that "
            "did not pass, the verdict last. Arguments after -- go to pytest."))
    p.add_argument("--integration", choices=[i.name for i in integrations.engines()], default="vllm",
                   help="whose tests (default: %(default)s)")
    p.add_argument("--profile", metavar="RELEASE",
                   help="the fake's FlashInfer release (default: the one the engine's metadata or checkout pins)")
    p.add_argument("--devices", type=int, default=2, metavar="N", help="stand-in accelerators (default 2)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                   help="for the whole pytest session, after which it and its workers are killed (default 1800)")
    p.add_argument("--junit-xml", metavar="PATH", help="keep pytest's JUnit XML report here")
    p.add_argument("pytest_args", nargs="*", metavar="-- PYTEST-ARGS", help="passed to pytest as they are")
    output_arguments(p)
    source_arguments(p)


def main(args) -> int:
    from testbed import integrations
    from testbed.harness import engine_tests

    if args.devices < 1:
        raise UsageError(f"--devices: the number of stand-in accelerators must be >= 1, got {args.devices}")
    engine = integrations.get(args.integration).engine
    try:
        plan = engine_tests.plan_for(engine, getattr(args, f"{args.integration}_source"), args.profile, args.devices)
    except ValueError as e:
        raise UsageError(str(e)) from None
    log = Path(args.log) if args.log else Path(tempfile.mkstemp(prefix="a2a-engine-tests-", suffix=".log")[1])
    junit = Path(args.junit_xml) if args.junit_xml else log.with_suffix(".xml")
    print(f"{plan.engine}: pytest's and the engine's output: {log} (-v shows it live)" if not args.verbose
          else plan.engine, flush=True)
    outcomes, trouble = engine_tests.run(plan, log, junit, args.timeout, tuple(args.pytest_args), live=args.verbose)
    lines = engine_tests.summary_lines(plan, outcomes, trouble)
    print("\n".join(lines), flush=True)
    return 0 if lines[-1].startswith("PASS") else 1
