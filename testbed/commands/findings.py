"""``a2a-testbed findings``: where each known finding reproduces, over engine and FlashInfer
releases."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time

from testbed.commands.common import UsageError, integrations, need_engine, positive, source_arguments

NAME = "findings"


def add_parser(sub) -> None:
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
    source_arguments(fi, repeatable=True)


def main(args) -> int:
    """Survey each engine release in a process of its own (``--here``: this one), then merge."""
    import subprocess
    import tempfile
    from pathlib import Path

    from testbed.harness import history, lineage, report, runner

    positive("--timeout", args.timeout)
    names = args.integration or [i.name for i in integrations().engines() if i.findings()]
    for name in names:
        if name not in integrations().names() or not integrations().get(name).findings():
            raise UsageError(f"--integration {name}: no findings to survey (those with: "
                             + ", ".join(i.name for i in integrations().engines() if i.findings()) + ")")
    if args.here:
        (name,) = names
        source = (getattr(args, f"{name}_source") or [None])[0]
        need_engine(name, source)
        if not args.json or len(getattr(args, f"{name}_source") or ()) > 1:
            raise UsageError(f"--here surveys one release: give --json and at most one --{name}-source")
        with runner.scenario_pool() as pool:
            cells = lineage.survey(pool, name, args.only or (), args.timeout)
        Path(args.json).write_text(json.dumps([dataclasses.asdict(c) for c in cells]))
        print(lineage.format_table(cells, {f.id: f.title for f in integrations().get(name).findings()}))
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
            engine = integrations().get(name).engine
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
    titles = {f.id: f.title for name in names for f in integrations().get(name).findings()}
    print(lineage.format_table(cells, titles), flush=True)
    print(lineage.markdown(cells), flush=True)
    if args.json:
        report.dump_json(args.json, {"date": time.strftime("%Y-%m-%d"),
                                     "command": shlex.join(["a2a-testbed", *sys.argv[1:]]),
                                     "seconds": round(time.monotonic() - started, 1), "refused": refused,
                                     "cells": [dataclasses.asdict(c) for c in cells]})
    nowhere = [f for f in dict.fromkeys(c.finding for c in cells) if lineage.first(cells, f) is None]
    return 2 if failed else 1 if nowhere else 0
