"""``a2a-testbed``: the command-line runner.

``run`` is the main job. For now it is the cluster self-check over a few layouts (or the
ones given), optionally with an injected fault; it prints one line per layout and a final
JSON summary, and exits 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from testbed import __version__

FAULTS = ("crash", "stall", "sigkill", "wrong-group-barrier")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2a-testbed",
        description="Simulation-first testbed for FlashInfer NVLink MoE all-to-all on CPU ranks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the testbed, torch and Python versions")
    run = sub.add_parser(
        "run",
        help="run the cluster self-check over parallel layouts (optionally injecting a fault)",
        description=(
            "Run every collective the testbed relies on over each layout's world, TP, DP, PP "
            "and EP groups and check the groups against the layout. With --fault, run that "
            "fault instead and print the watchdog's report."
        ),
    )
    run.add_argument(
        "--layout", action="append", metavar="W,TP,DP,PP",
        help="a layout such as 8,2,2,2 or w8tp2dp2pp2 (repeatable; default: %(default)s)",
    )
    run.add_argument("--fault", choices=FAULTS, help="inject this fault (on rank 0 / PP stage 0)")
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
    from testbed.layout import DEFAULT_LAYOUTS, ParallelLayout

    texts = args.layout or list(DEFAULT_LAYOUTS)
    try:
        layouts = [ParallelLayout.parse(t) for t in texts]
    except ValueError as exc:
        parser.error(str(exc))
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, got {args.timeout}")
    from testbed.cluster import RankPool  # torch is imported only once the input is good
    from testbed.selfcheck import check_layouts

    started = time.monotonic()
    with RankPool() as pool:
        if args.fault:
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
        "job": "fault" if args.fault else "selfcheck",
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
    from testbed import faults
    from testbed.cluster import ScenarioError

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
