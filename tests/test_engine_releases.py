"""The engine releases the testbed drives besides the installed ones, each on the FlashInfer its
own metadata pins: vLLM 0.31.0 and 0.32.0 (FlashInfer 0.7.0.post1; their one-sided manager
drives ``MoeAlltoAll`` itself) and SGLang 0.5.22 (FlashInfer 0.7.1; no SP-prefill all-to-all).
Each runs its matrix, its mutants and its consumer contract. A release comes from its wheel,
fetched and unpacked once into the testbed's cache (``./dev setup --vllm --sglang`` does it
first), and runs in a process of its own (an engine is imported once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import integrations
from testbed.contract import open_source
from testbed.contract.consumer import check, pinned_flashinfer
from testbed.contract.source import open_package
from testbed.contract.tree import RealTree

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"
# (engine, release, its FlashInfer pin, the findings its matrix shows on that pin)
RELEASES = [("vllm", "0.31.0", "0.7.0.post1", {"VLLM-005", "FI-RACE"}),
            ("vllm", "0.32.0", "0.7.0.post1", {"VLLM-005", "FI-RACE"}),
            ("sglang", "0.5.22", "0.7.1", set())]
IDS = [f"{e}-{r}" for e, r, _, _ in RELEASES]


def _testbed(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _installed(request, engine: str) -> None:
    """The installed engine gives the release its dependencies (and CI requires it)."""
    request.getfixturevalue(f"{engine}_installed")


@pytest.mark.parametrize("engine, release, pin, known", RELEASES, ids=IDS)
def test_engine_release_matrix_on_its_pin(request, tmp_path, engine, release, pin, known):
    _installed(request, engine)
    out = tmp_path / "run.json"
    proc = _testbed("run", "--integration", engine, f"--{engine}-source", release, "--json", str(out), timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    ran = result["scenarios"]
    assert len(ran) >= 10 and result["failed"] == 0
    assert all(f"--profile {pin} " in s["cli"] for s in ran)  # the release's own pin, read from its metadata
    assert {k for s in ran for k in s["known"]} == known
    if resolve_name(pin) != pin:  # each verdict line names the profile serving the pin
        assert f"{pin} (served by {resolve_name(pin)})" in proc.stdout


def resolve_name(release: str) -> str:
    from fakes.flashinfer.profiles import resolve

    return resolve(release).name


def _chunks(engine: str, n: int) -> list[list[str]]:
    names = [m.name for m in integrations.get(engine).mutants()]
    return [names[i::n] for i in range(n)]


MUTANT_CHUNKS = [(e, r, c) for e, r, _, _ in RELEASES for c in _chunks(e, 3 if e == "vllm" else 2)]


@pytest.mark.parametrize("engine, release, names", MUTANT_CHUNKS,
                         ids=[f"{e}-{r}-{c[0]}" for e, r, c in MUTANT_CHUNKS])
def test_engine_release_mutants_killed(request, tmp_path, engine, release, names):
    _installed(request, engine)
    out = tmp_path / "mutants.json"
    only = [a for name in names for a in ("--only", name)]
    proc = _testbed("mutants", "--integration", engine, f"--{engine}-source", release, "--json", str(out), *only,
                    timeout=280)
    result = json.loads(out.read_text()) if out.is_file() else {}
    survivors = {m["mutant"] for m in result.get("mutants", []) if not m["killed"]}
    absent = {m["mutant"] for m in result.get("not_applicable", [])}
    assert result["total"] == len(names) - len(absent), proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not survivors, (proc.stdout[-3000:], proc.stderr[-2000:])
    # Only what the release has no code for is left out: SGLang 0.5.22's missing SP prefill.
    assert absent == ({"s-sp-runtime-max-of-all-rows"} & set(names) if (engine, release) == ("sglang", "0.5.22")
                      else set())


@pytest.mark.parametrize("engine, release, pin, known", RELEASES, ids=IDS)
def test_engine_release_consumer_contract(engine, release, pin, known):
    """What the release uses of FlashInfer, in its checked-in path files, against its pin's
    checked-in excerpt and the fake's profile of it (no engine imported)."""
    source = open_package(engine, str(DATA / "consumer_excerpts" / f"{engine}-{release}"))
    assert pinned_flashinfer(source) == pin
    report = check(source, integrations.get(engine).consumer(),
                   RealTree(open_source(str(DATA / "flashinfer_excerpts" / pin))), resolve_name(pin))
    assert report.fake_defects == 0 and report.count("ok") >= 45, report


def test_engine_release_pin_no_profile_serves_is_refused(tmp_path, monkeypatch):
    """An engine whose metadata pins a FlashInfer no profile serves is refused in one line
    naming the engine release, its pin and what the fake serves."""
    from testbed.integrations.vllm.environment import ENGINE, SOURCE_ENV

    root = tmp_path / "checkout"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm-0.99.0.dist-info").mkdir()
    (root / "vllm-0.99.0.dist-info" / "METADATA").write_text(
        "Name: vllm\nVersion: 0.99.0\nRequires-Dist: flashinfer-python==0.9.1\n")
    monkeypatch.setenv(SOURCE_ENV, str(root))
    with pytest.raises(ValueError) as e:
        ENGINE.pinned()
    assert str(e.value).startswith("vLLM 0.99.0 pins flashinfer-python 0.9.1, which no profile of the fake serves: "
                                   "it serves 0.6.8, ")
    assert "\n" not in str(e.value)


def test_engine_release_findings_first_release_from_runs(request, tmp_path):
    """``a2a-testbed findings`` over vLLM 0.32.0 and the installed release: VLLM-002 (MnnvlMoe
    removed in FlashInfer 0.7.4) first appears with 0.7.4, VLLM-005 on the oldest FlashInfer."""
    import importlib.util

    _installed(request, "vllm")
    installed = str(Path(importlib.util.find_spec("vllm").origin).parent.parent)
    out = tmp_path / "cells.json"
    proc = _testbed("findings", "--integration", "vllm", "--only", "VLLM-002", "--only", "VLLM-005",
                    "--vllm-source", "0.32.0", "--vllm-source", installed, "--json", str(out), timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cells = {(c["finding"], c["engine"], c["flashinfer"]): c["outcome"] for c in json.loads(out.read_text())}
    assert cells[("VLLM-002", "vLLM 0.32.0", "0.7.4")] == cells[("VLLM-002", "vLLM 0.33.0", "0.7.4")] == "reproduces"
    assert cells[("VLLM-002", "vLLM 0.32.0", "0.7.0.post1")] == "passes"
    assert cells[("VLLM-005", "vLLM 0.32.0", "0.7.0.post1")] == "reproduces"
    assert "first: vLLM 0.32.0 on FlashInfer 0.7.4" in proc.stdout
    assert "first: vLLM 0.32.0 on FlashInfer 0.6.8" in proc.stdout


GUARDED = """
import importlib.util

def has_one_sided():
    return importlib.util.find_spec("flashinfer.comm.trtllm_moe_alltoall") is not None

if has_one_sided():
    from flashinfer.comm import Mapping
    from flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll

try:
    from flashinfer.comm.trtllm_alltoall import MnnvlMoe
    two_sided = True
except ImportError:
    two_sided = False
"""


def test_engine_release_guarded_imports_rebound_per_release(tmp_path, monkeypatch):
    """vLLM 0.31/0.32 bind FlashInfer's classes under `if probe():` at import, SGLang under
    `try:`; each scenario re-runs the blocks under its own release, and a block that would not
    bind its names there leaves them unbound, as a fresh import would."""
    import importlib

    import fakes.flashinfer
    from testbed import patch
    from testbed.integrations.engine import guarded_flashinfer_imports

    (tmp_path / "guarded_engine.py").write_text(GUARDED)
    monkeypatch.syspath_prepend(str(tmp_path))
    with fakes.flashinfer.install("0.7.0.post1"):
        module = importlib.import_module("guarded_engine")
        names = guarded_flashinfer_imports(module)
        from flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll

        assert names["MoeAlltoAll"] is MoeAlltoAll and names["two_sided"] is True and "MnnvlMoe" in names
    with fakes.flashinfer.install("0.7.4"):
        names = guarded_flashinfer_imports(module)
        assert names == {"Mapping": patch.UNBOUND, "MoeAlltoAll": patch.UNBOUND, "two_sided": False}
        undo = [patch.attribute(module, n, v) for n, v in names.items()]
        assert not hasattr(module, "MoeAlltoAll") and module.two_sided is False
        for u in undo:
            u()
    assert module.MoeAlltoAll is not None and module.two_sided is True
    del sys.modules["guarded_engine"]
