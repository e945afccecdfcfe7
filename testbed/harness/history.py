"""An engine's whole history: every release since its FlashInfer all-to-all appeared
(:attr:`~testbed.integrations.engine.Engine.history`), each run or refused.

Each release runs in processes of its own, as its user would run it: its layer matrix on the
FlashInfer its metadata pins (``a2a-testbed run --integration NAME --NAME-source RELEASE``),
then its mutants, or the one line the adapter refuses it with (exit 2 before any scenario).
The row of a release: the profile serving its pin, the matrix's passed / failed / known /
testbed errors / not run, the mutants killed of those applicable, or the refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

RUN_TIMEOUT_S = 1800.0  # one release's matrix or mutants; a hang is its own row, not the survey's end


@dataclass
class Row:
    """One engine release: run (``matrix`` and ``mutants`` as their JSON counts) or refused."""

    engine: str  # "vLLM"
    release: str
    pin: Optional[str] = None  # the FlashInfer its metadata pins
    served_by: str = ""  # as a report names it: "0.6.16.post3 (served by 0.6.16)", or "" where none serves
    refused: str = ""  # the adapter's one line, where it does not drive the release
    matrix: dict = field(default_factory=dict)  # passed, failed, known, testbed_errors, not_run, seconds
    mutants: dict = field(default_factory=dict)  # killed, total, not_applicable, seconds
    failures: list = field(default_factory=list)  # the labels of FAIL / ERROR scenarios and surviving mutants

    def cells(self) -> list[str]:
        if self.refused:  # (the served releases an unserved pin's refusal lists are the profiles')
            return [self.release, self.served_by or f"{self.pin} (none)",
                    "refused: " + self.refused.split(": it serves ")[0], "", ""]
        m = self.matrix
        matrix = (f"{m['passed']} / {m['failed']} / {m['known']} / {m['testbed_errors']} / {m['not_run']}"
                  if m else "did not finish")
        mutants = (f"{self.mutants['killed']} of {self.mutants['total']} ({self.mutants['not_applicable']} N/A)"
                   if self.mutants else "not run")
        return [self.release, self.served_by, matrix, mutants, "; ".join(self.failures[:3])]


HEADER = ("release", "FlashInfer pin (profile)", "matrix passed / failed / known / testbed errors / not run",
          "mutants killed of applicable", "failures")


def survey(integration, releases: list[str], mutants: bool = True, log=print) -> list[Row]:
    """Run or refuse each of ``releases`` of ``integration``'s engine, one after another."""
    rows = []
    for release in releases:
        started = time.monotonic()
        row = survey_one(integration, release, mutants)
        rows.append(row)
        log(f"{row.engine} {release}: " + (f"refused: {row.refused}" if row.refused else
                                            " ".join(row.cells()[2:4])) + f"  ({time.monotonic() - started:.0f} s)")
    return rows


def survey_one(integration, release: str, mutants: bool = True) -> Row:
    from fakes.flashinfer.profiles import UnservedRelease, served_by

    engine = integration.engine
    installed, _ = engine.release()
    source = None if release == installed else release
    _, pin = engine.release(source or None)
    row = Row(engine.label, release, pin)
    try:
        row.served_by = served_by(engine.pinned(source))  # a wheelless pin: by evidence, as the run serves it
    except (UnservedRelease, ValueError):
        row.served_by = ""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        base = [sys.executable, "-m", "testbed"]
        flags = ["--integration", integration.name] + ([f"--{integration.name}-source", source] if source else [])
        done = _call(base + ["run", *flags, "--json", str(out)])
        if done.returncode == 2 or not out.is_file():
            row.refused = refusal_line(done)
            return row
        data = json.loads(out.read_text())
        row.matrix = {"passed": sum(s["passed"] and not s["known"] for s in data["scenarios"]),
                      "failed": data["failed"], "known": sum(bool(s["known"]) for s in data["scenarios"]),
                      "testbed_errors": data.get("testbed_errors", 0), "not_run": data.get("not_run", 0),
                      "seconds": data["seconds"]}
        row.failures = [("ERROR " if s.get("testbed_error") else "FAIL ") + s["label"]
                        for s in data["scenarios"] if not s["passed"]]
        if mutants:
            out.unlink()
            done = _call(base + ["mutants", *flags, "--json", str(out)])
            if out.is_file():
                hunts = json.loads(out.read_text())
                row.mutants = {"killed": hunts["killed"], "total": hunts["total"],
                               "not_applicable": len(hunts["not_applicable"]), "seconds": hunts["seconds"]}
                row.failures += [f"SURVIVED {h['mutant']}" for h in hunts["mutants"] if not h["killed"]]
            else:
                row.failures.append(f"mutants did not finish: {refusal_line(done)}")
    return row


def _call(cmd: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, "", f"error: did not finish in {e.timeout:.0f} s")


def refusal_line(done: subprocess.CompletedProcess) -> str:
    """The one line an ``a2a-testbed`` command refused or failed with (what follows
    ``a2a-testbed run: error:``), else its last line of stderr."""
    lines = [line for line in done.stderr.splitlines() if ": error: " in line] or done.stderr.strip().splitlines()[-1:]
    return lines[-1].split(": error: ", 1)[-1] if lines else f"exit {done.returncode}"


def markdown(rows: list[Row]) -> str:
    table = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    table += ["| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |" for row in rows]
    return "\n".join(table)


def as_json(rows: list[Row], command: str, seconds: float) -> dict:
    return {"date": time.strftime("%Y-%m-%d"), "command": command, "seconds": round(seconds, 1),
            "releases": [asdict(r) for r in rows]}
