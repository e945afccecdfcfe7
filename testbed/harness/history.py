"""An engine's whole history: every release since its FlashInfer all-to-all appeared
(:attr:`~testbed.integrations.engine.Engine.history`), each run or refused.

Each release runs in processes of its own, as its user would run it: its layer matrix on the
FlashInfer its metadata pins (``a2a-testbed run --integration NAME --NAME-source RELEASE``),
then its mutants and (``findings``) its findings' survey, or the one line the adapter refuses
it with (exit 2 before any scenario). The row of a release: the profile serving its pin, the
matrix's passed / failed / known / testbed errors / not run, the mutants killed of those
applicable, or the refusal. With ``keep``, each command's JSON and output stay in a folder per
release, for a judge that holds them to more than the row (``a2a-testbed sweep``'s).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
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
    modules: list = field(default_factory=list)  # the engine modules its run loaded (the code judged)
    kills: dict = field(default_factory=dict)  # mutant: the label of the scenario that killed it
    same_as: str = ""  # the earlier release whose verdicts these are: every file its run loaded is identical here
    findings: dict = field(default_factory=dict)  # reproduce (the finding ids), surveyed (how many)
    kept: str = ""  # the folder holding each command's JSON and output (``<command>.json``, ``.txt``)

    def cells(self) -> list[str]:
        if self.refused:  # (the served releases an unserved pin's refusal lists are the profiles')
            return [self.release, self.served_by or f"{self.pin} (none)",
                    "refused: " + self.refused.split(": it serves ")[0], "", ""]
        m = self.matrix
        matrix = (f"{m['passed']} / {m['failed']} / {m['known']} / {m['testbed_errors']} / {m['not_run']}"
                  if m else "did not finish")
        mutants = (f"{self.mutants['killed']} of {self.mutants['total']} ({self.mutants['not_applicable']} N/A)"
                   if self.mutants else "not run")
        said = [f"verdicts of {self.same_as.split()[0]}: same all-to-all code {self.same_as.split(' ', 1)[1]}"] \
            if self.same_as else []
        return [self.release, self.served_by, matrix, mutants, "; ".join(said + self.failures[:3])]


HEADER = ("release", "FlashInfer pin (profile)", "matrix passed / failed / known / testbed errors / not run",
          "mutants killed of applicable", "failures")


def survey(integration, releases: list[str], mutants: bool = True, log=print, jobs: int = 1,
           differential: bool = False, findings: bool = False, keep: Optional[Path] = None) -> list[Row]:
    """Run or refuse each of ``releases`` of ``integration``'s engine, ``jobs`` at once (a
    release's ranks mostly wait on each other: two cores carry several); the rows in the
    order of ``releases``, each logged as it ends. A release whose code is identical to the
    nearest earlier release of the same pin (:func:`identical`), where that one has ended,
    takes its verdicts instead of running them again, and says so. With ``differential``, each
    matrix runs again on fresh process groups (``run --reuse-differential``). With ``findings``,
    each release's findings' survey runs too (``findings --here``); with ``keep``, what each
    command wrote stays in ``keep/<release>/`` (a reused release gets a copy of its twin's)."""
    from concurrent.futures import ThreadPoolExecutor

    rows: dict = {}

    def one(release: str) -> Row:
        started = time.monotonic()
        row = (_reused(integration, release, releases, pins, rows, keep)
               or survey_one(integration, release, mutants, _kill_hints(release, releases, rows), differential,
                             findings, keep))
        said = (f"same all-to-all code as {row.same_as}; verdicts of {row.same_as.split()[0]}" if row.same_as
                else f"refused: {row.refused}" if row.refused else " ".join(row.cells()[2:4]))
        log(f"{row.engine} {release}: {said}  ({time.monotonic() - started:.0f} s)")
        return row

    # The first release of each pin first, then the others: by the time a release starts, the
    # earlier release of its pin it may share its code with has usually ended (none waits).
    pins = [integration.engine.release(_source(integration.engine, r))[1] for r in releases]
    firsts = [r for i, r in enumerate(releases) if pins[i] not in pins[:i]]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for release in firsts + [r for r in releases if r not in firsts]:
            rows[release] = pool.submit(one, release)
        return [rows[release].result() for release in releases]


def _reused(integration, release: str, releases: list[str], pins: list, rows: dict,
            keep: Optional[Path] = None) -> Optional[Row]:
    """``release``'s row as a copy of the nearest earlier release's of the same pin, where that
    one has ended and every engine file its run loaded is identical here; None otherwise. What
    the twin's commands wrote is copied under ``keep``, its findings' cells named for ``release``."""
    engine = integration.engine
    at = releases.index(release)
    earlier = [r for r, pin in zip(releases[:at], pins) if pin == pins[at]]
    if not earlier:
        return None
    if earlier[-1] not in rows or not rows[earlier[-1]].done():
        return None
    twin = rows[earlier[-1]].result()
    if twin.refused or twin.same_as or not twin.modules:
        return None
    files = identical(engine, twin.release, release, twin.modules)
    if files is None:
        return None
    kept = ""
    if keep is not None and twin.kept:
        kept = str(keep / release)
        shutil.copytree(twin.kept, kept)
        cells = Path(kept) / "findings.json"
        if cells.is_file():
            label = f"{engine.label} {release}"
            cells.write_text(json.dumps([{**c, "engine": label} for c in json.loads(cells.read_text())]))
    return replace(twin, release=release, kept=kept,
                   same_as=f"{twin.release} ({files} files identical, the version file aside)")


def _kill_hints(release: str, releases: list[str], rows: dict) -> dict[str, str]:
    """``{mutant: scenario label}``: what killed each mutant in the releases that have ended,
    the nearest to ``release`` winning (a mutant is mostly killed by the same scenario release
    after release, and a hunt tries that one first)."""
    at = releases.index(release)
    hints: dict = {}
    for other in sorted(releases, key=lambda r: -abs(releases.index(r) - at)):
        if other != release and other in rows and rows[other].done():
            hints.update(rows[other].result().kills)
    return hints


def identical(engine, first: str, second: str, modules: list[str]) -> Optional[int]:
    """How many files of ``modules`` (engine modules a run of ``first`` loaded) are byte for
    byte the same in ``second``; None where one differs or is missing. The version file
    (``<engine>/_version.py``, ``version.py``), which holds nothing but the release's number,
    is left out."""
    from testbed.contract.source import SourceError

    try:
        a, b = engine.package(_source(engine, first)), engine.package(_source(engine, second))
    except SourceError:
        return None
    same = 0
    for module in modules:
        if module.rsplit(".", 1)[-1] in ("_version", "version"):
            continue
        base = module.replace(".", "/")
        for path in (base + ".py", base + "/__init__.py"):
            try:
                text = a.read(path)
            except (KeyError, FileNotFoundError, OSError):
                continue
            try:
                if b.read(path) != text:
                    return None
            except (KeyError, FileNotFoundError, OSError):
                return None
            same += 1
            break
    return same


def _source(engine, release: str) -> Optional[str]:
    return None if release == engine.release()[0] else release


def survey_one(integration, release: str, mutants: bool = True, hints: Optional[dict] = None,
               differential: bool = False, findings: bool = False, keep: Optional[Path] = None) -> Row:
    """One release: its matrix, then its mutants (and its findings' survey), in one process
    of its own (the release imported and its rank pool started once; a hunt takes the matrix's
    verdicts of the unmutated code instead of running them again, and tries first the scenario
    ``hints`` names for its mutant: ``a2a-testbed mutants --hints``); what each command wrote
    kept in ``keep/<release>/``."""
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
        names = ["matrix"] + (["mutants"] if mutants else []) + (["findings"] if findings else [])
        where = keep / release if keep is not None else Path(tmp)  # the commands write straight there
        where.mkdir(parents=True, exist_ok=True)
        outs = {name: where / f"{name}.json" for name in names}
        flags = ["--integration", integration.name] + ([f"--{integration.name}-source", source] if source else [])
        if hints:
            (Path(tmp) / "hints.json").write_text(json.dumps(
                {"mutants": [{"mutant": m, "killed": True, "scenario": label} for m, label in hints.items()]}))
        # The engine's own output beside the JSON, not left in the temporary folder.
        argv = {"matrix": ["run", *flags, "--log", str(where / "matrix.log")]
                + (["--reuse-differential"] if differential else []),
                "mutants": ["mutants", *flags, "--log", str(where / "mutants.log")]
                + (["--hints", str(Path(tmp) / "hints.json")] if hints else []),
                "findings": ["findings", "--here", *flags]}
        codes, stderr, texts = _group([argv[name] + ["--json", str(outs[name])] for name in names])
        done = subprocess.CompletedProcess(argv["matrix"], codes[0] if codes[0] is not None else 124, "", stderr)
        if codes[0] == 2 or not outs["matrix"].is_file():
            row.refused = refusal_line(done)
            return row
        if keep is not None:
            row.kept = str(where)
            for name, text in zip(names, texts):
                (where / f"{name}.txt").write_text(text)
        data = json.loads(outs["matrix"].read_text())
        row.matrix = {"passed": sum(s["passed"] and not s["known"] for s in data["scenarios"]),
                      "failed": data["failed"], "known": sum(bool(s["known"]) for s in data["scenarios"]),
                      "testbed_errors": data.get("testbed_errors", 0), "not_run": data.get("not_run", 0),
                      "seconds": data["seconds"]}
        row.failures = [("ERROR " if s.get("testbed_error") else "FAIL ") + s["label"]
                        for s in data["scenarios"] if not s["passed"]]
        row.failures += [f"REUSE DIFFERS {line}" for line in data.get("reuse_differs", [])]
        row.modules = data.get("engine_modules", [])
        if mutants:
            if outs["mutants"].is_file():
                hunts = json.loads(outs["mutants"].read_text())
                row.mutants = {"killed": hunts["killed"], "total": hunts["total"],
                               "not_applicable": len(hunts["not_applicable"]), "seconds": hunts["seconds"]}
                row.failures += [f"SURVIVED {h['mutant']}" for h in hunts["mutants"] if not h["killed"]]
                row.kills = {h["mutant"]: h["scenario"] for h in hunts["mutants"] if h["killed"] and h.get("scenario")}
            else:
                row.failures.append(f"mutants did not finish: {refusal_line(done)}")
        if findings:
            if outs["findings"].is_file():
                cells = json.loads(outs["findings"].read_text())
                row.findings = {"reproduce": sorted({c["finding"] for c in cells if c["outcome"] == "reproduces"}),
                                "surveyed": len({c["finding"] for c in cells})}
            else:
                row.failures.append(f"findings did not finish: {refusal_line(done)}")
    return row


def _group(commands: list[list[str]]) -> tuple[list[Optional[int]], str, list[str]]:
    """``a2a-testbed`` ``commands`` in one process (:func:`testbed.harness.sweeps.call_group`):
    each one's exit code (None: it did not end within the time left), the process's stderr,
    and what each that ended printed."""
    from testbed.harness import sweeps

    stdout, stderr, _ = sweeps.call_group(commands, RUN_TIMEOUT_S * len(commands))
    ended = sweeps.ended_commands(stdout)
    codes = [int(end.split()[0]) for _, end in ended]
    return codes + [None] * (len(commands) - len(codes)), stderr, [text for text, _ in ended]


def refusal_line(done: subprocess.CompletedProcess) -> str:
    """The one line an ``a2a-testbed`` command refused or failed with (what follows
    ``a2a-testbed run: error:``; of a group's commands, the first's), else its last line of stderr."""
    lines = [line for line in done.stderr.splitlines() if ": error: " in line] or done.stderr.strip().splitlines()[-1:]
    return lines[0].split(": error: ", 1)[-1] if lines else f"exit {done.returncode}"


def summary(rows: list[Row], seconds: float) -> str:
    """The run's last line: how many releases ran, took an identical release's verdicts, were
    refused, and had failures."""
    refused = sum(bool(r.refused) for r in rows)
    same = sum(bool(r.same_as) for r in rows)
    failed = sum(bool(r.failures) for r in rows)
    return (f"{len(rows)} releases: {len(rows) - refused - same} run, {same} with an identical earlier release's "
            f"verdicts, {refused} refused; {failed} with failures, in {seconds:.1f} s")


def markdown(rows: list[Row]) -> str:
    table = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    table += ["| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |" for row in rows]
    return "\n".join(table)


def as_json(rows: list[Row], command: str, seconds: float) -> dict:
    return {"date": time.strftime("%Y-%m-%d"), "command": command, "seconds": round(seconds, 1),
            "releases": [{k: v for k, v in asdict(r).items() if k not in ("modules", "kills")
                          and (v or k not in ("findings", "kept"))} for r in rows]}
