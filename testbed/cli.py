"""``a2a-testbed``: the command-line runner.

``run`` is the main job, over a few layouts (or the ones given): ``--job selfcheck`` checks
the simulated cluster's collectives and groups; ``--job moe`` drives the integration
(``impl``) through MoE layers on every rank against the dense reference. ``--fault`` injects
a cluster fault (crash, stall, sigkill, wrong-group barrier) or one of the historical
integration bugs (double reduce, first-layer workspace, world-scoped rebuild barrier,
unprobed ``output=``) and reports whether and how the testbed caught it. One line per
layout, then a JSON summary; exit 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from testbed import __version__

CLUSTER_FAULTS = ("crash", "stall", "sigkill", "wrong-group-barrier")
MUTANT_FAULTS = ("double-reduce", "first-layer-workspace", "world-barrier-rebuild", "unprobed-output")
FORMATS = ("bf16", "nvfp4", "mxfp8", "fp8_block")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2a-testbed",
        description="Simulation-first testbed for FlashInfer NVLink MoE all-to-all on CPU ranks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the testbed, torch and Python versions")
    run = sub.add_parser(
        "run",
        help="check parallel layouts: the cluster self-check or the MoE integration (optionally injecting a fault)",
        description=(
            "selfcheck: run every collective the testbed relies on over each layout's world, TP, "
            "DP, PP and EP groups and check the groups against the layout. moe: build the "
            "integration's managers and MoE layers on every rank (PP stage 0 gets every format, "
            "later stages the first) and compare each layer's output with a dense fp32 "
            "reference. With --fault, inject that fault instead and report whether it was caught."
        ),
    )
    run.add_argument("--job", choices=("selfcheck", "moe"), default="selfcheck",
                     help="what to check (default: %(default)s; integration faults imply moe)")
    run.add_argument("--path", choices=("one_sided", "two_sided"), default="one_sided",
                     help="moe: FlashInfer all-to-all to drive (default: %(default)s)")
    run.add_argument("--profile", default="0.7.2",
                     help="moe: FlashInfer release the fake imitates (default: %(default)s)")
    run.add_argument("--formats", default="nvfp4,bf16", metavar="F[,F...]",
                     help=f"moe: activation format of each layer, from {', '.join(FORMATS)} "
                          "(default: %(default)s)")
    run.add_argument(
        "--layout", action="append", metavar="W,TP,DP,PP",
        help="a layout such as 8,2,2,2 or w8tp2dp2pp2 (repeatable; default: %(default)s)",
    )
    run.add_argument("--fault", choices=CLUSTER_FAULTS + MUTANT_FAULTS,
                     help="inject this fault: a cluster fault (on rank 0 / PP stage 0) or an integration bug")
    run.add_argument("--timeout", type=float, default=60.0, metavar="S",
                     help="per-scenario watchdog timeout in seconds (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "version":
        import torch

        print(f"a2a-testbed {__version__} (torch {torch.__version__}, Python {sys.version.split()[0]})")
        return 0
    if args.command == "run":
        return _run(args, parser)
    parser.print_help()
    return 2


def _run(args, parser) -> int:
    from testbed.cluster.layout import DEFAULT_LAYOUTS, ParallelLayout

    texts = args.layout or list(DEFAULT_LAYOUTS)
    try:
        layouts = [ParallelLayout.parse(t) for t in texts]
    except ValueError as exc:
        parser.error(str(exc))
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    formats = tuple(f for f in args.formats.split(",") if f)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        parser.error(f"--formats takes a comma-separated list from {', '.join(FORMATS)}; got {args.formats!r}")
    job = "moe" if args.fault in MUTANT_FAULTS else args.job
    if job == "moe" and args.fault in CLUSTER_FAULTS:
        parser.error(f"--fault {args.fault} is a cluster fault: use it with --job selfcheck")
    from fakes.flashinfer.profiles import PROFILES

    if args.profile not in PROFILES:
        parser.error(f"--profile must be one of {', '.join(PROFILES)}; got {args.profile!r}")
    from testbed.cluster.pool import RankPool  # torch is imported only once the input is good
    from testbed.scenario.moecheck import check_moe
    from testbed.cluster.selfcheck import check_layouts

    started = time.monotonic()
    with RankPool() as pool:
        if job == "moe":
            rows = [check_moe(pool, layout, kind=args.path, profile=args.profile, formats=formats,
                              fault=args.fault, timeout_s=args.timeout) for layout in layouts]
        elif args.fault:
            rows = [_run_fault(pool, args.fault, layout, args.timeout) for layout in layouts]
        else:
            rows = [
                {"layout": c.layout, "ok": c.ok, "seconds": round(c.seconds, 3), "detail": c.detail}
                for c in check_layouts(pool, layouts, timeout_s=args.timeout)
            ]
    for row in rows:
        status = "PASS" if row["ok"] else "FAIL"
        print(f"{status} {row['layout']:<14} {row['seconds']:7.2f} s  {row['detail']}")
    summary = {
        "job": job,
        "fault": args.fault,
        "layouts": [row["layout"] for row in rows],
        "passed": sum(row["ok"] for row in rows),
        "failed": sum(not row["ok"] for row in rows),
        "seconds": round(time.monotonic() - started, 3),
    }
    print(json.dumps(summary))
    return 0 if summary["failed"] == 0 else 1


def _run_fault(pool, fault: str, layout, timeout_s: float) -> dict:
    """Run one injected fault; ``ok`` means the watchdog caught it and said why."""
    from testbed.cluster import faults
    from testbed.cluster.pool import ScenarioError

    if fault == "wrong-group-barrier":
        if layout.pp < 2:
            return {"layout": str(layout), "ok": False, "seconds": 0.0,
                    "detail": "wrong-group-barrier needs a layout with pp >= 2"}
        fn, fn_args = faults.rebuild_barriers, ((2,) + (1,) * (layout.pp - 1), "world")
    else:
        fn, fn_args = {"crash": faults.crash, "stall": faults.stall,
                       "sigkill": faults.sigkill}[fault], ((0,),)
    started = time.monotonic()
    try:
        pool.run(fn, layout, fn_args, timeout_s=timeout_s, name=f"fault-{fault}")
    except ScenarioError as exc:
        return {"layout": str(layout), "ok": True, "seconds": time.monotonic() - started,
                "detail": f"caught: {type(exc).__name__}\n{exc}"}
    return {"layout": str(layout), "ok": False, "seconds": time.monotonic() - started,
            "detail": f"fault {fault} was injected but every rank finished"}


if __name__ == "__main__":
    sys.exit(main())
