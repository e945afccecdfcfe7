"""``--integration vllm``: vLLM 0.33.0's own FlashInfer all-to-all classes through the scenario
model, its invariants and its known findings (the model's rules need no vLLM)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from testbed.harness import findings, runner
from testbed.harness.invariants import Failure, Verdict, check
from testbed.harness.matrix import on_integration
from testbed.integrations.vllm.matrix import VLLM_MATRIX
from testbed.scenario.events import CommunicationBuilt, Dispatch, LayerBuilt
from testbed.scenario.model import ScenarioInputError
from tests.test_scenario import _parse

VLLM_TIMEOUT_S = 60.0
BASE = ("a2a-testbed run --layout 2,1,2,1 --stages bf16:16 --tokens 5,7 --integration vllm")
# BASE's layout and passes left to the test.
RUN = "a2a-testbed run --integration vllm"


@pytest.mark.parametrize("extra, flag", [
    ("--stages bf16:16,bf16:8", "--stages"),
    ("--path allgather_reducescatter", "--path"), ("--combine-signature opaque", "--combine-signature"),
    ("--shared-experts --level kernel", "--shared-experts"), ("--expert-kernel trtllm", "--expert-kernel"),
    ("--router-ids int64", "--router-ids"), ("--mx-alignment 64", "--mx-alignment"),
    ("--stages nvfp4:16 --level kernel", "--stages"), ("--stages fp8_block:16 --level kernel", "--stages"),
])
def test_vllm_integration_model_refuses_what_vllm_cannot_run(extra, flag):
    with pytest.raises(ScenarioInputError) as e:
        _parse(f"{BASE} {extra}")
    assert e.value.flag == flag


@pytest.mark.parametrize("extra", ["--path one_sided", "--path two_sided --hidden 512 --sequence-parallel"])
def test_vllm_integration_sequence_parallel_where_vllm_turns_it_on(extra):
    """vLLM 0.33.0 runs the MoE sequence parallel exactly on one-sided with TP > 1 and DP > 1."""
    with pytest.raises(ScenarioInputError) as e:
        _parse(f"{RUN} --layout 4,2,2,1 --stages bf16:16 --tokens 3,1 {extra}")
    assert e.value.flag == "--sequence-parallel" and "use_sequence_parallel_moe" in str(e.value)
    assert _parse(f"{RUN} --layout 4,2,2,1 --stages bf16:16 --tokens 3,1 --sequence-parallel").sequence_parallel


def test_vllm_integration_engine_step_rule():
    """vLLM's engine runs an idle DP rank on the 1-token dummy batch and no step where every DP
    rank is idle; --raw-passes keeps the passes as given."""
    run = "a2a-testbed run --layout 4,1,4,1 --stages bf16:8 --integration vllm"
    sc = _parse(f"{run} --tokens 0,0,0,0 --tokens 2,0,0,5 --tokens 0,0,0,0")
    assert sc.passes == ((2, 1, 1, 5),)
    assert _parse(sc.to_cli()) == sc
    raw = _parse(f"{run} --tokens 0,0,0,0 --tokens 2,0,0,5 --raw-passes")
    assert raw.passes == ((0, 0, 0, 0), (2, 0, 0, 5)) and _parse(raw.to_cli()) == raw
    with pytest.raises(ScenarioInputError) as e:
        _parse(f"{run} --tokens 0,0,0,0")
    assert e.value.flag == "--tokens" and "no forward" in str(e.value)
    impl = _parse("a2a-testbed run --layout 2,1,2,1 --stages bf16:8 --tokens 0,0")
    assert impl.passes == ((0, 0),)  # impl has no engine: its passes are the given ones


def test_vllm_integration_latent_findings_only_on_raw_passes():
    engine = _parse(f"{RUN} --layout 4,1,4,1 --tokens 0,0,0,0 --tokens 0,3,0,0 --stages mxfp8:8")
    # (the findings of older releases' code apply too where no release is here to read)
    assert all(f.reachable != "no" for f in findings.known(engine))
    raw = dataclasses.replace(engine, raw_passes=True, passes=((0, 0, 0, 0), (0, 3, 0, 0)))
    known = {f.id: f for f in findings.known(raw)}
    assert {i for i, f in known.items() if f.reachable == "no"} == {"VLLM-003", "VLLM-004"}
    for sc in VLLM_MATRIX:
        assert all(f.reachable != "no" for f in findings.known(sc)), sc.label


def test_vllm_integration_cli_round_trip():
    sc = _parse(f"{BASE} --stages mxfp8:16,bf16:16 --path two_sided --hidden 512")
    assert sc.integration == "vllm" and sc.api == "comm"
    assert _parse(sc.to_cli()) == sc
    assert _parse(BASE).api == "moe_ep"  # vLLM's one-sided manager drives moe_ep on every release


def test_vllm_integration_matrix_moves_every_entry_or_names_the_rule():
    runnable, refused = on_integration("vllm", "0.7.2")
    assert len(runnable) + len(refused) > len(VLLM_MATRIX)
    assert all(sc.integration == "vllm" for sc in runnable) and all(rule for _, rule in refused)


def _verdict(sc, failures=()):
    v = Verdict(sc)
    v.failures.extend(failures)
    return v


def test_vllm_integration_known_finding_that_stops_reproducing_fails():
    sc = _parse(f"{BASE} --profile 0.7.4")
    v = _verdict(sc)
    assert findings.judge(v) is None and v.failed("known-finding")
    other = _verdict(sc, [Failure("output", "rank 0 ...")])
    assert findings.judge(other) is None and other.failed("output")  # another failure is not the finding
    hit = _verdict(sc, [Failure("completes", "TypeError: ... unexpected keyword argument 'max_tokens_per_rank'")])
    assert findings.judge(hit) == "KNOWN VLLM-001" and hit.passed and hit.known_failures


def _shared_logs(builds, layers=2, dispatch_build=None):
    events = []
    for i in range(layers):
        if i < len(builds):
            tokens, hidden, row = builds[i]
            events.append(CommunicationBuilt(index=i + 1, backend="nvlink_one_sided", max_num_tokens=tokens, hidden=hidden,
                                             row_bytes=row, workspace_size=1000 * (i + 1), top_k=2, num_experts=8))
        events.append(LayerBuilt(layer=i))
    events.append(Dispatch(runtime_max=4, tokens=4, build=dispatch_build or len(builds)))
    return {0: events, 1: events}


def test_vllm_integration_shared_communication_rule():
    sc = _parse(f"{BASE} --stages mxfp8:16,bf16:16")
    mx, bf = 256 + 8, 512
    assert not check(sc, _shared_logs([(16, 256, mx), (16, 256, bf)]), None, None).failed("workspace")
    for logs, piece in ((_shared_logs([(16, 256, mx)]), "does not cover layer 1"),
                        (_shared_logs([(16, 256, bf), (16, 256, mx)]), "shrinks"),
                        (_shared_logs([(16, 256, mx), (16, 256, bf)], dispatch_build=1), "kept a replaced"),
                        (_shared_logs([(16, 256, bf), (16, 256, bf)]), "build(s) for layer 1")):
        found = check(sc, logs, None, None).failed("workspace")
        assert found and piece in found[0].evidence, (piece, found)


@pytest.mark.needs("vllm")
def test_vllm_integration_flashinfer_074_breaks_vllm(no_leaks):
    sc = dataclasses.replace(VLLM_MATRIX[0], profile="0.7.4")
    v = runner.run(no_leaks, sc, timeout_s=VLLM_TIMEOUT_S)
    assert v.known == ["VLLM-001"]
    assert "TypeError" in v.known_failures[0].evidence


@pytest.mark.needs("vllm")
def test_vllm_integration_latent_all_idle_forward_raw(no_leaks):
    """VLLM-003 as a direct caller of vLLM's layer meets it: MoERunner fed a forward where no DP
    rank has a token (the engine never runs one)."""
    sc = _parse("a2a-testbed run --layout 2,1,2,1 --stages bf16:8 --tokens 0,0 --integration vllm --raw-passes")
    v = runner.run(no_leaks, sc, timeout_s=VLLM_TIMEOUT_S)
    assert v.known == ["VLLM-003"], [(f.invariant, f.evidence[:300]) for f in v.failures]


def test_vllm_integration_needs_dp_above_one():
    with pytest.raises(ScenarioInputError) as e:
        _parse("a2a-testbed run --layout 2,2,1,1 --stages bf16:16 --tokens 5 --integration vllm")
    assert e.value.flag == "--layout" and "use_all2all_kernels" in str(e.value)


@pytest.mark.needs("vllm")
@pytest.mark.parametrize("swizzled", [False, True])
def test_vllm_integration_scaled_fp4_quant_cpu_kernel(swizzled):
    """The CPU kernel behind vLLM's ``ops.scaled_fp4_quant`` (vLLM's own wrapper allocates and
    calls ``torch.ops._C.scaled_fp4_quant.out``) against the format's definition: values on the
    NVFP4 grid come back exactly, a global scale expanded per expert is read as the kernel reads
    it (its first element), and a bad shape or scales that differ name the rule."""
    from fakes.flashinfer.fused_moe.layouts import deinterleave_128x4
    from testbed.integrations.vllm import kernels
    from testbed.scenario.reference import NVFP4_GLOBAL_SCALE, dequantize, representable
    from vllm import _custom_ops as ops

    kernels.install(lambda undo: None)
    x = representable("nvfp4", 5, 64, torch.Generator().manual_seed(3))
    q, sf = ops.scaled_fp4_quant(x.to(torch.bfloat16), torch.tensor([NVFP4_GLOBAL_SCALE]),
                                 is_sf_swizzled_layout=swizzled)
    assert q.shape == (5, 32) and q.dtype == torch.uint8
    if swizzled:
        sf = deinterleave_128x4(sf.view(torch.uint8).reshape(-1), 5, 4)
    assert torch.equal(dequantize("nvfp4", q, sf, 64), x.float())
    per_expert = torch.tensor([NVFP4_GLOBAL_SCALE]).expand(4)  # vLLM's FlashInfer backends share one
    q4, sf4 = ops.scaled_fp4_quant(x.to(torch.bfloat16), per_expert, is_sf_swizzled_layout=False)
    assert torch.equal(dequantize("nvfp4", q4, sf4, 64), x.float())
    with pytest.raises(ValueError, match="one global scale"):
        torch.ops._C.scaled_fp4_quant.out(x.to(torch.bfloat16), torch.tensor([1.0, 2.0]), False,
                                          output=torch.empty(5, 32, dtype=torch.uint8),
                                          output_scale=torch.empty(5, 4, dtype=torch.uint8))


@pytest.mark.needs("vllm")
def test_vllm_integration_group_quant_fp8_stand_in():
    """The torch stand-in for vLLM's Triton per_token_group_quant_fp8 against the format's
    definition: blockwise-FP8-exact values come back exactly, with one fp32 scale per 128."""
    from testbed.integrations.vllm.kernels import per_token_group_quant_fp8
    from testbed.scenario.reference import dequantize, representable

    x = representable("fp8_block", 6, 256, torch.Generator().manual_seed(5))
    q, s = per_token_group_quant_fp8(x.to(torch.bfloat16), 128, use_ue8m0=False)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (6, 2) and s.dtype == torch.float32
    assert torch.allclose(dequantize("fp8_block", q, s, 256), x.float(), rtol=0, atol=1e-6 * x.abs().max().item())
    with pytest.raises(NotImplementedError, match="row-major"):
        per_token_group_quant_fp8(x, 128, column_major_scales=True)


def test_vllm_integration_routing_rides_in_the_logits():
    """The scenario's routing survives the logits it rides in, and a row of zeros (the SP
    chunk's padding) is routed as a gate routes a zero row."""
    from testbed.integrations.vllm.layer import handed_routing, routing_logits
    from testbed.scenario.reference import padding_routing

    ids = torch.tensor([[3, 0], [7, 5]], dtype=torch.int32)
    w = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    logits = torch.cat([routing_logits(ids, w), torch.zeros(1, 4)])
    got_w, got_ids = handed_routing(None, logits, 2, False)
    pad_ids, pad_w = padding_routing(2)
    assert torch.equal(got_ids, torch.cat([ids, pad_ids[None]])) and got_ids.dtype == torch.int32
    assert torch.equal(got_w, torch.cat([w, pad_w[None]]))


@pytest.mark.needs("vllm")
def test_vllm_integration_rules_are_the_releases_own():
    """The sequence-parallel rule is the installed release's ParallelConfig.use_sequence_parallel_moe
    (0.33: the one-sided backend at TP > 1 and DP > 1, never two-sided), and the formats its
    one-sided prepare builder dispatches are read from the error it raises for others (0.33 names
    DeepSeek's blockwise FP8 among them)."""
    from testbed.cluster.layout import ParallelLayout
    from testbed.integrations.vllm.rules import one_sided_dispatch_formats, sequence_parallel

    wide, tp1 = ParallelLayout.parse("4,2,2,1"), ParallelLayout.parse("4,1,4,1")
    assert sequence_parallel("one_sided", wide) and not sequence_parallel("two_sided", wide)
    assert not sequence_parallel("one_sided", tp1)
    assert set(one_sided_dispatch_formats()) == {"bf16", "mxfp8", "nvfp4", "fp8_block"}
