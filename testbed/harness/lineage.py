"""Where each known finding appears, from runs: its reproducer (its own ``run`` line, or the
first scenario of the integration's matrix it applies to) moved to every FlashInfer release with an all-to-all of
its own, and to the engine's pin, and run on the engine release in this process. Engine
releases are compared by surveying each in its own process (an engine is imported once per
process) and merging: ``a2a-testbed findings`` does both.

A cell's outcome: ``reproduces`` (the finding's signature shows, or the scenario is ``KNOWN``
under it), ``passes``, ``fails otherwise`` (another failure: the engine cannot run there for
another reason), ``not run`` (the scenario model refuses the reproducer on that release, with
the rule; or, off the engine's pin, the engine release lacks the finding's code, so it cannot
reproduce on any FlashInfer release: only the pin's cell runs, which says where it is gone from).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

from fakes.flashinfer.profiles import distinct_alltoalls, release_key, resolve
from testbed import integrations
from testbed.harness import findings, runner
from testbed.harness.invariants import Verdict
from testbed.integrations.base import Finding
from testbed.scenario.model import Scenario, ScenarioInputError, from_cli

MARKS = {"reproduces": "R", "passes": ".", "fails otherwise": "F", "not run": "-"}
ABSENT = "the release lacks the finding's code"  # a cell not run off the pin: it cannot reproduce there


@dataclass(frozen=True)
class Cell:
    finding: str
    engine: str  # "vLLM 0.32.0": the engine release surveyed
    flashinfer: str  # the FlashInfer release, as pip prints it
    outcome: str  # reproduces | passes | fails otherwise | not run (the keys of MARKS)
    detail: str = ""  # the rule (not run) or the first other failure (fails otherwise)
    pinned: bool = False  # the FlashInfer the engine release's metadata pins


def releases(pin: str) -> list[str]:
    """``pin`` and every other release with an all-to-all of its own, oldest first."""
    mine = resolve(pin).name
    return sorted([pin] + [r for r in distinct_alltoalls() if r != mine], key=release_key)


def reproducer(name: str, finding: Finding, pin: str) -> Optional[Scenario]:
    """The finding's own reproducer, else the first scenario of ``name``'s matrix, on the pin
    and then on each other release, that ``finding`` applies to; :class:`ScenarioInputError`
    where the engine release refuses the finding's own reproducer."""
    from testbed.harness.matrix import on_integration

    if finding.reproducer:
        return from_cli(finding.reproducer)
    for release in [pin] + [r for r in releases(pin) if r != pin]:
        for sc in on_integration(name, release)[0]:
            if finding.applies(sc):
                return sc
    return None


def outcome(finding: Finding, v: Verdict, gone: Optional[str] = None) -> tuple[str, str]:
    """How ``v`` went for ``finding``; ``gone``: why the engine release no longer has it (its
    signature showing there is another failure that reads alike, never the finding)."""
    if not gone and (finding.id in v.known or finding.shows(v.failures)):
        return "reproduces", ""
    others = [g for g in v.failures if g.invariant != "known-finding"]
    if not others:
        return "passes", ""
    return "fails otherwise", f"{others[0].invariant}: {others[0].evidence.splitlines()[0][:160]}"


def survey(pool, name: str, only: Iterable[str] = (), timeout_s: float = 60.0) -> list[Cell]:
    """Every finding of engine ``name`` (``only``: these ids) on every release, on the engine
    release this process runs."""
    integration = integrations.get(name)
    version, _ = integration.engine.release()
    label, pin = f"{integration.engine.label} {version}", integration.engine.pinned()
    cells: list = []  # a Cell, or a _Pending one to run
    for finding in integration.findings():
        if only and finding.id not in only:
            continue
        try:
            base, why = reproducer(name, finding, pin), "no scenario of the matrix it applies to"
        except ScenarioInputError as e:
            base, why = None, str(e)
        absent = findings.gone(integration, finding)
        for release in releases(pin):
            if base is None:
                cells.append(Cell(finding.id, label, release, "not run", why, pinned=release == pin))
                continue
            if absent and release != pin:
                # It cannot reproduce where its code is not (:func:`outcome`); the pin's cell
                # runs, for where it is gone from.
                cells.append(Cell(finding.id, label, release, "not run", f"{ABSENT}: {absent}"))
                continue
            sc = dataclasses.replace(base, profile=release, label=f"{finding.id} reproducer on {release}")
            try:
                sc.validate()
            except ScenarioInputError as e:
                cells.append(Cell(finding.id, label, release, "not run", str(e), pinned=release == pin))
                continue
            cells.append(_Pending(finding, release, sc, absent))
    # Release by release: the ranks change the fake's release between scenarios as rarely as
    # can be. Findings without a reproducer of their own share the matrix's scenarios: each
    # runs once (runner.unmutated).
    order = releases(pin)
    pending = sorted((c for c in cells if isinstance(c, _Pending)), key=lambda c: order.index(c.release))
    verdicts = {c.scenario: runner.unmutated(pool, c.scenario, timeout_s) for c in pending}
    return [Cell(c.finding.id, label, c.release, *outcome(c.finding, verdicts[c.scenario], c.absent),
                 pinned=c.release == pin) if isinstance(c, _Pending) else c for c in cells]


class _Pending(NamedTuple):
    """A cell still to run: ``finding``'s reproducer moved to FlashInfer ``release``."""

    finding: Finding
    release: str
    scenario: Scenario
    absent: Optional[str]  # why the engine release no longer has the finding (findings.gone)


def first(cells: list[Cell], finding: str) -> Optional[Cell]:
    """The earliest (engine release, then FlashInfer release) cell where ``finding`` reproduces."""
    hits = [c for c in cells if c.finding == finding and c.outcome == "reproduces"]
    return min(hits, key=lambda c: (_engine_key(c.engine), release_key(c.flashinfer)), default=None)


def _engine_key(engine: str):
    """The sort key of an engine release as a cell names it ("vLLM 0.32.0")."""
    return release_key(engine.rsplit(" ", 1)[-1])


def _newest(cells: list[Cell], finding: str) -> str:
    return max((c.engine for c in cells if c.finding == finding), key=_engine_key)


def lifespan(cells: list[Cell], finding: str) -> tuple[Optional[Cell], Optional[Cell]]:
    """Where ``finding`` was born and where it died as users run the engine, on each engine
    release's own pin: the first engine release it reproduces on, and the first after that
    where it passes (the code gone, or the pin fixing it); None for either where there is none."""
    on_pin = sorted((c for c in cells if c.finding == finding and c.pinned), key=lambda c: _engine_key(c.engine))
    born = next((c for c in on_pin if c.outcome == "reproduces"), None)
    gone = None if born is None else next(
        (c for c in on_pin if _engine_key(c.engine) > _engine_key(born.engine) and c.outcome == "passes"), None)
    return born, gone


def lifespan_text(cells: list[Cell], finding: str) -> str:
    born, gone = lifespan(cells, finding)
    if born is None:
        return "on the engine's own pin: reproduces on none of these"
    return (f"on the engine's own pin: born {born.engine} (FlashInfer {born.flashinfer}), "
            + (f"gone from {gone.engine} (FlashInfer {gone.flashinfer})" if gone else
               f"still in {_newest(cells, finding)}"))


def markdown(cells: list[Cell]) -> str:
    """A row per finding: where it first reproduces on any FlashInfer (as the sweeps read
    ``docs/findings.md``'s lineage table), and its lifespan on the engine releases' own pins."""
    table = ["| id | first reproduces (any FlashInfer) | born (on its own pin) | gone from (on its own pin) |",
             "|---|---|---|---|"]
    for finding in dict.fromkeys(c.finding for c in cells):
        hit, (born, gone) = first(cells, finding), lifespan(cells, finding)
        table.append(f"| {finding} | " + (f"{hit.engine} on FlashInfer {hit.flashinfer}" if hit else "none") + " | "
                     + (f"{born.engine} ({born.flashinfer})" if born else "none") + " | "
                     + (f"{gone.engine} ({gone.flashinfer})" if gone else
                        f"not gone by {_newest(cells, finding)}" if born else "")
                     + " |")
    return "\n".join(table)


def format_table(cells: list[Cell], titles: dict[str, str]) -> str:
    """Per finding: where it first appears, then a line per engine release with a mark per
    FlashInfer release (R reproduces, . passes, F fails otherwise, - not run), then the
    other failures."""
    lines = ["R reproduces   . passes   F fails otherwise   - not run (the scenario model's rule, or the release "
             "lacks the finding's code)   * the pin"]
    for finding in dict.fromkeys(c.finding for c in cells):
        mine = [c for c in cells if c.finding == finding]
        hit = first(cells, finding)
        born = f"first: {hit.engine} on FlashInfer {hit.flashinfer}" if hit else "reproduces on none of these"
        lines.append(f"{finding}  {titles.get(finding, '')[:100]}\n  {born}\n  {lifespan_text(cells, finding)}")
        for engine in sorted(dict.fromkeys(c.engine for c in mine), key=_engine_key):
            row = sorted((c for c in mine if c.engine == engine), key=lambda c: release_key(c.flashinfer))
            lines.append(f"  {engine:<16} " + "  ".join(f"{c.flashinfer}{'*' if c.pinned else ''} {MARKS[c.outcome]}"
                                                         for c in row))
            lines += [f"      F on {c.flashinfer}: {c.detail}" for c in row if c.outcome == "fails otherwise"]
    return "\n".join(lines)
