"""``a2a-testbed``: the command-line runner.

- ``run``: with no scenario flags, the integration matrix (:mod:`testbed.harness.matrix`);
  with scenario flags, that one scenario (``Scenario.to_cli()`` prints such a line); with
  ``--job selfcheck``, the cluster self-check over layouts (``--fault`` injects a cluster
  fault there and checks it was caught the expected way).
- ``fuzz``: Hypothesis over the scenario model; each failure printed as its ``run`` line.
- ``mutants``: the catalogue of mutants of ``impl``, each run until a scenario kills it.
- ``contract``: the fake's surface against a real FlashInfer release, read as source.
- ``engine``: an engine's own serving loop (vLLM's ``LLM``) judged at the engine level.
- ``findings``: where each known finding reproduces, over engine and FlashInfer releases.
- ``sweep``: the catalogues run whole (:mod:`testbed.harness.sweeps`); what CI fails on.
- ``version``.
"""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import json
import os
import shlex
import sys
import time

from testbed import __version__

CLUSTER_FAULTS = ("crash", "stall", "sigkill", "wrong-group-barrier")
# A hang must surface as a hang (the watchdog's report) before the fake's own flag wait
# gives up: mutant runs and faults use short timeouts.
MUTANT_TIMEOUT_S = 12.0
# The real FlashInfer's first scenario compiles its kernels (a cold JIT cache takes minutes).
REAL_TIMEOUT_S = 600.0


def _integrations():
    """The registry, imported when first needed: importing it imports the fake, which reads
    ``A2A_FAKE_FLASHINFER_PROFILE`` (:func:`main` reports a release it does not serve)."""
    from testbed import integrations

    return integrations


def _source_arguments(parser, repeatable: bool = False) -> None:
    for integration in _integrations().engines():
        engine = integration.engine
        parser.add_argument(f"--{engine.name}-source", metavar="DIR|RELEASE", action="append" if repeatable else None,
                            help=f"with --integration {engine.name}: import {engine.label}'s Python from this "
                                 f"checkout's {engine.source_hint} or an unpacked wheel on every rank "
                                 f"({engine.source_env}), or from release RELEASE's wheel (fetched and unpacked "
                                 "once, cached), so a branch or another release is tested as it stands; the "
                                 "FlashInfer it runs on is the one its metadata pins"
                                 + ("; repeatable, each release surveyed instead of the installed one" if repeatable
                                    else ""))


def _output_arguments(parser) -> None:
    parser.add_argument("--log", metavar="PATH", help="with an engine's integration: where the engine's and the "
                        "ranks' (or its tests') own output goes (default: a new file in the temporary folder, "
                        "printed first)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the engine's and the ranks' output live")


def _parser() -> argparse.ArgumentParser:
    from testbed.scenario.model import add_arguments

    parser = argparse.ArgumentParser(
        prog="a2a-testbed",
        description="Simulation-first testbed for FlashInfer NVLink MoE all-to-all on CPU ranks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("version", help="print the testbed, torch and Python versions")
    run = sub.add_parser(
        "run", help="run the integration matrix, one scenario, or the cluster self-check",
        description=(
            "With no scenario flags: the integration matrix (every path, format and profile, "
            "growth across layers, PP with different rebuild counts, TP 4, 0-token ranks), each "
            "scenario checked against every invariant. With scenario flags: that scenario. "
            "--job selfcheck: the cluster's collectives and groups over each --layout."),
    )
    _output_arguments(run)
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
    _source_arguments(run)
    _ray_arguments(run)
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
    fz = sub.add_parser("fuzz", help="Hypothesis over the scenario model; failures printed as run lines")
    fz.add_argument("--examples", type=int, default=50, metavar="N", help="scenarios to draw (default 50)")
    fz.add_argument("--seed", type=int, default=None, metavar="S",
                    help="random draw from this seed (default: derandomized, the same every time)")
    fz.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per-scenario timeout")
    fz.add_argument("--integration", choices=_integrations().names(), default="impl",
                    help="draw scenarios of impl (default) or of the installed vLLM's or SGLang's classes")
    fz.add_argument("--junit-xml", metavar="PATH",
                    help="write JUnit XML: a test case per example run (shrinking's included), failures with "
                         "their evidence and reproducing line")
    mu = sub.add_parser("mutants", help="run the catalogue of mutants of an integration; each must be killed")
    mu.add_argument("--integration", choices=_integrations().names(), default="impl",
                    help="whose code the mutants change: impl (default) or the installed vLLM's or SGLang's, hunted "
                         "by its matrix")
    mu.add_argument("--only", action="append", metavar="NAME", help="just this mutant (repeatable)")
    _output_arguments(mu)
    mu.add_argument("--touching", action="append", metavar="FILE",
                    help="just the mutants of this file of the integration's code, as a checkout or a pull request's "
                         "diff names it (repeatable; e.g. vllm/distributed/device_communicators/all2all.py)")
    mu.add_argument("--list", action="store_true", help="list the mutants and exit")
    mu.add_argument("--timeout", type=float, default=MUTANT_TIMEOUT_S, metavar="S", help="per-scenario timeout")
    _ray_arguments(mu)
    mu.add_argument("--json", metavar="PATH", help="write the table as JSON")
    mu.add_argument("--hints", metavar="PATH",
                    help="the --json of an earlier mutants run (another release's, say): each mutant is hunted "
                         "first by the scenario that killed it there; only the order changes, never the verdict")
    _source_arguments(mu)
    mu.add_argument("--junit-xml", metavar="PATH",
                    help="write JUnit XML: a test case per mutant, a survivor a failure with why")
    en = sub.add_parser(
        "engine", help="an engine's own LLM (vLLM's) on a tiny checkpoint, DP + EP on the fake, checked",
        description=(
            "Writes a tiny MoE checkpoint (config and random weights as safetensors), runs the engine's own "
            "LLM on the pool's ranks (DP, TP and expert parallel, the FlashInfer all-to-all on the fake), then "
            "the same checkpoint and prompts on one rank with expert parallel off; checks every invariant that "
            "judges the rounds it made, its prompt logprobs against that reference, and prints, per rank and "
            "forward, the token counts its prepare received. With no --dp: the integration's engine matrix."))
    en.add_argument("--integration", choices=_integrations().names(), default="vllm",
                    help="whose engine (default: %(default)s)")
    en.add_argument("--dp", type=int, metavar="N", help="data-parallel ranks (each its own engine)")
    en.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel ranks per DP rank (default 1)")
    en.add_argument("--path", default="one_sided", help="the all-to-all: one_sided (default) or two_sided")
    en.add_argument("--arch", default=None, help="the checkpoint: qwen3-moe (default) or deepseek-v2")
    en.add_argument("--model", metavar="NAME",
                    help="a checkpoint at a real model's MoE shape (hidden, experts, top_k, its shared expert and "
                         "scaling) on one layer, in its family's architecture, so the engine's own block of the "
                         "family runs it: qwen3-235b-a22b, qwen3-30b-a3b (qwen3-moe), deepseek-v3, deepseek-r1, "
                         "kimi-k2 (deepseek-v2's block)")
    en.add_argument("--prompts", metavar="LENGTHS", help="per DP rank (space-separated) its prompts' lengths "
                    "(comma-separated; - for none), e.g. '5,11 7'")
    en.add_argument("--max-tokens", metavar="N,N", help="per DP rank, the tokens each of its prompts generates")
    en.add_argument("--dtype", default="float32", help="the model's dtype: float32 (default) or bfloat16")
    en.add_argument("--budget", type=int, default=64, metavar="N", help="max_num_batched_tokens (default 64)")
    en.add_argument("--seed", type=int, default=0, metavar="S", help="the checkpoint's and the prompts' seed")
    en.add_argument("--profile", metavar="RELEASE",
                    help="the fake's FlashInfer release (default: the one the engine's metadata pins)")
    en.add_argument("--mutant", metavar="NAME", help="run against this mutant of the integration's code")
    en.add_argument("--timeout", type=float, default=None, metavar="S", help="per-run watchdog timeout (default 150)")
    en.add_argument("--json", metavar="PATH", help="write the verdicts as JSON")
    _output_arguments(en)
    _source_arguments(en)
    for name in _commands():
        _command(name).add_parser(sub, lambda p: (_output_arguments(p), _source_arguments(p)))
    ct = sub.add_parser(
        "contract", help="compare the fake with a real FlashInfer release (CPU only, no CUDA import)",
        description=(
            "Reads a real FlashInfer's Python with ast and its C++ sources for kMaxTopK, kMaxPayloads, "
            "kMaxRanks, the metainfo fields and the SWITCH_TOP_K cases, and compares every public name, "
            "signature, default, keyword-only marker, return form and constant with the fake profile "
            "of the same release. Prints the differences; exit 1 on any."))
    ct.add_argument("--flashinfer", action="append", default=[], metavar="VERSION|WHEEL|DIR",
                    help="a release number (pip download --no-deps, cached), a .whl, or an unpacked or "
                         "installed copy; repeatable (with --consumer: releases to check it against besides "
                         "its pin)")
    ct.add_argument("--consumer", action="append", default=[], metavar="NAME[=VERSION|WHEEL|DIR]",
                    help="check what an engine's FlashInfer all-to-all path uses (vllm, sglang; the installed "
                         "copy, else the release the testbed drives: vLLM 0.33.0, SGLang 0.5.23; or a release, a "
                         "wheel or a directory) against its pinned FlashInfer and the fake's profile of it; exit 1 "
                         "on a fake gap; repeatable")
    ct.add_argument("--every-release", action="store_true",
                    help="compare every release a profile serves (0.6.3 .. 0.7.4), each with the profile serving it")
    ct.add_argument("--profile", metavar="RELEASE",
                    help="the fake profile to compare with (default: the one serving the release)")
    ct.add_argument("--all", action="store_true", help="print every entry compared, not only differences")
    ct.add_argument("--write-annotations", action="store_true",
                    help="also write each release's parameter annotations into the fake's table "
                         "(fakes/flashinfer/annotations/<profile>.json), which the fake checks calls with")
    ct.add_argument("--write-excerpt", metavar="DIR",
                    help="also write the excerpt of each release read (DIR/<version>/flashinfer/...)")
    fi = sub.add_parser(
        "findings", help="where each known finding (docs/findings.md) reproduces: engine and FlashInfer releases",
        description=(
            "Runs each finding's reproducer (the first scenario of the integration's matrix it applies to) on "
            "every FlashInfer release with an all-to-all of its own and on the engine's pin, for each engine "
            "release given (the installed one by default; each in a process of its own), and prints where it "
            "reproduces, the first release it appears in, and on the engine releases' own pins the release it "
            "was born in and the first it is gone from. Exit 1 when a finding reproduces nowhere."))
    fi.add_argument("--integration", action="append", metavar="NAME",
                    help="an engine with findings (repeatable; default: every one installed)")
    fi.add_argument("--only", action="append", metavar="ID", help="just this finding (repeatable)")
    fi.add_argument("--timeout", type=float, default=60.0, metavar="S", help="per-scenario timeout")
    fi.add_argument("--json", metavar="PATH",
                    help="write every cell, and the releases refused, as JSON with the date and the command")
    fi.add_argument("--all-releases", action="store_true",
                    help="every release of each engine's history (a2a-testbed history's), each surveyed or refused "
                         "in one line")
    fi.add_argument("--here", action="store_true",
                    help="survey one engine release in this process, with --json (what the sweeps run)")
    _source_arguments(fi, repeatable=True)
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
    sw.add_argument("--served", choices=("with", "without", "only"), default="with",
                    help="the sweeps of an engine served as users serve it (a2a-testbed serve): with the others "
                         "(default), without them, or only them (they start a dozen engine processes each: CI runs "
                         "them after the others, alone)")
    sw.add_argument("--shard", metavar="I/N", help="groups I, I+N, ... of the catalogue (split it over N machines)")
    sw.add_argument("--jobs", type=int, default=1, metavar="N", help="groups of sweeps run at once (default 1)")
    sw.add_argument("--logs", metavar="DIR", help="where each sweep's output goes (default: a new temporary folder)")
    sw.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds per sweep (default 900)")
    sw.add_argument("--json", metavar="PATH", help="write the outcomes as JSON")
    sw.add_argument("--junit-xml", metavar="PATH", help="write JUnit XML: one test case per sweep")
    return parser


def _ray_arguments(parser) -> None:
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="fan the campaign out over a Ray cluster, each scenario on one machine's rank pool: "
                             "local (the default) starts one on this machine; an address joins a running one "
                             "(auto, HEAD:6379, ray://HEAD:10001); needs the ray extra")
    parser.add_argument("--ray-hosts", type=int, metavar="N",
                        help="with --ray: rank pools to spread over the cluster (default: one per node)")


def main(argv: list[str] | None = None) -> int:
    try:
        import fakes.flashinfer  # noqa: F401 - reads A2A_FAKE_FLASHINFER_PROFILE
    except ValueError as e:  # a release no profile serves
        print(f"a2a-testbed: error: {e}", file=sys.stderr)
        return 2
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "version":
        import torch

        print(f"a2a-testbed {__version__} (torch {torch.__version__}, Python {sys.version.split()[0]})")
        return 0
    if args.command in _commands():
        try:
            return _command(args.command).main(args, UsageError)
        except UsageError as e:
            print(f"a2a-testbed {args.command}: error: {e}", file=sys.stderr)
            return 2
    if args.command in ("run", "fuzz", "mutants", "contract", "engine", "findings", "sweep", "history"):
        try:
            return {"run": _run, "fuzz": _fuzz, "mutants": _mutants, "contract": _contract, "engine": _engine,
                    "findings": _findings, "sweep": _sweep,
                    "history": _history}[args.command](args)
        except UsageError as e:
            print(f"a2a-testbed {args.command}: error: {e}", file=sys.stderr)
            return 2
    parser.print_help()
    return 2


def _commands() -> tuple[str, ...]:
    from testbed.commands import COMMANDS

    return COMMANDS


def _command(name: str):
    import importlib

    return importlib.import_module(f"testbed.commands.{name.replace('-', '_')}")


class UsageError(ValueError):
    """Bad flags: one line naming the flag and the rule, exit 2."""


def _each(items, describe, run):
    """``(index, run(item))`` for each item, with ``[i/n] describe(item)`` on a terminal while
    it runs (cleared before the caller prints)."""
    from testbed.harness import report

    progress = report.Progress()
    for i, item in enumerate(items, 1):
        progress.show(f"[{i}/{len(items)}] {describe(item)}")
        result = run(item)
        progress.clear()
        yield i, result


def _positive(flag: str, value) -> None:
    if value is not None and not value > 0:
        raise UsageError(f"{flag}: must be > 0, got {value}")


def _contract(args) -> int:
    from pathlib import Path

    from testbed.contract import SourceError, compare, format_report, open_source
    from testbed.contract.tree import RealTree
    from testbed.contract.excerpt import write_excerpt

    if args.every_release:
        from fakes.flashinfer.profiles import served_releases

        if args.consumer or args.profile:
            raise UsageError("--every-release compares each release with the profile serving it: give no --consumer "
                             "or --profile with it")
        args.flashinfer = list(args.flashinfer) + list(served_releases())
    if not args.flashinfer and not args.consumer:
        raise UsageError("give --flashinfer RELEASE (the fake against a release), --every-release or --consumer NAME "
                         "(what an engine uses)")
    if args.consumer:
        if args.write_annotations:
            raise UsageError("--write-annotations goes with --flashinfer alone (it writes each release's table)")
        return _contract_consumers(args)
    if args.profile is not None:
        _served("--profile", args.profile)
    for spec in args.flashinfer:  # a release number is refused before any download
        if args.profile is None and not _is_path(spec):
            _served("--flashinfer", spec)
    failed = 0
    for spec in args.flashinfer:
        try:
            source = open_source(spec)
            tree = RealTree(source)
        except SourceError as e:
            print(f"--flashinfer {spec}: {e}", flush=True)
            failed += 1
            continue
        report = compare(source, args.profile or _served(f"--flashinfer {spec}", source.version), tree)
        if args.write_annotations:
            from testbed.contract.annotations import release_annotations, write_table
            from fakes.flashinfer.annotations import table

            print(f"wrote {write_table(report.profile, release_annotations(report.entries, tree))}", flush=True)
            table.cache_clear()
            report = compare(source, args.profile, RealTree(source))
        print(format_report(report, everything=args.all), flush=True)
        if args.write_excerpt:
            write_excerpt(tree, Path(args.write_excerpt) / source.version)
        failed += bool(report.differences)
    return 1 if failed else 0


def _contract_consumers(args) -> int:
    """Each consumer against its pinned release and every --flashinfer; each release read once
    (its tree is also compared with the fake, so an excerpt holds what both read)."""
    from pathlib import Path

    from fakes.flashinfer.profiles import serving, unserved_pin
    from testbed.contract import SourceError, compare, open_source, profile_for
    from testbed.contract.compare import served
    from testbed.contract.tree import RealTree
    from testbed.contract.consumer import check, format_consumer_report, parse_consumer, pinned_flashinfer, \
        write_consumer_excerpt
    from testbed.contract.excerpt import write_excerpt
    from testbed.contract.source import open_package

    failed, trees = 0, {}  # version -> the release's tree, read once
    try:
        for spec in args.flashinfer:
            source = open_source(spec)
            trees.setdefault(source.version, RealTree(source))
    except SourceError as e:
        raise UsageError(f"--flashinfer: {e}") from None
    given = list(trees)
    for spec in args.consumer:
        try:
            consumer, where = parse_consumer(spec, {i.name: i.consumer() for i in _integrations().engines()})
            try:
                source = open_package(consumer.dist, where)
            except SourceError:
                if where is not None or consumer.release is None:
                    raise
                source = open_package(consumer.dist, consumer.release)  # not installed: the driven release
        except (SourceError, ValueError) as e:
            raise UsageError(f"--consumer: {e}") from None
        pin = pinned_flashinfer(source)
        if pin and args.profile is None and serving(pin) is None:
            raise UsageError(f"--consumer {spec}: {unserved_pin(f'{consumer.name} {source.version}', pin)}")
        releases = list(dict.fromkeys(([pin] if pin else []) + given))
        if not releases:
            raise UsageError(f"--consumer {spec}: its metadata pins no flashinfer-python; give --flashinfer")
        for release in releases:
            try:
                if release not in trees:  # the pin, given by number: downloaded once, cached
                    trees[release] = RealTree(open_source(release))
                tree = trees[release]
                report = check(source, consumer, tree, args.profile or profile_for(tree.source.version))
            except (SourceError, ValueError) as e:
                print(f"--consumer {spec} against flashinfer {release}: {e}", flush=True)
                failed += 1
                continue
            print(format_consumer_report(report, everything=args.all), flush=True)
            failed += bool(report.fake_defects)
        if args.write_excerpt:
            write_consumer_excerpt(source, consumer, Path(args.write_excerpt) / f"{consumer.name}-{source.version}")
    for tree in trees.values():
        try:
            report = compare(tree.source, args.profile or profile_for(tree.source.version), tree)
        except ValueError as e:
            print(f"flashinfer {tree.source.version}: {e}", flush=True)
            failed += 1
            continue
        own = serving(tree.source.version) == report.profile
        note = "" if own else f"; profile {report.profile} does not serve it, so not counted"
        print(f"flashinfer {report.version} against fake profile {served(report)}: {report.compared} entries "
              f"compared, {len(report.differences)} differ (a2a-testbed contract --flashinfer {report.version}"
              f"{note})", flush=True)
        failed += own and bool(report.differences)
        if args.write_excerpt and own:
            write_excerpt(tree, Path(args.write_excerpt) / tree.source.version)
    return 1 if failed else 0


def _is_path(spec: str) -> bool:
    return "/" in spec or spec.endswith(".whl")


def _served(flag: str, release: str) -> str:
    """The profile serving FlashInfer ``release``; one no profile serves is a usage error of
    ``flag`` naming what is served."""
    from fakes.flashinfer.profiles import UnservedRelease, resolve

    try:
        return resolve(release).name
    except UnservedRelease as e:
        raise UsageError(f"{flag}: {e}") from None


def _history(args) -> int:
    from pathlib import Path

    from testbed.harness import history, report

    if args.integration not in _integrations().names() or _integrations().get(args.integration).engine is None:
        raise UsageError(f"--integration {args.integration}: not an engine (engines: "
                         + ", ".join(i.name for i in _integrations().engines()) + ")")
    engine = _integrations().get(args.integration).engine
    releases = args.release or list(engine.history)
    _positive("--jobs", args.jobs)
    started = time.monotonic()
    if args.findings and not _integrations().get(args.integration).findings():
        raise UsageError(f"--findings: {args.integration} has no findings to survey")
    rows = history.survey(_integrations().get(args.integration), releases, mutants=not args.no_mutants,
                          log=lambda line: print(line, flush=True), jobs=args.jobs,
                          differential=args.reuse_differential, findings=args.findings,
                          keep=Path(args.keep).resolve() if args.keep else None)
    print(history.markdown(rows))
    if args.json:
        report.dump_json(args.json, history.as_json(rows, shlex.join(["a2a-testbed", *sys.argv[1:]]),
                                                    time.monotonic() - started))
    print(history.summary(rows, time.monotonic() - started))
    return 1 if any(row.failures for row in rows) else 0


def _findings(args) -> int:
    """Survey each engine release in a process of its own (``--here``: this one), then merge."""
    import subprocess
    import tempfile
    from pathlib import Path

    from testbed.harness import history, lineage, report, runner

    _positive("--timeout", args.timeout)
    names = args.integration or [i.name for i in _integrations().engines() if i.findings()]
    for name in names:
        if name not in _integrations().names() or not _integrations().get(name).findings():
            raise UsageError(f"--integration {name}: no findings to survey (those with: "
                             + ", ".join(i.name for i in _integrations().engines() if i.findings()) + ")")
    if args.here:
        (name,) = names
        source = (getattr(args, f"{name}_source") or [None])[0]
        _need_engine(name, source)
        if not args.json or len(getattr(args, f"{name}_source") or ()) > 1:
            raise UsageError(f"--here surveys one release: give --json and at most one --{name}-source")
        with runner.scenario_pool() as pool:
            cells = lineage.survey(pool, name, args.only or (), args.timeout)
        Path(args.json).write_text(json.dumps([dataclasses.asdict(c) for c in cells]))
        print(lineage.format_table(cells, {f.id: f.title for f in _integrations().get(name).findings()}))
        found = {c.finding for c in cells if c.outcome == "reproduces"}
        print(f"{len(found)} of {len({c.finding for c in cells})} findings reproduce on "
              f"{cells[0].engine if cells else name} (over {len({c.flashinfer for c in cells})} FlashInfer releases)",
              flush=True)
        return 0
    if args.all_releases and any(getattr(args, f"{name}_source") for name in names):
        raise UsageError("--all-releases surveys every release of the engine's history: give no --*-source with it")
    cells, failed, refused, started = [], 0, {}, time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            engine = _integrations().get(name).engine
            installed = engine.release()[0] if args.all_releases else None
            sources = ([None if release == installed else release for release in engine.history] if args.all_releases
                       else getattr(args, f"{name}_source") or [None])
            for n, source in enumerate(sources):
                out = Path(tmp) / f"{name}-{n}.json"
                cmd = [sys.executable, "-m", "testbed", "findings", "--here", "--integration", name, "--json", str(out),
                       "--timeout", str(args.timeout)] + [a for i in args.only or () for a in ("--only", i)]
                cmd += [f"--{name}-source", source] if source else []
                print(f"surveying {name} {'(installed)' if not source else source} ...", file=sys.stderr, flush=True)
                proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      env={**os.environ, "PYTHONWARNINGS": "ignore"})
                if proc.returncode != 0:
                    print(f"{name} {source or '(installed)'}: {history.refusal_line(proc)}", flush=True)
                    if args.all_releases and proc.returncode == 2:  # refused before any scenario, in one line
                        refused[f"{engine.label} {source or installed}"] = history.refusal_line(proc)
                    else:
                        failed += 1
                    continue
                cells += [lineage.Cell(**c) for c in json.loads(out.read_text())]
    titles = {f.id: f.title for name in names for f in _integrations().get(name).findings()}
    print(lineage.format_table(cells, titles), flush=True)
    print(lineage.markdown(cells), flush=True)
    if args.json:
        report.dump_json(args.json, {"date": time.strftime("%Y-%m-%d"),
                                     "command": shlex.join(["a2a-testbed", *sys.argv[1:]]),
                                     "seconds": round(time.monotonic() - started, 1), "refused": refused,
                                     "cells": [dataclasses.asdict(c) for c in cells]})
    nowhere = [f for f in dict.fromkeys(c.finding for c in cells) if lineage.first(cells, f) is None]
    return 2 if failed else 1 if nowhere else 0


def _run(args) -> int:
    from testbed.scenario.model import scenario_given

    _positive("--timeout", args.timeout)
    if args.job == "selfcheck":
        if scenario_given(args) or args.mutant or args.json or args.html:
            raise UsageError("--job selfcheck takes only --layout, --fault and --timeout")
        return _selfcheck(args)
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
    for other in _integrations().engines():
        if getattr(args, f"{other.name}_source") and args.integration != other.name:
            raise UsageError(f"--{other.name}-source goes with --integration {other.name}")
    engine = _integrations().get(args.integration).engine
    if engine is None:
        return _run_integration(args, engine)
    with _engine_in_use(args, args.integration, getattr(args, f"{args.integration}_source"), args.profile):
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


@contextlib.contextmanager
def _engine_in_use(args, name: str, source: str | None, profile: str | None = None):
    """For a command driving engine ``name`` (its release or checkout ``source``): make the rank
    pools run it (:func:`_need_engine`), its output (its imports' warnings, its loggers, its
    ranks', what its extensions print at exit) going from the start to a log file (``--log``;
    ``-v``: live instead), whose path is printed once the engine is taken; a refusal is the
    only line. Inside, ``sys.stdout`` is the terminal, for the testbed's own lines (the
    engine's loggers, made on its import, keep the stream that writes to the log); yields it."""
    if args.verbose:
        checkout = _need_engine(name, source, profile)
        if checkout:
            print(checkout, flush=True)
        yield sys.stdout
        return
    import tempfile

    from testbed import console

    label = _integrations().get(name).engine.label
    log = args.log or tempfile.mkstemp(prefix=f"a2atb-{name}-", suffix=".log")[1]
    with console.engine_output_to(log) as terminal:
        checkout = _need_engine(name, source, profile)
        print(f"{label}'s and the ranks' own output: {log} (-v shows it live)", file=terminal, flush=True)
        if checkout:
            print(checkout, file=terminal, flush=True)
        with contextlib.redirect_stdout(terminal):
            yield terminal


def _need_engine(name: str, source: str | None = None, profile: str | None = None) -> str | None:
    """Make the rank pools run engine ``name``, or a usage error saying why they cannot;
    ``profile``: the FlashInfer a checkout that pins none runs on. Returns, for a checkout,
    the line naming it and the pin it runs on (for the caller to print), else None."""
    if profile is not None:
        from testbed.integrations.engine import CHECKOUT_PIN_ENV

        os.environ[CHECKOUT_PIN_ENV] = profile
    engine = _integrations().get(name).engine
    why = engine.use(source)
    if why:
        raise UsageError(why)
    package = engine.package()
    if not package.checkout:
        return None
    from testbed.contract.consumer import pinned_flashinfer

    own = pinned_flashinfer(package)  # named by what it says of itself, and the pin it runs on
    return (f"{engine.label} {package.version} ({package.origin}): FlashInfer {own or profile}, the release "
            f"{'its requirement files pin' if own else '--profile names'}")


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
        engine = _integrations().get(args.integration).engine if args.integration else None
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
        with _campaign(args) as hosts:
            for i, v in hosts.run(scenarios, mutant=args.mutant, timeout_s=timeout_s):
                show(i + 1, v)
    else:
        with runner.scenario_pool() as pool:
            run = lambda sc: runner.run(pool, sc, mutant=args.mutant, timeout_s=timeout_s)  # noqa: E731
            for i, v in _each(scenarios, lambda sc: sc.short(), run):
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


@contextlib.contextmanager
def _campaign(args):
    """The Ray hosts of ``--ray`` / ``--ray-hosts``, announced in one line."""
    from testbed.harness import campaign

    if args.ray_hosts is not None:
        _positive("--ray-hosts", args.ray_hosts)
    try:
        with campaign.cluster(args.ray, args.ray_hosts) as hosts:
            print(f"ray: {hosts.hosts} hosts on {len(set(hosts.nodes()))} node(s) of {args.ray}", flush=True)
            yield hosts
    except campaign.RayUnavailable as e:
        raise UsageError(str(e)) from None


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


def _fuzz(args) -> int:
    from testbed.harness import report, runner
    from testbed.harness.fuzz import ScenarioFailed, fuzz

    _positive("--examples", args.examples)
    if _integrations().get(args.integration).engine is not None:
        _need_engine(args.integration)
    _positive("--timeout", args.timeout)
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
                 strategy=_integrations().get(args.integration).strategy())
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


def _engine(args) -> int:
    from testbed.harness import engine, report, runner
    from testbed.harness.mutants import catalogue
    from testbed.scenario.engine import EngineScenario, parse_prompts
    from testbed.scenario.model import ScenarioInputError, check_release

    integration = _integrations().get(args.integration)
    if not integration.has_engine_level():
        raise UsageError(f"--integration {args.integration}: has no engine level (engines with one: "
                         + ", ".join(n for n in _integrations().names() if _integrations().get(n).has_engine_level())
                         + ")")
    _positive("--timeout", args.timeout)
    if args.mutant and args.mutant not in {m.name for m in catalogue(args.integration)}:
        raise UsageError(f"--mutant: unknown {args.integration} mutant {args.mutant!r} (a2a-testbed mutants "
                         f"--integration {args.integration} --list)")
    # The flags are judged before the engine is asked for: a malformed flag is refused in its
    # own words whether or not the engine is installed.
    if args.profile is not None:
        try:
            check_release("--profile", args.profile)
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
    if args.dp is None:
        given = [flag for flag in ("prompts", "max_tokens", "model") if getattr(args, flag) is not None]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with --dp (one engine scenario)")
        scenarios = list(integration.engine_matrix())
    else:
        if args.prompts is None or args.max_tokens is None:
            raise UsageError("--dp: give --prompts and --max-tokens too (per DP rank)")
        try:
            if args.model and args.arch:
                raise UsageError("--arch goes without --model (the model's family decides the checkpoint)")
            from testbed.scenario.models import MODELS

            shape = MODELS.get(args.model or "")
            arch = args.arch or (shape.checkpoint_arch if shape and shape.checkpoint_arch else "qwen3-moe")
            scenarios = (EngineScenario(dp=args.dp, tp=args.tp, path=args.path, arch=arch, model=args.model or "",
                                        prompts=parse_prompts(args.prompts),
                                        max_tokens=tuple(int(n) for n in args.max_tokens.split(",")),
                                        integration=args.integration, budget=args.budget, dtype=args.dtype,
                                        seed=args.seed),)
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
        except ValueError:
            raise UsageError(f"--max-tokens: comma-separated integers, one per DP rank, got {args.max_tokens!r}") \
                from None
    with contextlib.ExitStack() as stack:
        # From the engine's first import on (its probes here, then the ranks), its output goes
        # to the log; a refusal still reaches the terminal (sys.stderr stays there).
        terminal = stack.enter_context(_engine_in_use(args, args.integration,
                                                      getattr(args, f"{args.integration}_source", None)))
        try:  # the engine's own pin unless the flag says
            scenarios = [dataclasses.replace(es, profile=args.profile or integration.engine.pinned())
                         for es in scenarios]
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
        started = time.monotonic()
        verdicts = []
        pool = stack.enter_context(runner.scenario_pool())
        run = lambda es: engine.run(pool, es, mutant=args.mutant,  # noqa: E731
                                    timeout_s=args.timeout or engine.DEFAULT_TIMEOUT_S)
        for i, v in _each(scenarios, lambda es: es.describe(), run):
            print(engine.verdict_line(i, len(scenarios), v), file=terminal, flush=True)
            print(engine.steps_text(v), file=terminal, flush=True)
            if not v.passed or v.known:
                print(engine.failure_text(v), file=terminal, flush=True)
            verdicts.append(v)
    failed = sum(not v.passed for v in verdicts)
    print(f"{len(verdicts) - failed}/{len(verdicts)} engine scenarios passed"
          f"{f' against mutant {args.mutant}' if args.mutant else ''} in {time.monotonic() - started:.1f} s")
    if args.json:
        report.dump_json(args.json, {"passed": len(verdicts) - failed, "failed": failed,
                                     "seconds": round(time.monotonic() - started, 3),
                                     "verdicts": [engine.as_json(v) for v in verdicts]})
    return 1 if failed else 0


def _mutants(args) -> int:
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
    _positive("--timeout", args.timeout)
    for other in _integrations().engines():
        if getattr(args, f"{other.name}_source") and args.integration != other.name:
            raise UsageError(f"--{other.name}-source goes with --integration {other.name}")
    engine = _integrations().get(args.integration).engine
    if engine is None:
        return _hunt(args, catalogue, names, engine)
    with _engine_in_use(args, args.integration, getattr(args, f"{args.integration}_source")):
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
        with _campaign(args) as hosts:
            for _, h in hosts.hunt(names, scenarios, timeout_s=args.timeout, hints=hints):
                show(h)
    else:
        with runner.scenario_pool() as pool:
            for _, h in _each(names, str, lambda name: runner.hunt(pool, name, scenarios, timeout_s=args.timeout,
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


def _sweep(args) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from testbed.harness import report, sweeps

    _positive("--jobs", args.jobs)
    _positive("--timeout", args.timeout)
    catalogue = [s for s in sweeps.catalogue() if args.served == "with" or (s.argv[0] == "serve") == (args.served == "only")]
    if args.list:
        for sweep in catalogue:
            print(f"{sweep.name:32s} {sweep.command}" + (f"   [with {sweep.group}]" if sweep.group else ""))
        for why in sweeps.missing():
            print(f"left out: {why}")
        return 0
    for name in args.only or ():
        if name not in {s.name for s in catalogue}:
            raise UsageError(f"--only: no sweep {name!r} here (a2a-testbed sweep --list names them)")
    chosen = sweeps.groups([s for s in catalogue if not args.only or s.name in args.only])
    if args.shard:
        try:
            chosen = sweeps.shard(chosen, args.shard)
        except ValueError as e:
            raise UsageError(str(e)) from None
    log_dir = args.logs or sweeps.default_log_dir()
    os.makedirs(log_dir, exist_ok=True)
    for why in sweeps.missing():
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


def _selfcheck(args) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
