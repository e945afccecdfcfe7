"""What the ``a2a-testbed`` commands share: the usage error, the engine flags every engine
command takes, the engine taken into use for the rank pools, the Ray campaign, progress."""

from __future__ import annotations

import contextlib
import os
import sys

# A hang must surface as a hang (the watchdog's report) before the fake's own flag wait
# gives up: mutant runs and faults use short timeouts.
MUTANT_TIMEOUT_S = 12.0
# The real FlashInfer's first scenario compiles its kernels (a cold JIT cache takes minutes).
REAL_TIMEOUT_S = 600.0


def integrations():
    """The registry, imported when first needed: importing it imports the fake, which reads
    ``A2A_FAKE_FLASHINFER_PROFILE`` (:func:`testbed.cli.main` reports a release it does not serve)."""
    from testbed import integrations

    return integrations


def source_arguments(parser, repeatable: bool = False) -> None:
    for integration in integrations().engines():
        engine = integration.engine
        parser.add_argument(f"--{engine.name}-source", metavar="DIR|RELEASE", action="append" if repeatable else None,
                            help=f"with --integration {engine.name}: import {engine.label}'s Python from this "
                                 f"checkout's {engine.source_hint} or an unpacked wheel on every rank "
                                 f"({engine.source_env}), or from release RELEASE's wheel (fetched and unpacked "
                                 "once, cached), so a branch or another release is tested as it stands; the "
                                 "FlashInfer it runs on is the one its metadata pins"
                                 + ("; repeatable, each release surveyed instead of the installed one" if repeatable
                                    else ""))


def output_arguments(parser) -> None:
    parser.add_argument("--log", metavar="PATH", help="with an engine's integration: where the engine's and the "
                        "ranks' (or its tests') own output goes (default: a new file in the temporary folder, "
                        "printed first)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the engine's and the ranks' output live")


def ray_arguments(parser) -> None:
    parser.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                        help="fan the campaign out over a Ray cluster, each scenario on one machine's rank pool: "
                             "local (the default) starts one on this machine; an address joins a running one "
                             "(auto, HEAD:6379, ray://HEAD:10001); needs the ray extra")
    parser.add_argument("--ray-hosts", type=int, metavar="N",
                        help="with --ray: rank pools to spread over the cluster (default: one per node)")


class UsageError(ValueError):
    """Bad flags: one line naming the flag and the rule, exit 2."""


def each(items, describe, run):
    """``(index, run(item))`` for each item, with ``[i/n] describe(item)`` on a terminal while
    it runs (cleared before the caller prints)."""
    from testbed.harness import report

    progress = report.Progress()
    for i, item in enumerate(items, 1):
        progress.show(f"[{i}/{len(items)}] {describe(item)}")
        result = run(item)
        progress.clear()
        yield i, result


def positive(flag: str, value) -> None:
    if value is not None and not value > 0:
        raise UsageError(f"{flag}: must be > 0, got {value}")


@contextlib.contextmanager
def engine_in_use(args, name: str, source: str | None, profile: str | None = None):
    """For a command driving engine ``name`` (its release or checkout ``source``): make the rank
    pools run it (:func:`need_engine`), its output (its imports' warnings, its loggers, its
    ranks', what its extensions print at exit) going from the start to a log file (``--log``;
    ``-v``: live instead), whose path is printed once the engine is taken; a refusal is the
    only line. Inside, ``sys.stdout`` is the terminal, for the testbed's own lines (the
    engine's loggers, made on its import, keep the stream that writes to the log); yields it."""
    if args.verbose:
        checkout = need_engine(name, source, profile)
        if checkout:
            print(checkout, flush=True)
        yield sys.stdout
        return
    import tempfile

    from testbed import console

    label = integrations().get(name).engine.label
    log = args.log or tempfile.mkstemp(prefix=f"a2atb-{name}-", suffix=".log")[1]
    with console.engine_output_to(log) as terminal:
        checkout = need_engine(name, source, profile)
        print(f"{label}'s and the ranks' own output: {log} (-v shows it live)", file=terminal, flush=True)
        if checkout:
            print(checkout, file=terminal, flush=True)
        with contextlib.redirect_stdout(terminal):
            yield terminal


def need_engine(name: str, source: str | None = None, profile: str | None = None) -> str | None:
    """Make the rank pools run engine ``name``, or a usage error saying why they cannot;
    ``profile``: the FlashInfer a checkout that pins none runs on. Returns, for a checkout,
    the line naming it and the pin it runs on (for the caller to print), else None."""
    if profile is not None:
        from testbed.integrations.engine import CHECKOUT_PIN_ENV

        os.environ[CHECKOUT_PIN_ENV] = profile
    engine = integrations().get(name).engine
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


@contextlib.contextmanager
def campaign(args):
    """The Ray hosts of ``--ray`` / ``--ray-hosts``, announced in one line."""
    from testbed.harness import campaign

    if args.ray_hosts is not None:
        positive("--ray-hosts", args.ray_hosts)
    try:
        with campaign.cluster(args.ray, args.ray_hosts) as hosts:
            print(f"ray: {hosts.hosts} hosts on {len(set(hosts.nodes()))} node(s) of {args.ray}", flush=True)
            yield hosts
    except campaign.RayUnavailable as e:
        raise UsageError(str(e)) from None


def served(flag: str, release: str) -> str:
    """The profile serving FlashInfer ``release``; one no profile serves is a usage error of
    ``flag`` naming what is served."""
    from fakes.flashinfer.profiles import UnservedRelease, resolve

    try:
        return resolve(release).name
    except UnservedRelease as e:
        raise UsageError(f"{flag}: {e}") from None

