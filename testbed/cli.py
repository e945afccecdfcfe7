"""``a2a-testbed``: the command-line runner. Each command is a module of
:mod:`testbed.commands` (its flags and its ``main``), named in its ``COMMANDS``:

- ``run``: with no scenario flags, the integration matrix (:mod:`testbed.harness.matrix`);
  with scenario flags, that one scenario (``Scenario.to_cli()`` prints such a line); with
  ``--job selfcheck``, the cluster self-check over layouts (``--fault`` injects a cluster
  fault there and checks it was caught the expected way).
- ``fuzz``: Hypothesis over the scenario model; each failure printed as its ``run`` line.
- ``mutants``: an integration's catalogue of mutants, each run until a scenario kills it.
- ``engine``: an engine's own serving loop (vLLM's ``LLM``) judged at the engine level.
- ``engine-tests``: the engine's own GPU tests of the path, on stand-in accelerators.
- ``serve``: the engine's own server, DP + EP on the fake, answering a real client.
- ``contract``: the fake's surface against a real FlashInfer release, read as source.
- ``findings``: where each known finding reproduces, over engine and FlashInfer releases.
- ``history``: every release of an engine, each run or refused.
- ``sweep``: the catalogues run whole (:mod:`testbed.harness.sweeps`); what CI fails on.
- ``version``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading

from testbed.commands import COMMANDS
from testbed.commands.common import UsageError


def _command(name: str):
    return importlib.import_module(f"testbed.commands.{name.replace('-', '_')}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2a-testbed",
        description="Simulation-first testbed for FlashInfer NVLink MoE all-to-all on CPU ranks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        _command(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        import fakes.flashinfer  # noqa: F401 - reads A2A_FAKE_FLASHINFER_PROFILE
    except ValueError as e:  # a release no profile serves
        print(f"a2a-testbed: error: {e}", file=sys.stderr)
        return 2
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        with _terminated_as_interrupted():
            return _command(args.command).main(args)
    except UsageError as e:
        print(f"a2a-testbed {args.command}: error: {e}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _terminated_as_interrupted():
    """SIGTERM (a CI job cancelled, an orchestrator's stop) ends the command as Ctrl-C does,
    its clean-up run (servers and their sessions stopped, the pools' ranks killed, their
    shared memory unlinked), with exit status 143; Python's default would end it at once and
    leave them. What SIGKILL leaves, the next start sweeps (the arena's owner is gone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up short
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
