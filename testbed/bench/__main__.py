"""Benchmarks: ``python -m testbed.bench NAME [options]``; each prints one final JSON line."""

from __future__ import annotations

import argparse
import json
import sys

from testbed.bench import a2a, cluster, combine, cost, race, scale, scenarios

BENCHES = {"cluster": cluster, "a2a": a2a, "scenarios": scenarios, "scale": scale, "combine": combine, "race": race, "cost": cost}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.bench")
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, module in BENCHES.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    print(json.dumps(BENCHES[args.bench].run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
