"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``) renders a
report of every matrix scenario, a failure with long evidence and the scenarios one
integration does not run, with every scenario's details unfolded; the page must not scroll
sideways in a 1280-pixel window, and every scenario must have its row. Skips with the reason
where Chromium is missing (``needs("chromium")``); under ``A2A_REQUIRE_CHROMIUM`` (CI) that is a failure."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess

import pytest

from testbed.harness import report
from testbed.harness.invariants import Failure, Verdict
from testbed.harness.matrix import MATRIX, on_integration

WIDTH = 1280
# The probe Chromium runs after the page loads: unfold every scenario, then measure.
PROBE = """<script>
for (const d of document.querySelectorAll('details')) d.open = true;
document.title = JSON.stringify({scroll: document.documentElement.scrollWidth, inner: innerWidth,
  rows: document.querySelectorAll('table tr').length - 1});
</script>"""


def _chromium() -> str:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _verdicts() -> list[Verdict]:
    out = []
    for i, sc in enumerate(MATRIX):
        v = Verdict(sc, worst=0.25, seconds=1.5, layer_errors=[(f"s0 l{j} p0", 0.1 * (j + 1)) for j in range(3)],
                    builds=[[(16, 36480 * (b + 1)) for b in range(2)] for _ in sc.stages])
        if i == 3:  # a failure whose evidence and reproducing line are long unbroken strings
            v.failures = [Failure("workspace", "rank 0: " + "x" * 600), Failure("output", "y " * 400)]
        out.append(v)
    return out


def _render(path, width: int) -> dict:
    done = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={path.parent / 'profile'}", f"--window-size={width},900", "--virtual-time-budget=3000",
         "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    title = re.search(r"<title>(.*?)</title>", done.stdout, re.S)
    assert title, done.stdout[:500]
    return json.loads(title.group(1).replace("&quot;", '"'))


@pytest.mark.needs("chromium")
def test_report_html_fits_a_1280_pixel_window_with_every_row(tmp_path):
    verdicts = _verdicts()
    refused = on_integration("sglang", "0.7.2")[1]
    page = tmp_path / "report.html"
    report.write_html(str(page), verdicts, refused, 42.0, "a2a-testbed run --html report.html")
    text = page.read_text()
    assert not re.search(r"(src|href)\s*=\s*['\"]?\s*https?:|url\(\s*['\"]?https?:|@import", text)  # self-contained
    assert text.index("Failures") < text.index("Scenarios")  # failures first
    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", PROBE + "</body>"))
    measured = _render(probe, WIDTH)
    assert measured["inner"] == WIDTH, measured
    assert measured["scroll"] <= WIDTH, f"the page scrolls sideways: {measured}"
    assert measured["rows"] == len(verdicts) + len(refused), measured


@pytest.mark.needs("chromium")
def test_report_html_overflow_is_what_the_probe_sees(tmp_path):
    # The probe itself can fail: a page with a wide unbreakable block scrolls.
    page = tmp_path / "wide.html"
    page.write_text(f"<html><head><title></title></head><body><pre>{'w' * 2000}</pre><table><tr><th>h</th></tr>"
                    f"<tr><td>1</td></tr></table>{PROBE}</body></html>")
    measured = _render(page, WIDTH)
    assert measured["scroll"] > WIDTH and measured["rows"] == 1, measured


def test_report_html_every_verdict_kind_has_its_class(tmp_path):
    sc = MATRIX[0]
    known = Verdict(sc, known=["VLLM-001"], known_failures=[Failure("completes", "TypeError")])
    page = tmp_path / "r.html"
    report.write_html(str(page), [Verdict(sc), known, Verdict(dataclasses.replace(sc, seed=1),
                                                              failures=[Failure("output", "e")])],
                      [(sc, "a rule")], 1.0)
    text = page.read_text()
    assert all(f"class='{k}'" in text for k in ("pass", "known", "fail", "notrun"))
    assert "1 passed, 1 failed, 1 known, 1 not run in 1.0 s" in text
