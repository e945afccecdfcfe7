"""What a run of scenarios prints and writes: one line per verdict, a JSON summary, and one
self-contained HTML page (counts, failures first, a table with each scenario's details and
charts folded under it)."""

from __future__ import annotations

import html
import json
import sys
from typing import Sequence, TextIO

from fakes.flashinfer.profiles import served_by
from testbed.harness.invariants import Verdict


def verdict_line(index: int, total: int, v: Verdict) -> str:
    """``PASS  3/14  <scenario>  worst 0.24x tol  builds s0 2 (69760 B) s1 1 (...)  2.1 s``."""
    builds = " ".join(f"s{s} {len(b)} ({b[-1][1]} B)" for s, b in enumerate(v.builds) if b) or "-"
    known = f"  {', '.join(v.known)} (docs/findings.md)" if v.known else ""
    return (f"{v.status} {index:>3}/{total:<3} {v.scenario.short()}  worst {v.worst:.2g}x tol  "
            f"builds {builds}  {v.seconds:.1f} s{known}")


def known_text(v: Verdict) -> str:
    """The known findings' failures, a line each, then the line that reproduces the scenario."""
    lines = [f"    [{f.invariant}, known] " + f.evidence.splitlines()[0][:300] for f in v.known_failures]
    lines.append(f"    reproduce: {v.scenario.to_cli()}")
    return "\n".join(lines)


def failure_text(v: Verdict) -> str:
    """The failed invariants with their evidence (or the testbed's error: not the integration's
    failure), then the line that reproduces the scenario."""
    lines = [f"    [testbed error, not a failure of {v.scenario.integration}] "
             + v.testbed_error.replace("\n", "\n      ")] if v.testbed_error else []
    for f in v.failures:
        lines.append(f"    [{f.invariant}] " + f.evidence.replace("\n", "\n      "))
    lines.append(f"    reproduce: {v.scenario.to_cli()}")
    return "\n".join(lines)


class Progress:
    """``[i/n] label`` on a terminal's stderr, overwritten in place; silent elsewhere."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr  # this one, not the one at import (a test's capture replaces it)
        self.live = self.stream.isatty()

    def show(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\033[K" + text[:120])
            self.stream.flush()

    def clear(self) -> None:
        self.show("")


def counts(verdicts: Sequence[Verdict], not_run: int = 0) -> str:
    """``8 passed, 7 failed, 10 known, 2 testbed errors, 31 not run``: the statuses present
    (passed and failed always)."""
    by = {s: sum(v.status == s for v in verdicts) for s in ("PASS", "FAIL", "KNOWN", "ERROR")}
    return (f"{by['PASS']} passed, {by['FAIL']} failed" + (f", {by['KNOWN']} known" if by["KNOWN"] else "")
            + (f", {by['ERROR']} testbed error{'s' * (by['ERROR'] != 1)}" if by["ERROR"] else "")
            + (f", {not_run} not run" if not_run else ""))


def as_json(verdicts: Sequence[Verdict], seconds: float, refused: Sequence[tuple] = ()) -> dict:
    from testbed.harness.runner import IMPORTED

    return {
        "engine_modules": sorted(IMPORTED),  # what the ranks loaded of the engine: the code judged
        "not_run": len(refused),
        "passed": sum(v.passed for v in verdicts),
        "failed": sum(v.status == "FAIL" for v in verdicts),
        "testbed_errors": sum(v.status == "ERROR" for v in verdicts),
        "seconds": round(seconds, 3),
        "scenarios": [{
            "cli": v.scenario.to_cli(), "label": v.scenario.label, "passed": v.passed,
            "worst_x_tolerance": _finite(v.worst), "seconds": round(v.seconds, 3),
            "builds": [[{"max_num_tokens": t, "workspace_bytes": b} for t, b in stage] for stage in v.builds],
            "layer_errors": {k: _finite(x) for k, x in v.layer_errors},
            "failures": [{"invariant": f.invariant, "evidence": f.evidence} for f in v.failures],
            "known": v.known, "testbed_error": v.testbed_error,
            "known_failures": [{"invariant": f.invariant, "evidence": f.evidence} for f in v.known_failures],
        } for v in verdicts],
    }


def _finite(x: float):
    """JSON has no infinity or NaN: those become the string ``"inf"`` / ``"nan"``."""
    return x if x == x and abs(x) != float("inf") else str(x)


OPEN_FAILURES = 3  # unfolded at the top of the page; the rest one line each


def write_html(path: str, verdicts: Sequence[Verdict], refused: Sequence[tuple] = (), seconds: float = 0.0,
               command: str = "", title: str = "a2a-testbed run") -> None:
    """One self-contained page (no network), made to be read in a browser window:

    - a header with the verdict counts, the seconds, the FlashInfer profiles and
      integrations, and the command line;
    - the failures first, each with its evidence and its reproducing line (wrapped, with a
      copy button), the first three unfolded and the rest a line each;
    - one table that fits the window, a row per scenario (and per scenario not run, with the
      rule), its details folded under it: evidence, the reproducing line, and two bar charts
      with their units (error per layer in multiples of the tolerance, workspace KiB per build).
    """
    summary = counts(verdicts, len(refused)) + (f" in {seconds:.1f} s" if seconds else "")
    scenarios = [v.scenario for v in verdicts] + [sc for sc, _ in refused]
    facts = (f"<p>FlashInfer profiles: {html.escape(', '.join(sorted({served_by(sc.profile) for sc in scenarios})))}; "
             f"integrations: {html.escape(', '.join(sorted({sc.integration for sc in scenarios})))}</p>"
             + (f"<p>command: {_copyable(command)}</p>" if command else ""))
    first = "".join(f"<article class='failure'><details{' open' if n < OPEN_FAILURES else ''}><summary><b>{i}. "
                    f"{html.escape(v.scenario.label or v.scenario.short())}</b>: "
                    f"{html.escape(', '.join(dict.fromkeys(f.invariant for f in v.failures)) or 'testbed error')}</summary>"
                    f"{_evidence(v.failures)}{_testbed_error(v)}{_copyable(v.scenario.to_cli())}</details></article>"
                    for n, (i, v) in enumerate((i, v) for i, v in enumerate(verdicts, 1) if not v.passed))
    rows = [_row(i, v) for i, v in enumerate(verdicts, 1)]
    rows += [f"<tr class='notrun'><td>{len(verdicts) + i}</td><td>NOT RUN</td><td>{html.escape(sc.short())}<br>"
             f"<small>{html.escape(sc.label)}</small><details><summary>rule</summary><p>{html.escape(rule)}</p>"
             f"{_copyable(sc.to_cli())}</details></td><td></td><td></td></tr>"
             for i, (sc, rule) in enumerate(refused, 1)]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width"><style>
body{{font-family:sans-serif;margin:1em;max-width:100%}} h1{{font-size:1.4em;margin:0 0 .3em}}
table{{border-collapse:collapse;width:100%;table-layout:fixed}} td,th{{border:1px solid #ccc;padding:3px 5px;
vertical-align:top;font-size:12px;overflow-wrap:anywhere;text-align:left}} th{{background:#eee}}
tr.fail{{background:#fdd}} tr.pass{{background:#efe}} tr.known{{background:#ffd}} tr.notrun{{background:#f4f4f4}} tr.error{{background:#fdb}}
col.n{{width:3em}} col.v{{width:5.5em}} col.w{{width:6em}} col.s{{width:4em}}
pre{{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3em 0;font-size:11px;background:#f8f8f8;padding:3px}}
article.failure{{border-left:4px solid #c33;padding:0 .6em;margin:.6em 0}} summary{{cursor:pointer;color:#036}}
button{{font-size:11px}} svg{{max-width:100%;margin:4px 12px 4px 0}}</style></head><body>
<header><h1>{html.escape(title)}: {summary}</h1>{facts}</header>
{f"<section><h2>Failures</h2>{first}</section>" if first else ""}
<section><h2>Scenarios</h2><table><colgroup><col class="n"><col class="v"><col><col class="w"><col class="s"></colgroup>
<tr><th>#</th><th>verdict</th><th>scenario (details folded)</th><th>worst (x tol)</th><th>s</th></tr>
{''.join(rows)}</table></section>
<script>function copy(b){{const t=b.parentNode.querySelector('pre').textContent;
navigator.clipboard.writeText(t).then(()=>{{b.textContent='copied'}},()=>{{const r=document.createRange();
r.selectNodeContents(b.parentNode.querySelector('pre'));getSelection().removeAllRanges();getSelection().addRange(r)}})}}
</script></body></html>"""
    with open(path, "w") as f:
        f.write(page)


def _row(i: int, v: Verdict) -> str:
    status = v.status
    builds = [(f"s{s} b{b}", size / 1024) for s, stage in enumerate(v.builds) for b, (_, size) in enumerate(stage, 1)]
    found = _evidence(v.failures or v.known_failures)
    known = f"<p>known: {html.escape(', '.join(v.known))} (docs/findings.md)</p>" if v.known else ""
    details = (f"<details><summary>details</summary>{known}{found}{_testbed_error(v)}{_copyable(v.scenario.to_cli())}"
               + _bars("error per layer", "x tolerance (1 = the limit)", v.layer_errors, limit=1.0)
               + _bars("workspace per build", "KiB per rank", builds) + "</details>")
    return (f"<tr class='{status.lower()}'><td>{i}</td><td>{status}</td><td>{html.escape(v.scenario.short())}<br>"
            f"<small>{html.escape(v.scenario.label)}</small>{details}</td><td>{v.worst:.3g}</td>"
            f"<td>{v.seconds:.1f}</td></tr>")


def _testbed_error(v: Verdict) -> str:
    return (f"<p><b>testbed error</b> (not a failure of {html.escape(v.scenario.integration)})</p>"
            f"<pre>{html.escape(v.testbed_error)}</pre>") if v.testbed_error else ""


def _evidence(failures) -> str:
    return "".join(f"<p><b>{html.escape(f.invariant)}</b></p><pre>{html.escape(f.evidence)}</pre>" for f in failures)


def _copyable(text: str) -> str:
    return f"<div><button onclick='copy(this)'>copy</button><pre>{html.escape(text)}</pre></div>"


def _bars(title: str, unit: str, items: Sequence[tuple[str, float]], limit: float | None = None) -> str:
    if not items:
        return ""
    width, bar, gap, height = 420, 14, 4, 0
    finite = [value for _, value in items if value == value and value != float("inf")]
    top = max(finite + [limit or 0.0]) or 1.0
    parts = []
    for k, (name, value) in enumerate(items):
        y = 18 + k * (bar + gap)
        w = (width - 150) if value != value or value == float("inf") else min(value / top, 1.0) * (width - 150)
        color = "#c33" if limit is not None and value > limit else "#58a"
        parts.append(f"<text x='0' y='{y + 11}' font-size='11'>{html.escape(name)}</text>"
                     f"<rect x='70' y='{y}' width='{w:.1f}' height='{bar}' fill='{color}'/>"
                     f"<text x='{74 + w:.1f}' y='{y + 11}' font-size='10'>{value:.3g}</text>")
        height = y + bar + 4
    if limit is not None:
        x = 70 + limit / top * (width - 150)
        parts.append(f"<line x1='{x:.1f}' y1='14' x2='{x:.1f}' y2='{height}' stroke='#000' stroke-dasharray='3'/>")
    axis = height + 14
    parts.append(f"<line x1='70' y1='{height}' x2='{width - 80}' y2='{height}' stroke='#888'/>"
                 f"<text x='70' y='{axis}' font-size='10'>0</text>"
                 f"<text x='{width - 80}' y='{axis}' font-size='10' text-anchor='end'>{top:.3g} {html.escape(unit)}</text>")
    return (f"<svg width='{width}' height='{axis + 4}' viewBox='0 0 {width} {axis + 4}' "
            f"xmlns='http://www.w3.org/2000/svg'><text x='0' y='11' font-size='12'>{html.escape(title)} "
            f"({html.escape(unit)})</text>{''.join(parts)}</svg>")


def hunt_header() -> str:
    """The first line of a mutant hunt's table."""
    return f"{'mutant':32s} {'verdict':9s} {'killed by (invariant @ scenario)':34s} seconds"


def hunt_line(h) -> str:
    """A hunt's row (a :class:`testbed.harness.runner.Hunt`)."""
    return f"{h.mutant:32s} {'KILLED' if h.killed else 'SURVIVED':9s} {h.by:34s} {h.seconds:6.1f}"


def not_applicable_line(name: str, kind: str, why: str) -> str:
    return f"{name:32s} {'N/A':9s} {kind}: {why}"


def hunts_summary(hunts, absent: dict, seconds: float) -> str:
    """The hunt's last line; ``absent``: mutant -> (kind, why) of those not hunted."""
    return (f"killed {sum(h.killed for h in hunts)} of {len(hunts)} in {seconds:.1f} s"
            + (f" ({len(absent)} not applicable to this release)" if absent else ""))


def hunts_json(hunts, absent: dict, seconds: float) -> dict:
    """What a hunt's ``--json`` holds, read by the sweeps' judge and by ``--hints``."""
    return {"killed": sum(h.killed for h in hunts), "total": len(hunts), "seconds": round(seconds, 3),
            "mutants": [h.__dict__ for h in hunts],
            "not_applicable": [{"mutant": n, "kind": k, "why": w} for n, (k, w) in absent.items()]}


def dump_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
