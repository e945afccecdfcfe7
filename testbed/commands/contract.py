"""``a2a-testbed contract``: the fake's surface against a real FlashInfer release, or what an
engine's all-to-all path uses against its pin, read as source."""

from __future__ import annotations

from testbed.commands.common import UsageError, integrations, served

NAME = "contract"


def add_parser(sub) -> None:
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


def main(args) -> int:
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
        served("--profile", args.profile)
    for spec in args.flashinfer:  # a release number is refused before any download
        if args.profile is None and not _is_path(spec):
            served("--flashinfer", spec)
    failed = 0
    for spec in args.flashinfer:
        try:
            source = open_source(spec)
            tree = RealTree(source)
        except SourceError as e:
            print(f"--flashinfer {spec}: {e}", flush=True)
            failed += 1
            continue
        report = compare(source, args.profile or served(f"--flashinfer {spec}", source.version), tree)
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
            consumer, where = parse_consumer(spec, {i.name: i.consumer() for i in integrations().engines()})
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
