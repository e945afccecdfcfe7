"""``--integration sglang``: SGLang 0.5.23's own FlashinferDispatcher through the scenario model,
its invariants, its known findings and its mutants (the model's rules and the fixed-capacity
workspace rule need no SGLang)."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from testbed.harness import findings, invariants, runner
from testbed.harness.invariants import Failure, Verdict, check
from testbed.harness.matrix import on_integration
from testbed.integrations.sglang.matrix import SGLANG_MATRIX
from testbed.scenario.events import AlltoallBuilt, Combine, ForwardStart, LayerBuilt
from testbed.scenario.model import ScenarioInputError
from tests.test_scenario import _parse

SGLANG_TIMEOUT_S = 60.0
BASE = "a2a-testbed run --layout 2,1,2,1 --stages bf16:16 --tokens 5,7 --integration sglang"


@pytest.mark.parametrize("line, flag", [
    (f"{BASE} --stages mxfp8:16", "--stages"), (f"{BASE} --stages bf16:16,bf16:8", "--stages"),
    (f"{BASE} --stages bf16:16,nvfp4:16", "--stages"),
    (f"{BASE} --path two_sided", "--path"), (f"{BASE} --tokens 0,0", "--tokens"),
    (f"{BASE} --expert-output workspace", "--expert-output"), (f"{BASE} --combine-signature opaque", "--combine-signature"),
    (f"{BASE} --shared-experts", "--shared-experts"),
    ("a2a-testbed run --layout 4,2,2,1 --stages bf16:16 --tokens 5,7 --integration sglang", "--layout"),
    ("a2a-testbed run --layout 2,2,1,1 --stages bf16:16 --tokens 5 --integration sglang", "--layout"),
    ("a2a-testbed run --layout 4,1,2,2 --stages 'bf16:16;bf16:16' --tokens 5,7 --integration sglang", "--layout"),
    ("a2a-testbed run --layout 2,2,1,1 --stages bf16:16 --tokens 4 --integration sglang --sp-prefill", "--sp-prefill"),
    ("a2a-testbed run --layout 4,4,1,1 --stages nvfp4:16 --tokens 4 --integration sglang --sp-prefill", "--sp-prefill"),
    ("a2a-testbed run --layout 4,4,1,1 --stages bf16:16 --tokens 6 --integration sglang --sp-prefill", "--tokens"),
])
def test_sglang_integration_model_refuses_what_sglang_cannot_run(line, flag):
    with pytest.raises(ScenarioInputError) as e:
        _parse(line)
    assert e.value.flag == flag


def test_sglang_integration_sp_prefill_is_sglangs():
    with pytest.raises(ScenarioInputError) as e:
        _parse("a2a-testbed run --layout 4,4,1,1 --stages bf16:16 --tokens 4 --sp-prefill")
    assert e.value.flag == "--sp-prefill" and "--integration sglang" in str(e.value)


def test_sglang_integration_cli_round_trip():
    sc = _parse(f"{BASE} --invalid-expert-id num_experts --expert-output workspace --router-ids int64")
    assert sc.integration == "sglang" and sc.api == "comm" and not sc.splits_tokens
    assert _parse(sc.to_cli()) == sc
    sp = _parse("a2a-testbed run --layout 8,8,1,1 --stages bf16:16 --tokens 16 --tokens 8 --integration sglang "
                "--sp-prefill")
    assert sp.sp_prefill and sp.splits_tokens and _parse(sp.to_cli()) == sp


@pytest.mark.needs("sglang")
def test_sglang_integration_topology_rule_is_sglangs_own():
    from sglang.srt.arg_groups.moe_hook import _flashinfer_a2a_topology_is_supported

    from testbed.cluster.layout import ParallelLayout
    from testbed.integrations.sglang.adapter import server_arguments
    from testbed.integrations.sglang.rules import sglang_topology_supported

    for world in range(2, 9):
        for tp in (t for t in range(1, world + 1) if world % t == 0):
            layout = ParallelLayout(world, tp, world // tp, 1)
            for sp in (False, True):  # the server arguments the adapter gives (server_arguments)
                args = server_arguments(dataclasses.replace(_parse(BASE), layout=layout, sp_prefill=sp))
                sglang = _flashinfer_a2a_topology_is_supported(
                    architecture="MuseSparkForConditionalGeneration" if sp else None, tp_size=args["tp_size"],
                    ep_size=args["ep_size"], attn_dp_size=args.get("dp_size", 1),
                    attn_dp_enabled=args.get("enable_dp_attention", False), enable_layernorm_sp=sp)
                assert sglang_topology_supported(layout, sp) == sglang, (layout, sp)


def test_sglang_integration_matrix_moves_every_entry_or_names_the_rule():
    runnable, refused = on_integration("sglang", "0.7.2")
    assert len(runnable) + len(refused) > len(SGLANG_MATRIX)
    assert all(sc.integration == "sglang" for sc in runnable) and all(rule for _, rule in refused)
    assert runnable[:len(SGLANG_MATRIX)] == [dataclasses.replace(sc, label=r.label)
                                            for sc, r in zip(SGLANG_MATRIX, runnable)]


def _fixed_logs(*builds, rounds=((0, 0, 1),), layers=1):
    """One rank's log: ``builds`` as (max_num_tokens, bytes, workspace), all with the first
    layer, then ``layers`` layers, then rounds as (pass, layer, build)."""
    events = [AlltoallBuilt(index=i, max_num_tokens=t, workspace_size=b, workspace=w, top_k=2, num_experts=8)
              for i, (t, b, w) in enumerate(builds, 1)]
    events += [LayerBuilt(layer=i) for i in range(layers)]
    for p, i, b in rounds:
        events += [ForwardStart(pass_index=p, layer=i, reduced=True, pending=False, sp=False),
                   Combine(build=b, runtime_max=5, output=False, resident=False)]
    return {0: events, 1: events}


def test_sglang_integration_fixed_capacity_rule():
    sc = _parse("a2a-testbed run --layout 2,1,2,1 --stages bf16:16,bf16:16 --tokens 5,7 --integration sglang")
    size = invariants._size(2, 16, 256 * 2 + 16, 512)
    ok = _fixed_logs((16, size, 1), (16, size + 256, 2), rounds=((0, 0, 1), (0, 1, 2)), layers=2)
    assert not check(sc, ok, None, None).failed("workspace")
    for logs, piece in ((_fixed_logs((8, size, 1)), "needs max_num_tokens >= 16"),
                        (_fixed_logs((16, size - 1, 1)), f"{size} bytes"),
                        (_fixed_logs((16, size, 1), (32, size, 2)), "one fixed capacity"),
                        (_fixed_logs((16, size, 1), (16, size, 1)), "share a workspace"),
                        ({0: [LayerBuilt(layer=0)], 1: [LayerBuilt(layer=0)]}, "without any MoeAlltoAll"),
                        ({**_fixed_logs((16, size, 1)), 1: _fixed_logs((16, size + 1, 1))[1]}, "of the same EP group")):
        found = check(sc, logs, None, None).failed("workspace")
        assert found and piece in found[0].evidence, (piece, found)


def test_sglang_integration_combine_without_output_is_not_a_probe_failure():
    sc = _parse(BASE)  # 0.7.2's combine takes output=; SGLang does not probe for it
    assert not check(sc, _fixed_logs((16, 10 ** 6, 1)), None, None).failed("probe")
    impl = dataclasses.replace(sc, integration="impl")
    assert check(impl, _fixed_logs((16, 10 ** 6, 1)), None, None).failed("probe")


def _verdict(sc, failures=()):
    v = Verdict(sc)
    v.failures.extend(failures)
    return v


@pytest.fixture
def sglang_0_5_23(monkeypatch):
    """SGLang 0.5.23's code decides which findings its scenarios have (its path files checked
    in): a process without SGLang reads no release, and every finding would apply there."""
    from pathlib import Path

    # Read as the findings' code probe reads a release given by A2A_SGLANG_SOURCE, without
    # putting that tree of path files on this process's import path.
    excerpt = str(Path(__file__).parent / "data" / "consumer_excerpts" / "sglang-0.5.23")
    monkeypatch.setattr(findings, "_gone", lambda engine, code, source: engine.missing_code(code, excerpt))


def test_sglang_integration_known_findings_are_scenario_properties(sglang_0_5_23):
    assert not findings.known(_parse(BASE))
    on_074 = _parse(f"{BASE} --profile 0.7.4")
    assert [f.id for f in findings.known(on_074)] == ["SGL-002"]
    hit = _verdict(on_074, [Failure("completes", "ImportError: Flashinfer is not installed or does not support A2A.")])
    assert findings.judge(hit) == "KNOWN SGL-002" and hit.passed
    other = _verdict(on_074, [Failure("output", "rank 0 ...")])
    assert findings.judge(other) is None and other.failed("output")
    gone = _verdict(on_074)
    assert findings.judge(gone) is None and gone.failed("known-finding")


@pytest.mark.needs("sglang")
def test_sglang_integration_guarded_imports_follow_the_release():
    import fakes.flashinfer
    from testbed.integrations.engine import guarded_flashinfer_imports as rebind_guarded_imports
    from testbed.integrations.sglang.environment import DISPATCHER

    module = importlib.import_module(DISPATCHER)
    with fakes.flashinfer.install("0.7.2"):
        names = rebind_guarded_imports(module)
        from flashinfer.comm import MoeAlltoAll
    assert names["use_flashinfer"] is True and names["MoeAlltoAll"] is MoeAlltoAll
    with fakes.flashinfer.install("0.7.4"):
        assert rebind_guarded_imports(module) == {"use_flashinfer": False}


@pytest.mark.needs("sglang")
def test_sglang_integration_torchvision_placeholder_fails_loudly():
    import torchvision.transforms as transforms

    with pytest.raises(RuntimeError, match="torchvision placeholder"):
        transforms.Resize(4)


@pytest.mark.needs("sglang")
def test_sglang_integration_flashinfer_074_breaks_sglang(no_leaks):
    v = runner.run(no_leaks, dataclasses.replace(SGLANG_MATRIX[0], profile="0.7.4"), timeout_s=SGLANG_TIMEOUT_S)
    assert v.known == ["SGL-002"] and "ImportError" in v.known_failures[0].evidence


@pytest.mark.needs("sglang")
def test_sglang_integration_late_zeroing_is_ordered_by_the_schedulers_token_count_gather(no_leaks):
    """SGL-003 run, not only read: on a FlashInfer before 0.7.1 the dispatcher leaves the
    zeroing of its MoeAlltoAll rows unordered, yet with EP rank 1's zeroing held until rank 0
    moves on, the token-count all-gather SGLang's scheduler makes before every forward orders
    them: the round completes and matches the reference; only the contract breach shows."""
    v = runner.run(no_leaks, _parse(f"{BASE} --profile 0.7.0 --late-zeroing"), timeout_s=SGLANG_TIMEOUT_S)
    assert v.status == "KNOWN" and v.known == ["SGL-003"], v.failures
    assert {f.invariant for f in v.known_failures} == {"collectives"}


def test_sglang_integration_draft_layers_rules():
    """A speculative draft model is SGLang's (its speculative MoE context), leaves the target a
    layer, and runs beside DP attention, not Muse Spark's SP prefill."""
    base = "a2a-testbed run --layout 4,1,4,1 --stages bf16:8,bf16:8 --tokens 3,0,8,1"
    assert _parse(f"{base} --integration sglang --draft-layers 1").draft_layers == 1
    for extra, flag in (("--draft-layers 1", "--draft-layers"), ("--integration vllm --draft-layers 1", "--draft-layers"),
                        ("--integration sglang --draft-layers 2", "--draft-layers"),
                        ("--integration sglang --draft-layers -1", "--draft-layers")):
        with pytest.raises(ScenarioInputError) as e:
            _parse(f"{base} {extra}")
        assert e.value.flag == flag, extra
    with pytest.raises(ScenarioInputError) as e:
        _parse("a2a-testbed run --layout 4,4,1,1 --stages bf16:8,bf16:8 --tokens 4 --integration sglang --sp-prefill "
               "--draft-layers 1")
    assert e.value.flag == "--draft-layers"
    sc = _parse(f"{base} --integration sglang --draft-layers 1")
    assert _parse(sc.to_cli()) == sc and "draft=1" in sc.short()


BLOCK = "a2a-testbed run --layout 4,1,4,1 --stages bf16:8,bf16:8 --tokens 3,0,8,1 --integration sglang"


@pytest.mark.parametrize("extra, flag", [
    ("--block mixtral", "--block"), ("--block qwen3_moe --stages nvfp4:8", "--block"),
    ("--block deepseek_v2", "--shared-experts"), ("--block qwen3_moe --shared-experts", "--shared-experts"),
    ("--block olmoe --routed-scaling 2.5", "--routed-scaling"), ("--routed-scaling 2.5", "--routed-scaling"),
    ("--block gpt_oss --invalid-expert-id num_experts", "--invalid-expert-id"),
    ("--block qwen3_moe --draft-layers 1", "--draft-layers"),
])
def test_sglang_block_refuses_what_the_block_cannot_run(extra, flag):
    with pytest.raises(ScenarioInputError) as e:
        _parse(f"{BLOCK} {extra}")
    assert e.value.flag == flag, (extra, e.value)


@pytest.mark.parametrize("integration", ["impl", "vllm"])
def test_sglang_block_is_sglangs(integration):
    with pytest.raises(ScenarioInputError) as e:
        _parse(f"{BLOCK.replace('sglang', integration)} --block qwen3_moe")
    assert e.value.flag == "--block" and "--integration sglang" in str(e.value)


def test_sglang_block_cli_round_trip():
    sc = _parse(f"{BLOCK} --block deepseek_v2 --shared-experts --routed-scaling 2.5")
    assert (sc.block, sc.shared_experts, sc.routed_scaling) == ("deepseek_v2", True, 2.5)
    assert _parse(sc.to_cli()) == sc and "block=deepseek_v2" in sc.short()


def test_sglang_block_findings_are_the_blocks(sglang_0_5_23):
    """The blocks' findings apply to their blocks, whatever else the scenario varies."""
    assert not findings.known(_parse(f"{BLOCK} --block qwen3_moe"))
    assert [f.id for f in findings.known(_parse(f"{BLOCK} --block olmoe"))] == ["SGL-004"]
    even = BLOCK.replace("--tokens 3,0,8,1", "--tokens 4,4,4,4")
    cutlass = "--invalid-expert-id num_experts --expert-output workspace"
    assert [f.id for f in findings.known(_parse(f"{even} --block phimoe {cutlass}"))] == ["SGL-005"]
    assert not findings.known(_parse(f"{BLOCK} --block phimoe"))  # its other form: a rank dies, a FAIL


@pytest.mark.needs("sglang")
@pytest.mark.parametrize("block", ["qwen3_moe", "deepseek_v2"])
def test_sglang_block_passes_with_an_idle_dp_rank(no_leaks, block):
    """SGLang's own block, built by SGLang, on a DP rank with no token beside busy ones: the
    block's empty routing still joins the all-to-all, and every invariant holds."""
    extra = " --shared-experts --routed-scaling 2.5" if block == "deepseek_v2" else ""
    line = f"{BLOCK} --block {block}{extra}".replace("--tokens 3,0,8,1", "--tokens 2,5,0,8 --tokens 1,0,0,3")
    v = runner.run(no_leaks, _parse(line), timeout_s=SGLANG_TIMEOUT_S)
    assert v.status == "PASS", v.failures


@pytest.mark.needs("sglang")
@pytest.mark.parametrize("block, finding, evidence", [
    ("olmoe", "SGL-004", "TypeError"), ("phimoe", "SGL-005", "x the tolerance")])
def test_sglang_block_reduce_results_true_blocks_are_findings(no_leaks, block, finding, evidence):
    """The blocks that build FusedMoE(reduce_results=True), run: OLMoE's is never built under
    FlashInfer A2A (no top_k), PhiMoE's sums the DP ranks' outputs over the TP group."""
    line = f"{BLOCK} --block {block}".replace("--tokens 3,0,8,1", "--tokens 4,4,4,4 --tokens 2,2,2,2")
    v = runner.run(no_leaks, _parse(line), timeout_s=SGLANG_TIMEOUT_S)
    assert v.status == "KNOWN" and v.known == [finding], v.failures
    assert evidence in v.known_failures[0].evidence
