"""``a2a-testbed run``: the integration matrix, one scenario, the model matrix, or the cluster
self-check; each scenario judged against every invariant."""

from __future__ import annotations

import shlex
import sys
import time

from testbed.commands.common import (REAL_TIMEOUT_S, UsageError, campaign, each, engine_in_use, integrations,
                                     output_arguments, positive, ray_arguments, source_arguments)
from testbed.commands.selfcheck import CLUSTER_FAULTS, selfcheck

NAME = "run"


def add_parser(sub) -> None:
    from testbed.scenario.model import add_arguments

    run = sub.add_parser(
        "run", help="run the integration matrix, one scenario, or the cluster self-check",
        description=(
            "With no scenario flags: the integration matrix (every path, format and profile, "
            "growth across layers, PP with different rebuild counts, TP 4, 0-token ranks), each "
            "scenario checked against every invariant. With scenario flags: that scenario. "
            "--job selfcheck: the cluster's collectives and groups over each --layout."),
    )
    output_arguments(run)
    run.add_argument("--job", choices=("integration", "selfcheck"), default="integration",
                     help="what to check (default: %(default)s)")
    run.add_argument("--layout", action="append", metavar="W,TP,DP,PP",
                     help="the scenario's layout (e.g. 8,2,2,2 or w8tp2dp2pp2); for selfcheck repeatable "
                          "(default: 2,1,2,1 4,2,2,1 4,1,2,2 8,2,2,2)")
    add_arguments(run)
    run.add_argument("--matrix-profile", metavar="RELEASE",
                     help="run the integration matrix moved to this FlashInfer release (e.g. 0.7.4: every "
                          "FlashInfer path through flashinfer.moe_ep); scenarios it cannot run are listed with the rule")
    run.add_argument("--models", nargs="?", const="", metavar="NAME,...",
                     help="the model matrix: each real model (default all; --model names them) at EP 8 in each of "
                          "its dispatch formats on every path of the pinned release, and on every FlashInfer path "
                          "of the other releases; scenarios the kernels refuse are listed with the rule")
    run.add_argument("--rotate", action="store_true",
                     help="with --models: each model on two of the other releases, in rotation so that each "
                          "release meets at least two models, not on all of them (the sweeps' sample)")
    run.add_argument("--mutant", metavar="NAME", help="run against this mutant of impl (a2a-testbed mutants --list)")
    run.add_argument("--fault", choices=CLUSTER_FAULTS, help="selfcheck: inject this cluster fault")
    run.add_argument("--reuse-differential", action="store_true",
                     help="run the scenarios again with every process group made fresh (none reused from an "
                          "earlier scenario) and fail on any verdict that differs")
    run.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="per-scenario watchdog timeout in seconds (default: 30, selfcheck 60, --backend flashinfer 600)")
    source_arguments(run)
    ray_arguments(run)
    run.add_argument("--show-gone", action="store_true",
                     help="a line per finding whose code the release no longer has (default: one line naming them)")
    run.add_argument("--show-not-run", action="store_true",
                     help="list each scenario not run with its rule (default: one line, a count per rule)")
    run.add_argument("--dry-run", action="store_true",
                     help="print each scenario's estimated shared memory, memory per rank and in all, and whether "
                          "it fits this machine; run nothing (exit 2 if one does not fit)")
    run.add_argument("--json", metavar="PATH", help="write the verdicts as JSON")
    run.add_argument("--html", metavar="PATH", help="write one self-contained HTML page")
    run.add_argument("--junit-xml", metavar="PATH",
                     help="write JUnit XML for CI: a test case per scenario (failures with their evidence and "
                          "reproducing line, scenarios not run skipped with the rule)")


def main(args) -> int:
    from testbed.scenario.model import scenario_given

    positive("--timeout", args.timeout)
    if args.job == "selfcheck":
        if scenario_given(args) or args.mutant or args.json or args.html:
            raise UsageError("--job selfcheck takes only --layout, --fault and --timeout")
        return selfcheck(args)
    if args.fault:
        raise UsageError(f"--fault {args.fault} is a cluster fault: use it with --job selfcheck")
    if args.mutant:
        from testbed.harness import mutants

        try:
            mutants.get(args.mutant)
        except ValueError as e:
            raise UsageError(f"--mutant: {e}") from None
    if args.backend not in (None, "fake"):
        return _judge_on(args.backend, args)
    args.integration = args.integration or "impl"
    for other in integrations().engines():
        if getattr(args, f"{other.name}_source") and args.integration != other.name:
            raise UsageError(f"--{other.name}-source goes with --integration {other.name}")
    engine = integrations().get(args.integration).engine
    if engine is None:
        return _run_integration(args, engine)
    with engine_in_use(args, args.integration, getattr(args, f"{args.integration}_source"), args.profile):
        return _run_integration(args, engine)


def _run_integration(args, engine) -> int:
    """``run`` on ``args.integration``, its engine (None for impl) in use."""
    from testbed.scenario.model import scenario_given

    if args.rotate and args.models is None:
        raise UsageError("--rotate goes with --models: it samples the model matrix's other releases")
    if args.models is not None:
        if scenario_given(args) or args.layout or args.matrix_profile:
            raise UsageError("--models runs the model matrix: give no scenario flags, --layout or --matrix-profile "
                             "with it")
        from testbed.harness.matrix import on_models

        try:
            scenarios, refused = on_models(tuple(filter(None, args.models.split(","))), args.integration,
                                           rotation=args.rotate)
        except ValueError as e:
            raise UsageError(f"--models: {e}") from None
        return _judge(scenarios, args, refused)
    if not (scenario_given(args) or args.layout) and (engine is not None or args.matrix_profile is None):
        from testbed.harness.matrix import on_integration

        try:  # an engine's matrix on the FlashInfer it pins; impl's, each scenario on its own
            scenarios, refused = on_integration(args.integration, args.matrix_profile
                                                or (engine.pinned() if engine else None))
        except ValueError as e:
            raise UsageError(f"--matrix-profile: {e}") from None
        return _judge(scenarios, args, refused)
    if args.matrix_profile is not None:
        if scenario_given(args) or args.layout:
            raise UsageError("--matrix-profile runs the whole matrix: give no scenario flags or --layout with it")
        from testbed.harness.matrix import on_release

        try:
            scenarios, refused = on_release(args.matrix_profile, integration=args.integration)
        except ValueError as e:
            raise UsageError(f"--matrix-profile: {e}") from None
        return _judge(scenarios, args, refused)
    return _judge(_scenarios(args), args)


def _judge_on(backend: str, args) -> int:
    """The scenario the flags give, or the matrix, on the real FlashInfer of this machine."""
    from testbed.gpu_env import installed_profile
    from testbed.harness.matrix import on_release
    from testbed.scenario.model import scenario_given

    if args.matrix_profile is not None:
        raise UsageError(f"--matrix-profile moves the fake to a release; --backend {backend} runs the installed one")
    try:
        profile = installed_profile()
    except ValueError as e:
        raise UsageError(f"--backend {backend}: {e}") from None
    import torch

    from testbed.cluster.launched import launch_env

    try:
        env = launch_env()
    except ValueError as e:
        raise UsageError(str(e)) from None
    # A launched job (torchrun, possibly over several nodes) has a GPU per rank; the pool, this machine's.
    gpus = env.world_size if env is not None else torch.cuda.device_count()
    args.timeout = args.timeout or REAL_TIMEOUT_S
    if scenario_given(args) or args.layout:
        if args.profile not in (None, profile):
            raise UsageError(f"--profile {args.profile}: --backend {backend} runs the installed release, {profile}")
        args.profile = profile
        scenarios = _scenarios(args)
        if scenarios[0].layout.world_size > gpus:
            raise UsageError(f"--layout: {scenarios[0].layout.world_size} ranks need as many GPUs (a rank per GPU); "
                             f"this machine has {gpus}")
        return _judge(scenarios, args)
    scenarios, refused = on_release(profile, backend, gpus)
    return _judge(scenarios, args, refused)


def _scenarios(args) -> list:
    from testbed.scenario.model import ScenarioInputError, from_args, scenario_given

    if scenario_given(args) or args.layout:
        if args.layout and len(args.layout) > 1:
            raise UsageError("--layout: a scenario has one layout (repeat it only with --job selfcheck)")
        engine = integrations().get(args.integration).engine if args.integration else None
        if engine is not None and args.profile is None and getattr(args, "backend", None) in (None, "fake"):
            args.profile = engine.pinned()  # an engine's scenario runs on the FlashInfer it pins
        try:
            return [from_args(args, args.layout[0] if args.layout else None)]
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
    from testbed.harness.matrix import MATRIX

    return list(MATRIX)


def _fitting(scenarios, args, refused) -> tuple[list, list]:
    """``scenarios`` that fit this machine, and ``refused`` with those that do not (one scenario
    given by its flags that does not fit is a usage error); with ``--dry-run`` print each
    estimate."""
    from testbed.scenario import footprint

    machine = footprint.Machine.here()
    fitting, refused = [], list(refused)
    for sc in scenarios:
        why = footprint.refusal(sc, machine)
        if getattr(args, "dry_run", False):
            fp = footprint.estimate(sc)
            print(f"{'FITS' if why is None else 'TOO BIG':8s} {sc.short()}  shm {fp.shm / footprint.GB:.3g} GB "
                  f"({fp.workspace_per_rank / footprint.MIB:.4g} MiB workspace per rank), rank "
                  f"{fp.per_rank / footprint.MIB:.4g} MiB, parent {fp.parent / footprint.MIB:.4g} MiB, in all "
                  f"{fp.resident / footprint.GB:.3g} GB" + (f": {why}" if why else ""), flush=True)
        if why is None:
            fitting.append(sc)
        elif len(scenarios) == 1 and not refused and not getattr(args, "dry_run", False):
            raise UsageError(f"--stages / --tokens: the scenario {why}")
        else:
            refused.append((sc, why))
    if getattr(args, "dry_run", False):
        print(f"machine: {machine.shm_free / footprint.GB:.3g} GB free in /dev/shm, {machine.memory / footprint.GB:.3g} "
              f"GB memory available; {len(fitting)} fit, {len(scenarios) - len(fitting)} do not")
    return fitting, refused


def _judge(scenarios, args, refused=()) -> int:
    """Run and judge ``scenarios``; ``refused``: the ``(scenario, rule)`` pairs not run. A
    scenario that will not fit this machine is refused before any rank starts."""
    from testbed.cluster.launched import launch_env

    before = len(refused)
    scenarios, refused = _fitting(scenarios, args, refused)
    if getattr(args, "dry_run", False):
        return 2 if len(refused) > before else 0
    try:
        env = launch_env()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if env is not None:
        return _judge_launched(env, scenarios, args, refused)
    from testbed.harness import report, runner

    started = time.monotonic()
    verdicts = {}
    timeout_s = args.timeout or runner.DEFAULT_TIMEOUT_S

    def show(i: int, v) -> None:
        print(report.verdict_line(i, len(scenarios), v), flush=True)
        if not v.passed:
            print(report.failure_text(v), flush=True)
        elif v.known:
            print(report.known_text(v), flush=True)
        verdicts[i] = v

    if args.ray:
        with campaign(args) as hosts:
            for i, v in hosts.run(scenarios, mutant=args.mutant, timeout_s=timeout_s):
                show(i + 1, v)
    else:
        with runner.scenario_pool() as pool:
            run = lambda sc: runner.run(pool, sc, mutant=args.mutant, timeout_s=timeout_s)  # noqa: E731
            for i, v in each(scenarios, lambda sc: sc.short(), run):
                show(i, v)
    seconds = time.monotonic() - started
    ordered = [verdicts[i] for i in sorted(verdicts)]
    _not_run(refused, getattr(args, "show_not_run", False))
    from testbed.harness.findings import gone_lines

    gone = gone_lines(scenarios)
    if getattr(args, "show_gone", False) or len(gone) < 2:
        for line in gone:
            print(line, flush=True)
    else:
        print(f"GONE     {len(gone)} findings whose code this release no longer has (--show-gone lists each): "
              f"{', '.join(line.split()[1].rstrip(':') for line in gone)}", flush=True)
    differ = _reuse_differential(scenarios, ordered, args, timeout_s) if getattr(args, "reuse_differential", False) \
        else None
    _reports(args, ordered, refused, seconds, differ)
    return _summary(ordered, len(refused), seconds, f" on Ray ({args.ray})" if args.ray else "") or int(bool(differ))


def _reuse_differential(scenarios, reused, args, timeout_s: float) -> list[str]:
    """``scenarios`` again, each making its own process groups: the lines of those whose
    verdict differs from their verdict with reuse (:mod:`testbed.harness.reuse`)."""
    from testbed.harness import reuse, runner

    if args.ray:
        raise UsageError("--reuse-differential runs on this machine's rank pool, not with --ray")
    with runner.scenario_pool(reuse_groups=False) as pool:
        fresh = [runner.run(pool, sc, mutant=args.mutant, timeout_s=timeout_s) for sc in scenarios]
    lines = reuse.differences(reused, fresh)
    for line in lines:
        print(f"REUSE DIFFERS  {line}", flush=True)
    print(f"reuse differential: {len(scenarios) - len(lines)} of {len(scenarios)} scenarios judged the same "
          "with process groups reused and made fresh", flush=True)
    return lines


def _not_run(refused, each: bool) -> None:
    """The scenarios not run, after the results: one line with a count per rule, or with
    ``each`` a line per scenario."""
    if each:
        for sc, rule in refused:
            print(f"NOT RUN  {sc.short()}  ({sc.label}): {rule}", flush=True)
    elif refused:
        from collections import Counter

        rules = Counter(rule for _, rule in refused)
        print(f"NOT RUN  {len(refused)} (--show-not-run lists each): "
              + "; ".join(f"{n} x {rule}" for rule, n in rules.most_common()), flush=True)


def _reports(args, verdicts, refused, seconds: float, differ: list[str] | None = None) -> None:
    """The files a run writes: ``--json`` (with ``reuse_differs``, the reuse differential's
    lines, where it ran), ``--html``, ``--junit-xml`` (one case per scenario, those not run
    skipped with their rule)."""
    from testbed.harness import junit, report

    if args.json:
        report.dump_json(args.json, report.as_json(verdicts, seconds, refused)
                         | ({"reuse_differs": differ} if differ is not None else {}))
    if args.html:
        report.write_html(args.html, verdicts, refused, seconds, shlex.join(["a2a-testbed", *sys.argv[1:]]))
    if args.junit_xml:
        cases = [junit.verdict_case(i, v, f"run.{v.scenario.integration}") for i, v in enumerate(verdicts, 1)]
        cases += [junit.not_run_case(len(verdicts) + i, sc, rule, f"run.{sc.integration}")
                  for i, (sc, rule) in enumerate(refused, 1)]
        junit.write(args.junit_xml, "run", cases, seconds)


def _summary(verdicts, not_run: int, seconds: float, how: str = "") -> int:
    """The last line of a run and its exit status."""
    from testbed.harness import report

    print(f"{report.counts(verdicts, not_run)} in {seconds:.1f} s{how}")
    return 0 if all(v.passed for v in verdicts) else 1


def _judge_launched(env, scenarios, args, refused) -> int:
    """The scenarios as one rank of a launched job (torchrun): those of the job's world size
    run here, rank 0 judges them and prints the lines :func:`_judge` prints."""
    from testbed.cluster.launched import join, leave
    from testbed.harness import report, runner

    mine = [sc for sc in scenarios if sc.layout.world_size == env.world_size]
    other = [(sc, f"{sc.layout.world_size} ranks, the launched job has {env.world_size}")
             for sc in scenarios if sc.layout.world_size != env.world_size]
    refused = list(refused) + other
    if not mine:
        raise UsageError(f"no scenario has WORLD_SIZE={env.world_size} ranks (give --layout)")
    join(env, args.timeout or runner.DEFAULT_TIMEOUT_S,
         runner.process_group_backend("fake" if all(sc.flashinfer_backend == "fake" for sc in mine) else "flashinfer"))
    started, verdicts = time.monotonic(), []
    try:
        for i, sc in enumerate(mine, 1):
            v = runner.run_launched(env, sc, index=i, mutant=args.mutant,
                                    timeout_s=args.timeout or runner.DEFAULT_TIMEOUT_S)
            if v is not None:
                print(report.verdict_line(i, len(mine), v), flush=True)
                if not v.passed:
                    print(report.failure_text(v), flush=True)
                verdicts.append(v)
    finally:
        leave()
    if env.rank != 0:
        return 0
    seconds = time.monotonic() - started
    _not_run(refused, getattr(args, "show_not_run", False))
    _reports(args, verdicts, refused, seconds)
    return _summary(verdicts, len(refused), seconds, " (ranks from the launcher)")
