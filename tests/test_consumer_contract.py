"""``a2a-testbed contract --consumer``: what vLLM's and SGLang's FlashInfer all-to-all paths use,
found in their checked-in path files and looked up in the checked-in release excerpts and the
fake (no network, neither engine imported)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from testbed.contract import open_source
from testbed.contract.tree import RealTree
from testbed import integrations
from testbed.contract.consumer import Consumer, PathFile, check, pinned_flashinfer
from testbed.contract.source import open_package

DATA = Path(__file__).parent / "data"
FLASHINFER = DATA / "flashinfer_excerpts"
VLLM, SGLANG = DATA / "consumer_excerpts" / "vllm-0.33.0", DATA / "consumer_excerpts" / "sglang-0.5.23"


def _report(consumer: str, where: Path, release: str, profile: str):
    found = integrations.get(consumer).consumer()
    source = open_package(found.dist, str(where))
    return check(source, found, RealTree(open_source(str(FLASHINFER / release))), profile)


def _rows(report, verdict: str) -> set[str]:
    return {r.use.what for r in report.rows if r.verdict == verdict}


def test_consumer_contract_vllm_on_its_pin_has_no_fake_gap():
    report = _report("vllm", VLLM, "0.7.2.post1", "0.7.2.post1")
    assert report.fake_defects == 0, [r.use for r in report.rows if r.verdict.startswith("FAKE")]
    assert report.count("ok") > 80 and len(report.files) == 7
    ok = _rows(report, "ok")
    # what the first probes hit: the re-export the layer builder imports, the lazy wrapper's module
    assert {"flashinfer.fused_moe.QuantFormat", "flashinfer.fp4_quantization.block_scale_interleave",
            "flashinfer.moe_ep.NVLinkOneSidedAlltoAll.dispatch(max_tokens_per_rank=)",
            "flashinfer.comm.Mapping(tp_size=)", "flashinfer.mxfp8_quantize(alignment=)"} <= ok
    assert _rows(report, "probed") == {"flashinfer.moe_ep.NVLinkOneSidedAlltoAll.checkpoint_prepare",
                                       "flashinfer.moe_ep.NVLinkOneSidedAlltoAll.checkpoint_restore"}


def test_consumer_contract_vllm_against_0_7_4_finds_vllm_001_and_002():
    report = _report("vllm", VLLM, "0.7.4", "0.7.4")
    assert report.fake_defects == 0
    findings = _rows(report, "FINDING")
    assert "flashinfer.moe_ep.NVLinkOneSidedAlltoAll.dispatch(max_tokens_per_rank=)" in findings  # VLLM-001
    assert "flashinfer.comm.trtllm_alltoall.MnnvlMoe" in findings  # VLLM-002
    # a keyword of a missing callee follows from it, and is not shown as its own finding
    assert "flashinfer.comm.trtllm_alltoall.MnnvlMoe.mnnvl_moe_alltoallv_combine(top_k=)" in _rows(report, "follows")


def test_consumer_contract_sglang_has_no_fake_gap():
    assert pinned_flashinfer(open_package("sglang", str(SGLANG))) == "0.7.2"
    report = _report("sglang", SGLANG, "0.7.2", "0.7.2")
    assert report.fake_defects == 0 and report.count("ok") >= 45
    assert {"flashinfer.nvfp4_block_scale_interleave", "flashinfer.mxfp8_quantize",
            "flashinfer.fp4_quantize(backend=)", "flashinfer.comm.MoeAlltoAll.dispatch(expert_id_payload_index=)",
            "flashinfer.comm.MoeAlltoAll.get_combine_payload_tensor_in_workspace"} <= _rows(report, "ok")


def test_consumer_contract_sees_a_fake_gap(monkeypatch):
    """The first probe's wall: a fake without fused_moe.QuantFormat fails the contract there."""
    import fakes.flashinfer.fused_moe as fused_moe

    real_getattr = fused_moe.__getattr__

    def without_quant_format(name):
        if name == "QuantFormat":
            raise AttributeError(name)
        return real_getattr(name)

    monkeypatch.setattr(fused_moe, "__getattr__", without_quant_format)
    report = _report("vllm", VLLM, "0.7.2.post1", "0.7.2.post1")
    assert "flashinfer.fused_moe.QuantFormat" in _rows(report, "FAKE GAP")


ENGINE = '''
from typing import TYPE_CHECKING

import importlib

if TYPE_CHECKING:
    from flashinfer.moe_ep import NVLinkOneSidedAlltoAll, NoSuchType

try:
    from flashinfer.comm import MoeAlltoAll, no_such_name
except ImportError:
    MoeAlltoAll = None

TABLE = [("flashinfer.comm.mapping", "Mapping"), ("flashinfer.comm", "NotThere")]


def probes():
    mod = importlib.import_module("flashinfer.moe_ep")
    return all(hasattr(mod, name) for name in ("MoEEpCommParams", "Missing")) and hasattr(mod.MoEEpCommParams,
                                                                                       "dispatch_format")


class Manager:
    def get(self) -> "NVLinkOneSidedAlltoAll":
        return self.comm

    def run(self):
        import flashinfer.comm.mapping as m

        m.Mapping(world_size=2, bogus=1)
        self.a2a = MoeAlltoAll(mapping=None, max_num_tokens=1, top_k=1, num_experts=2)
        self.a2a.dispatch(runtime_max_tokens_per_rank=1, wrong_keyword=2)
        comm = self.get()
        comm.dispatch(runtime_max_tokens_per_rank=1)
        if hasattr(comm, "checkpoint_prepare"):
            comm.checkpoint_prepare()
        self.takes_extra = supports_kw(comm.dispatch, "no_such_keyword")  # a probe's flag
        if self.takes_extra:
            comm.dispatch(runtime_max_tokens_per_rank=1, no_such_keyword=1)


class Unrelated:
    def run(self, group):
        self.a2a.not_flashinfer(x=1)  # another class's self.a2a: not the MoeAlltoAll above
        group.mapping.whatever(y=2)
'''


def test_consumer_scanner_every_kind_of_use(tmp_path):
    root = tmp_path / "site"
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "moe.py").write_text(textwrap.dedent(ENGINE))
    (root / "engine-1.0.dist-info").mkdir()
    (root / "engine-1.0.dist-info" / "METADATA").write_text("Name: engine\nVersion: 1.0\n")
    consumer = Consumer("engine", "engine", (PathFile("engine/*.py"),))
    report = check(open_package("engine", str(root)), consumer, RealTree(open_source(str(FLASHINFER / "0.7.4"))),
                   "0.7.4")
    by = {(r.use.kind, r.use.what): r.verdict for r in report.rows}
    assert by[("typing", "flashinfer.moe_ep.NVLinkOneSidedAlltoAll")] == "ok"
    assert by[("typing", "flashinfer.moe_ep.NoSuchType")] == "probed"
    assert by[("probe", "flashinfer.comm.no_such_name")] == "probed"  # under except ImportError
    assert by[("probe", "flashinfer.comm.mapping.Mapping")] == "ok"  # a table of (module, name)
    assert by[("probe", "flashinfer.comm.NotThere")] == "probed"
    assert by[("probe", "flashinfer.moe_ep.Missing")] == "probed"  # hasattr over a literal tuple
    assert by[("probe", "flashinfer.moe_ep.MoEEpCommParams.dispatch_format")] == "ok"  # a dataclass field
    assert by[("keyword", "flashinfer.comm.mapping.Mapping(bogus=)")] == "FINDING"
    assert by[("keyword", "flashinfer.comm.mapping.Mapping(world_size=)")] == "ok"
    # 0.7.4 has no MoeAlltoAll: its keywords follow from the missing class
    assert by[("probe", "flashinfer.comm.MoeAlltoAll")] == "probed"
    assert by[("keyword", "flashinfer.comm.MoeAlltoAll.dispatch(wrong_keyword=)")] == "follows"
    # an instance through a return annotation written as a string
    assert by[("keyword", "flashinfer.moe_ep.NVLinkOneSidedAlltoAll.dispatch(runtime_max_tokens_per_rank=)")] == "ok"
    assert by[("guarded", "flashinfer.moe_ep.NVLinkOneSidedAlltoAll.checkpoint_prepare")] == "ok"
    assert by[("guarded", "flashinfer.moe_ep.NVLinkOneSidedAlltoAll.dispatch(no_such_keyword=)")] == "probed"
    assert not any("not_flashinfer" in what or "whatever" in what for _, what in by)


def test_consumer_contract_cli_on_excerpts(capsys):
    from testbed.cli import main

    code = main(["contract", "--consumer", f"vllm={VLLM}", "--flashinfer", str(FLASHINFER / "0.7.2.post1"),
                 "--flashinfer", str(FLASHINFER / "0.7.4")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "vllm 0.33.0 against flashinfer 0.7.4 (fake profile 0.7.4)" in out
    assert "FINDING    keyword   flashinfer.moe_ep.NVLinkOneSidedAlltoAll.dispatch(max_tokens_per_rank=)" in out
    assert "flashinfer 0.7.2.post1 against fake profile 0.7.2.post1: " in out and " 0 differ" in out


@pytest.mark.parametrize("spec, rule", [("vllm=latest", "expected a release number"), ("trtllm", "known consumers"),
                                        ("vllm=/no/such/dir.whl", "no such wheel")])
def test_consumer_contract_bad_consumer_is_a_usage_error(capsys, spec, rule):
    from testbed.cli import main

    assert main(["contract", "--consumer", spec]) == 2
    assert rule in capsys.readouterr().err
