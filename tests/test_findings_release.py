"""A finding is in an engine release where its code is (``Finding.code``, read from that
release's files, never its version), and gone where it is not: its scenarios are then judged
as any other and the run names it ``GONE``. Rules of a release's own code (vLLM 0.34's
refusal of pipeline parallel under ``external_launcher``) refuse a scenario by name, apart
from its validation. No engine is imported: the releases' path files checked in, and
synthetic releases."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from testbed import integrations
from testbed.harness import findings
from testbed.integrations.base import Finding
from testbed.integrations.engine import Engine
from testbed.scenario.model import from_text

EXCERPTS = Path(__file__).parent / "data" / "consumer_excerpts"
VLLM_SOURCE = "A2A_VLLM_SOURCE"


def _toy_release(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "toy" / "__init__.py").write_text("")
    (root / "toy-2.0.dist-info").mkdir()
    (root / "toy-2.0.dist-info" / "METADATA").write_text("Name: toy\nVersion: 2.0\n")
    return root


TOY = Engine("toy", "Toy", "A2A_TOY_SOURCE", "root", (), (), lambda: None)


def _toy(finding: Finding):
    return SimpleNamespace(engine=TOY, findings=lambda: (finding,))


@pytest.fixture(autouse=True)
def _fresh_probes():
    from testbed.integrations.vllm import rules

    findings._gone.cache_clear()
    rules.refuses_pp_with_external_launcher.cache_clear()
    yield
    findings._gone.cache_clear()
    rules.refuses_pp_with_external_launcher.cache_clear()


def test_findings_gone_where_a_pattern_no_longer_matches(tmp_path, monkeypatch):
    finding = Finding("TOY-1", "toy", lambda sc: True, (("completes", "x"),),
                      code=(("toy/a2a.py", r"dispatch\(max_tokens="), ("toy/a2a.py", r"\bMnnvlMoe\b")))
    root = _toy_release(tmp_path / "has", {"toy/a2a.py": "MnnvlMoe.prepare()\nc.dispatch(max_tokens=n)\n"})
    monkeypatch.setenv("A2A_TOY_SOURCE", str(root))
    assert findings.gone(_toy(finding), finding) is None

    root = _toy_release(tmp_path / "fixed", {"toy/a2a.py": "MnnvlMoe.prepare()\nc.dispatch(runtime_max=n)\n"})
    monkeypatch.setenv("A2A_TOY_SOURCE", str(root))
    assert findings.gone(_toy(finding), finding) == r"toy/a2a.py of Toy 2.0 no longer matches /dispatch\(max_tokens=/"

    root = _toy_release(tmp_path / "moved", {"toy/other.py": ""})
    monkeypatch.setenv("A2A_TOY_SOURCE", str(root))
    assert findings.gone(_toy(finding), finding) == "Toy 2.0 has no toy/a2a.py"
    # A finding of FlashInfer's names no engine code: never gone by this probe.
    assert findings.gone(_toy(finding), Finding("FI-X", "fi", lambda sc: True, (("completes", "x"),))) is None


_FIXED_BY_022 = ("VLLM-009", "VLLM-010", "VLLM-011", "VLLM-012", "VLLM-013", "VLLM-014", "VLLM-015")


@pytest.mark.parametrize("release, absent", [
    # VLLM-008 is 0.34.0's: no release before builds NVLinkOneSidedConfig(cft=)
    # VLLM-009 .. 015 are 0.18 .. 0.21's, fixed by 0.22 (VLLM-010/011 by 0.20, VLLM-015 by 0.20.1)
    ("0.18.0", {"VLLM-001", "VLLM-008"}),  # its prepare/finalizes beside the layer
    ("0.19.0", {"VLLM-001", "VLLM-008"}),
    ("0.21.0", {"VLLM-001", "VLLM-008", "VLLM-010", "VLLM-011", "VLLM-015"}),
    ("0.22.0", {"VLLM-001", "VLLM-008"} | set(_FIXED_BY_022)),
    ("0.31.0", {"VLLM-001", "VLLM-008"} | set(_FIXED_BY_022)),  # its one-sided prepare passes runtime_max_tokens_per_rank already
    ("0.32.0", {"VLLM-001", "VLLM-008"} | set(_FIXED_BY_022)),
    ("0.33.0", {"VLLM-008"} | set(_FIXED_BY_022)),
    ("0.34.0", {"VLLM-001", "VLLM-002", "VLLM-005", "VLLM-006"} | set(_FIXED_BY_022)),  # moe_ep both ways
])
def test_findings_vllm_release_has_what_its_code_holds(release, absent, monkeypatch):
    monkeypatch.setenv(VLLM_SOURCE, str(EXCERPTS / f"vllm-{release}"))
    vllm = integrations.get("vllm")
    gone = {f.id for f in vllm.findings() if findings.gone(vllm, f)}
    assert gone == absent
    assert {"VLLM-003", "VLLM-004"}.isdisjoint(gone)  # the latent ones stay on every release


def test_findings_gone_finding_no_longer_judged_known(monkeypatch):
    """A two-sided scenario of vLLM 0.34.0 is judged as any other: VLLM-005 no longer applies."""
    sc = from_text("4,2,2,1", "bf16:8", "1,5 3,3", integration="vllm", path="two_sided", hidden=512)
    monkeypatch.setenv(VLLM_SOURCE, str(EXCERPTS / "vllm-0.33.0"))
    assert "VLLM-005" in {f.id for f in findings.known(sc)}
    findings._gone.cache_clear()
    monkeypatch.setenv(VLLM_SOURCE, str(EXCERPTS / "vllm-0.34.0"))
    assert "VLLM-005" not in {f.id for f in findings.known(sc)}


def test_findings_fi_race_not_on_kernels_that_order_rounds():
    """FI-RACE is FlashInfer's: MoeAlltoAll's protocol, not moe_ep's own kernels (0.7.4)."""
    vllm = integrations.get("vllm")
    race = next(f for f in vllm.findings() if f.id == "FI-RACE")
    grows = dict(integration="vllm")
    assert race.applies(from_text("2,1,2,1", "mxfp8:16,bf16:16", "4,6 1,3", profile="0.7.2.post1", **grows))
    assert not race.applies(from_text("2,1,2,1", "mxfp8:16,bf16:16", "4,6 1,3", profile="0.7.4", **grows))


def test_findings_release_pp_starts_as_mp_where_external_launcher_refuses_it(tmp_path, monkeypatch):
    """A release whose GPU runner refuses PP under the external launcher (0.34) is driven as its
    mp executor starts PP: each DP rank's engine given its ``data_parallel_rank``, each worker's
    rank within its DP rank's TP x PP world; elsewhere every rank is one of one world."""
    from testbed.cluster.layout import ParallelLayout
    from testbed.integrations.vllm import rules

    layout = ParallelLayout(8, tp=2, dp=2, pp=2)
    refused = ('    unsupported = []\n    if pp:\n        unsupported.append("pipeline parallelism with '
               'external_launcher")\n    return unsupported\n')
    for name, config in (("refuses", "def _get_model_runner_unsupported_features(self):\n" + refused),
                         # vLLM 0.33: the same words, for its optional V2 runner only
                         ("takes", "def _get_v2_model_runner_unsupported_features(self):\n" + refused)):
        root = tmp_path / name
        (root / "vllm" / "config").mkdir(parents=True)
        (root / "vllm" / "config" / "vllm.py").write_text(config)
        (root / "vllm-9.0.dist-info").mkdir()
        monkeypatch.setenv(VLLM_SOURCE, str(root))
        rules.refuses_pp_with_external_launcher.cache_clear()
        launches = [rules.executor_launch(layout, rank) for rank in range(layout.world_size)]
        if name == "refuses":
            assert {la.config["distributed_executor_backend"] for la in launches} == {"mp"}
            assert [la.config["data_parallel_rank"] for la in launches] == [0] * 4 + [1] * 4
            assert [(la.world_size, la.rank) for la in launches] == [(4, r % 4) for r in range(8)]
        else:
            assert [la.config for la in launches] == [{"distributed_executor_backend": "external_launcher"}] * 8
            assert [(la.world_size, la.rank) for la in launches] == [(8, r) for r in range(8)]
        assert rules.executor_launch(ParallelLayout(4, tp=2, dp=2), 3).config == \
            {"distributed_executor_backend": "external_launcher"}
    rules.refuses_pp_with_external_launcher.cache_clear()


def test_findings_never_gone_without_a_release_to_read(monkeypatch):
    """Where the engine is not installed (the plain tier) nothing shows a finding gone."""
    finding = Finding("TOY-2", "toy", lambda sc: True, (("completes", "x"),), code=(("toy/a2a.py", "x"),))
    monkeypatch.delenv("A2A_TOY_SOURCE", raising=False)
    assert findings.gone(_toy(finding), finding) is None  # no distribution named toy is installed


SGLANG_SOURCE = "A2A_SGLANG_SOURCE"
# The bugs SGLang shipped, by the first release without them (docs/findings.md).
_SGL_FIXED_IN = {"SGL-006": "0.5.11", "SGL-007": "0.5.15", "SGL-008": "0.5.15", "SGL-009": "0.5.20",
                 "SGL-010": "0.5.19", "SGL-011": "0.5.16", "SGL-012": "0.5.12"}
_SGL_RELEASES = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18",
                 "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


@pytest.mark.parametrize("release", _SGL_RELEASES)
def test_findings_sglang_release_has_what_its_code_holds(release, monkeypatch):
    """Each bug SGLang shipped is in the releases before its fix and gone from the fix on, read
    from the checked-in excerpts of the files its code locator names; the latent ones and
    FlashInfer's stay on every release."""
    from packaging.version import Version

    monkeypatch.setenv(SGLANG_SOURCE, str(EXCERPTS / f"sglang-{release}"))
    sglang = integrations.get("sglang")
    gone = {f.id for f in sglang.findings() if findings.gone(sglang, f)}
    assert gone == {fid for fid, fixed in _SGL_FIXED_IN.items() if Version(release) >= Version(fixed)}
    assert {"SGL-002", "SGL-003", "SGL-004", "SGL-005"}.isdisjoint(gone)
