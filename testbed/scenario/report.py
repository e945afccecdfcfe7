"""What a run of scenarios prints and writes: one line per verdict, a JSON summary, and one
self-contained HTML page (a table, error per layer, workspace size per build)."""

from __future__ import annotations

import html
import json
import sys
from typing import Sequence, TextIO

from testbed.scenario.invariants import Verdict


def verdict_line(index: int, total: int, v: Verdict) -> str:
    """``PASS  3/14  <scenario>  worst 0.24x tol  builds s0 2 (69760 B) s1 1 (...)  2.1 s``."""
    builds = " ".join(f"s{s} {len(b)} ({b[-1][1]} B)" for s, b in enumerate(v.builds) if b) or "-"
    status = "FAIL" if not v.passed else "KNOWN" if v.known else "PASS"
    known = f"  {', '.join(v.known)} (docs/findings.md)" if v.known else ""
    return (f"{status} {index:>3}/{total:<3} {v.scenario.short()}  worst {v.worst:.2g}x tol  "
            f"builds {builds}  {v.seconds:.1f} s{known}")


def known_text(v: Verdict) -> str:
    """The known findings' failures, a line each, then the line that reproduces the scenario."""
    lines = [f"    [{f.invariant}, known] " + f.evidence.splitlines()[0][:300] for f in v.known_failures]
    lines.append(f"    reproduce: {v.scenario.to_cli()}")
    return "\n".join(lines)


def failure_text(v: Verdict) -> str:
    """The failed invariants with their evidence, then the line that reproduces the scenario."""
    lines = []
    for f in v.failures:
        lines.append(f"    [{f.invariant}] " + f.evidence.replace("\n", "\n      "))
    lines.append(f"    reproduce: {v.scenario.to_cli()}")
    return "\n".join(lines)


class Progress:
    """``[i/n] label`` on a terminal's stderr, overwritten in place; silent elsewhere."""

    def __init__(self, stream: TextIO = sys.stderr):
        self.stream = stream
        self.live = stream.isatty()

    def show(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\033[K" + text[:120])
            self.stream.flush()

    def clear(self) -> None:
        self.show("")


def as_json(verdicts: Sequence[Verdict], seconds: float) -> dict:
    return {
        "passed": sum(v.passed for v in verdicts),
        "failed": sum(not v.passed for v in verdicts),
        "seconds": round(seconds, 3),
        "scenarios": [{
            "cli": v.scenario.to_cli(), "label": v.scenario.label, "passed": v.passed,
            "worst_x_tolerance": _finite(v.worst), "seconds": round(v.seconds, 3),
            "builds": [[{"max_num_tokens": t, "workspace_bytes": b} for t, b in stage] for stage in v.builds],
            "layer_errors": {k: _finite(x) for k, x in v.layer_errors},
            "failures": [{"invariant": f.invariant, "evidence": f.evidence} for f in v.failures],
            "known": v.known,
            "known_failures": [{"invariant": f.invariant, "evidence": f.evidence} for f in v.known_failures],
        } for v in verdicts],
    }


def _finite(x: float):
    """JSON has no infinity or NaN: those become the string ``"inf"`` / ``"nan"``."""
    return x if x == x and abs(x) != float("inf") else str(x)


def write_html(path: str, verdicts: Sequence[Verdict], title: str = "a2a-testbed run") -> None:
    """One page, no external resources: the table, then per scenario a bar chart of the
    error per layer (x tolerance) and of the workspace bytes per build."""
    rows, charts = [], []
    for i, v in enumerate(verdicts, 1):
        status = "PASS" if v.passed else "FAIL"
        fails = "<br>".join(f"<b>{html.escape(f.invariant)}</b>: {html.escape(f.evidence[:400])}"
                            for f in v.failures)
        rows.append(f"<tr class='{status.lower()}'><td>{i}</td><td>{status}</td>"
                    f"<td>{html.escape(v.scenario.short())}<br><small>{html.escape(v.scenario.label)}</small></td>"
                    f"<td>{v.worst:.3g}</td><td>{v.seconds:.1f}</td><td>{fails}</td>"
                    f"<td><code>{html.escape(v.scenario.to_cli())}</code></td></tr>")
        builds = [(f"s{s} b{b}", size) for s, stage in enumerate(v.builds) for b, (_, size) in enumerate(stage, 1)]
        charts.append(f"<h3>{i}. {html.escape(v.scenario.label or v.scenario.short())}</h3>"
                      + _bars("error per layer (x tolerance; 1 = the limit)", v.layer_errors, limit=1.0)
                      + _bars("workspace bytes per build", builds))
    passed = sum(v.passed for v in verdicts)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px;vertical-align:top;font-size:12px}}tr.fail{{background:#fdd}}tr.pass{{background:#efe}}
code{{font-size:11px}}svg{{margin:4px 12px 4px 0}}</style></head><body>
<h1>{html.escape(title)}: {passed} passed, {len(verdicts) - passed} failed</h1>
<table><tr><th>#</th><th>verdict</th><th>scenario</th><th>worst (x tol)</th><th>s</th><th>failures</th>
<th>reproduce</th></tr>{''.join(rows)}</table>{''.join(charts)}</body></html>"""
    with open(path, "w") as f:
        f.write(page)


def _bars(title: str, items: Sequence[tuple[str, float]], limit: float | None = None) -> str:
    if not items:
        return ""
    width, bar, gap, height = 360, 14, 4, 0
    finite = [value for _, value in items if value == value and value != float("inf")]
    top = max(finite + [limit or 0.0]) or 1.0
    parts = []
    for k, (name, value) in enumerate(items):
        y = 18 + k * (bar + gap)
        w = (width - 120) if value != value or value == float("inf") else min(value / top, 1.0) * (width - 120)
        color = "#c33" if limit is not None and value > limit else "#58a"
        parts.append(f"<text x='0' y='{y + 11}' font-size='11'>{html.escape(name)}</text>"
                     f"<rect x='70' y='{y}' width='{w:.1f}' height='{bar}' fill='{color}'/>"
                     f"<text x='{74 + w:.1f}' y='{y + 11}' font-size='10'>{value:.3g}</text>")
        height = y + bar + 4
    if limit is not None:
        x = 70 + limit / top * (width - 120)
        parts.append(f"<line x1='{x:.1f}' y1='14' x2='{x:.1f}' y2='{height}' stroke='#000' stroke-dasharray='3'/>")
    return (f"<svg width='{width}' height='{height}' xmlns='http://www.w3.org/2000/svg'>"
            f"<text x='0' y='11' font-size='12'>{html.escape(title)}</text>{''.join(parts)}</svg>")


def dump_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
