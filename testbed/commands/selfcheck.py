"""``a2a-testbed run --job selfcheck``: the cluster's collectives and groups over layouts, or
a cluster fault injected and checked to be caught the expected way."""

from __future__ import annotations

import json
import time

from testbed.commands.common import UsageError

CLUSTER_FAULTS = ("crash", "stall", "sigkill", "wrong-group-barrier")


def selfcheck(args) -> int:
    from testbed.cluster.layout import DEFAULT_LAYOUTS, ParallelLayout
    from testbed.cluster.pool import RankPool
    from testbed.cluster.selfcheck import check_layouts

    try:
        layouts = [ParallelLayout.parse(t) for t in args.layout or DEFAULT_LAYOUTS]
    except ValueError as e:
        raise UsageError(f"--layout: {e}") from None
    timeout = args.timeout or 60.0
    started = time.monotonic()
    with RankPool() as pool:
        if args.fault:
            rows = [_run_fault(pool, args.fault, layout, timeout) for layout in layouts]
        else:
            rows = [{"layout": c.layout, "ok": c.ok, "seconds": round(c.seconds, 3), "detail": c.detail}
                    for c in check_layouts(pool, layouts, timeout_s=timeout)]
    for row in rows:
        print(f"{'PASS' if row['ok'] else 'FAIL'} {row['layout']:<14} {row['seconds']:7.2f} s  {row['detail']}")
    summary = {"job": "selfcheck", "fault": args.fault, "layouts": [row["layout"] for row in rows],
               "passed": sum(row["ok"] for row in rows), "failed": sum(not row["ok"] for row in rows),
               "seconds": round(time.monotonic() - started, 3)}
    print(json.dumps(summary))
    return 0 if summary["failed"] == 0 else 1


def _run_fault(pool, fault: str, layout, timeout_s: float) -> dict:
    """Inject one cluster fault; ``ok`` only when the watchdog reported the expected failure."""
    from testbed.cluster import faults
    from testbed.cluster.pool import ScenarioError

    row = {"layout": str(layout), "ok": False, "seconds": 0.0}
    if fault == "wrong-group-barrier":
        if layout.pp < 2:
            return row | {"detail": "wrong-group-barrier needs a layout with pp >= 2"}
        fn, fn_args = faults.rebuild_barriers, ((2,) + (1,) * (layout.pp - 1), "world")
    else:
        fn, fn_args = {"crash": faults.crash, "stall": faults.stall, "sigkill": faults.sigkill}[fault], ((0,),)
    started = time.monotonic()
    try:
        pool.run(fn, layout, fn_args, timeout_s=timeout_s, name=f"fault-{fault}")
    except ScenarioError as exc:
        row["seconds"] = time.monotonic() - started
        problem = faults.unexpected(fault, layout, exc)
        if problem:
            return row | {"detail": f"caught the wrong failure ({problem}):\n{type(exc).__name__}: {exc}"}
        return row | {"ok": True, "detail": f"caught as expected: {type(exc).__name__}\n{exc}"}
    return row | {"seconds": time.monotonic() - started,
                  "detail": f"fault {fault} was injected but every rank finished"}
