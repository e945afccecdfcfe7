"""The scenario model, its command line, the integration matrix's make-up and the fuzzer.
The matrix itself runs whole, as it is and moved to the newest release, in the ``impl``
sweeps (``a2a-testbed sweep``), never here."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from testbed.cluster.layout import ParallelLayout
from testbed.harness import runner
from testbed.scenario.events import SharedMemoryCreated
from testbed.harness.fuzz import fuzz
from testbed.integrations.impl.fuzz import scenarios
from testbed.harness.matrix import MATRIX, on_release
from testbed.scenario.model import Layer, Scenario, ScenarioInputError, from_cli
from testbed.harness.report import failure_text


def _parse(line: str) -> Scenario:
    return from_cli(line)


@settings(max_examples=60)
@given(scenarios())
def test_scenario_to_cli_round_trips(sc):
    assert _parse(sc.to_cli()) == sc


@pytest.mark.parametrize("sc", MATRIX + tuple(on_release("0.7.2", "flashinfer")[0]), ids=lambda s: s.label)
def test_scenario_matrix_entries_round_trip(sc):
    assert _parse(sc.to_cli()) == sc


BASE = dict(layout=ParallelLayout(4, 2, 2, 1), stages=((Layer("nvfp4", 8),),), passes=((1, 2),))


@pytest.mark.parametrize("change, flag, rule", [
    (dict(top_k=33), "--top-k", "support top_k in 1..32"),
    (dict(top_k=10, experts=8, expert_kernel="trtllm", routing="hotspot", stages=((Layer("bf16", 8),),), hidden=256),
     "--top-k", "the TRT-LLM MoE kernels need top_k between 1 and num_experts (check_routing_common), got 10 > 8"),
    (dict(top_k=3), "--top-k", "one-sided kernels are instantiated for top_k in {1, 2, 4, 6, 8, 10, 12, 14, 16, "
                               "18, 22} (SWITCH_TOP_K), got 3"),
    (dict(top_k=3, profile="0.6.8"), "--top-k", "instantiated for top_k in {1, 2, 4, 6, 8, 10, 16, 22}"),
    (dict(hidden=200), "--hidden", "nvfp4 needs hidden divisible by 16"),
    (dict(path="two_sided", hidden=128), "--hidden", "16-byte units"),
    (dict(experts=3), "--experts", "num_experts >= ep_size"),
    (dict(profile="0.6.8", experts=6), "--experts", "divisible by ep_size"),
    (dict(passes=((1, 2, 3),)), "--tokens", "one count per DP rank"),
    (dict(passes=((1, 99),)), "--tokens", "exceed every layer's budget"),
    (dict(stages=((Layer("nvfp4", 8),), (Layer("bf16", 8),))), "--stages", "pp=1"),
    (dict(stages=((Layer("int4", 8),),)), "--stages", "must be one of"),
    (dict(path="two_sided", combine_signature="opaque"), "--combine-signature", "one_sided only"),
    (dict(routing="zipf"), "--routing", "must be one of"),
    (dict(router_weight_on_input=True), "--router-weight-on-input", "only defined for top_k == 1"),
    (dict(path="none"), "--path", "expert parallel off with dp > 1"),
    (dict(sequence_parallel=True, path="two_sided", hidden=512), "--sequence-parallel", "does not list"),
    (dict(defer_finalize=True), "--defer-finalize", "does not support deferred_finalize"),
    (dict(expert_output="workspace", combine_signature="opaque"), "--expert-output", "--combine-signature release"),
    (dict(expert_kernel="trtllm", hidden=192, stages=((Layer("bf16", 8),),)), "--hidden", "divisible by 128"),
    (dict(shared_experts=True, layout=ParallelLayout(4, 4, 1, 1), hidden=66, stages=((Layer("bf16", 8),),),
          passes=((1,),), path="allgather_reducescatter"), "--hidden", "66 % 4 != 0"),
    (dict(routed_scaling=float("nan")), "--routed-scaling", "finite number > 0"),
    (dict(invalid_expert_id="7"), "--invalid-expert-id", "must be one of"),
    (dict(top_k=3, a2a_api="moe_ep"), "--top-k", "instantiated for top_k in {1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22}"),
    (dict(profile="0.7.4", a2a_api="comm"), "--a2a-api", "0.7.4 does not ship flashinfer.comm.trtllm_moe_alltoall"),
    (dict(profile="0.6.16", a2a_api="moe_ep"), "--a2a-api", "0.6.16 does not ship flashinfer.moe_ep"),
    (dict(profile="0.7.4", experts=10), "--experts", "moe_ep needs num_experts divisible by the EP size (10 % 4"),
    (dict(a2a_api="moe_ep", combine_signature="kw-only"), "--combine-signature", "need --a2a-api comm"),
    (dict(path="allgather_reducescatter", a2a_api="comm"), "--a2a-api", "FlashInfer paths"),
    (dict(late_zeroing=True, path="two_sided", hidden=512), "--late-zeroing", "needs --path one_sided on MoeAlltoAll"),
    (dict(late_zeroing=True, a2a_api="moe_ep"), "--late-zeroing", "needs --path one_sided on MoeAlltoAll"),
    (dict(layout=ParallelLayout(65, 1, 65, 1), experts=130, passes=((1,) * 65,)), "--layout",
     "at most 64 EP ranks (kMaxRanks), the layout has 65"),
    (dict(layout=ParallelLayout(257, 1, 257, 1), experts=257, passes=((1,) * 257,), profile="0.7.4"), "--layout",
     "at most 256 EP ranks (kMaxRanks), the layout has 257"),
])
def test_scenario_rejects_bad_combination_naming_flag_and_rule(change, flag, rule):
    with pytest.raises(ScenarioInputError) as e:
        Scenario.make(**(BASE | change))
    assert e.value.flag == flag and rule in str(e.value)


# Sequence parallel needs TP > 1 (TP 1 is refused with that rule, see test_support); deferral
# is requested at TP 1 too, where the run checks it is not taken.
@pytest.mark.parametrize("tp, mode", [(1, "plain"), (2, "plain"), (4, "plain"), (2, "sequence-parallel"),
                                      (4, "sequence-parallel"), (1, "deferred"), (2, "deferred"), (4, "deferred")])
def test_scenario_layer_matches_reference_across_tp(cluster, tp, mode):
    """The layer against the dense reference on TP 1, 2 and 4, with and without sequence
    parallel and deferral."""
    dp = 1 if mode == "deferred" else 2
    sc = Scenario.make(layout=ParallelLayout(tp * dp, tp, dp, 1), stages=((Layer("bf16", 8), Layer("nvfp4", 8)),),
                       passes=((7,) * dp, (1,) * dp, (0,) * dp), path="none" if mode == "deferred" else "one_sided",
                       sequence_parallel=mode == "sequence-parallel", defer_finalize=mode == "deferred",
                       shared_experts=True, routed_scaling=2.0, seed=tp)
    verdict = runner.run(cluster, sc)
    assert verdict.passed, failure_text(verdict)


def test_scenario_matrix_covers_the_dimensions():
    """What the matrix promises (DESIGN: every path, format, profile; PP 2 with TP > 1; TP 4;
    0-token ranks and passes; stages that rebuild a different number of times)."""
    formats = {ly.fmt for sc in MATRIX for st in sc.stages for ly in st}
    assert formats == {"bf16", "nvfp4", "mxfp8", "fp8_block"}
    assert {sc.path for sc in MATRIX} == {"one_sided", "two_sided", "allgather_reducescatter", "none"}
    assert {sc.profile for sc in MATRIX} == {"0.6.8", "0.6.14", "0.6.16", "0.7.2", "0.7.4"}
    assert {(sc.path, sc.profile) for sc in MATRIX if sc.api == "moe_ep"} \
        >= {(p, r) for p in ("one_sided", "two_sided") for r in ("0.7.2", "0.7.4")}
    assert {sc.api for sc in MATRIX if sc.profile == "0.7.2" and sc.path != "none"} >= {"comm", "moe_ep"}
    assert {sc.combine_signature for sc in MATRIX} >= {"release", "kw-only", "kwargs-only", "positional-only",
                                                       "opaque"}
    assert {sc.routing for sc in MATRIX} == {"random", "spread", "local", "hotspot", "one-expert"}
    assert any(sc.layout.pp > 1 and sc.layout.tp > 1 for sc in MATRIX)
    assert any(sc.layout.tp == 4 for sc in MATRIX)
    assert {sc.path for sc in MATRIX if sc.router_weight_on_input} >= {"one_sided", "two_sided"}
    assert any(0 in p for sc in MATRIX for p in sc.passes)
    assert any(max(p) == 0 for sc in MATRIX for p in sc.passes)
    assert len({len({ly.max_num_tokens for ly in st}) > 1 for sc in MATRIX for st in sc.stages}) == 2
    assert {sc.path for sc in MATRIX if sc.sequence_parallel} == {"one_sided", "allgather_reducescatter"}
    assert any(sc.sequence_parallel and sc.layout.tp == 4 for sc in MATRIX)
    assert any(sc.sequence_parallel and sc.layout.pp > 1 for sc in MATRIX)
    assert {sc.layout.tp for sc in MATRIX if sc.defer_finalize} >= {1, 2, 4}
    assert {sc.path for sc in MATRIX if sc.expert_kernel != "reference"} >= {"one_sided", "two_sided", "none"}
    assert {sc.expert_kernel for sc in MATRIX} == {"reference", "trtllm", "trtllm-packed"}
    assert {ly.fmt for sc in MATRIX if sc.expert_kernel != "reference" for st in sc.stages for ly in st} \
        == {"bf16", "nvfp4", "fp8_block"}
    assert any(sc.expert_output == "workspace" for sc in MATRIX)
    assert any(sc.shared_experts and sc.routed_scaling != 1.0 for sc in MATRIX)
    assert {sc.invalid_expert_id for sc in MATRIX} == {"-1", "num_experts"}
    assert any(sc.ep_size == 64 and sc.experts == 256 and sc.top_k == 8 for sc in MATRIX)
    assert any(sc.ep_size > 64 and sc.api == "moe_ep" for sc in MATRIX)
    assert any(sc.ep_size % 2 and sc.experts % sc.ep_size for sc in MATRIX)
    assert len(MATRIX) >= 12


ON_0_7_4, REFUSED_ON_0_7_4 = on_release("0.7.4")


def test_scenario_matrix_on_0_7_4_refuses_with_the_rule():
    """The whole matrix moved to 0.7.4: every FlashInfer path on moe_ep; what 0.7.4 cannot
    run is refused with its rule (a custom combine signature, experts not divisible by the
    EP size), never dropped."""
    assert len(ON_0_7_4) + len(REFUSED_ON_0_7_4) == len(MATRIX)
    assert {sc.api for sc in ON_0_7_4 if sc.path in ("one_sided", "two_sided")} == {"moe_ep"}
    assert all("--combine-signature" in rule or "--experts" in rule for _, rule in REFUSED_ON_0_7_4), REFUSED_ON_0_7_4
    assert sum(sc.api == "moe_ep" for sc in ON_0_7_4) >= 12


def test_scenario_fuzz_bounded_derandomized(cluster):
    seen = []

    def check(sc):
        seen.append(sc)
        return runner.run(cluster, sc)

    fuzz(check, examples=6, strategy=scenarios())
    assert len(seen) == 6


def test_scenario_fuzz_find_empty_top1_payload_with_odd_strides(cluster):
    """Found by `a2a-testbed fuzz`: top_k 1 ids of a pass without tokens have strides (1, 0);
    torch calls them contiguous, so the kernel takes them, and the fake must too."""
    line = ("a2a-testbed run --layout 2,1,2,1 --path one_sided --profile 0.6.8 --experts 2 --top-k 1 "
            "--hidden 64 --stages bf16:1 --tokens 0,0 --routing local --seed 0")
    verdict = runner.run(cluster, _parse(line))
    assert verdict.passed, failure_text(verdict)


def test_scenario_runner_removes_posix_shm_the_ranks_left():
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=64)  # as a rank's vLLM message queue makes one
    shm.close()
    logs = {0: [SharedMemoryCreated("/" + shm.name)], 1: [SharedMemoryCreated("/" + shm.name)]}
    assert shm.name in runner._posix_shm_left(logs, counted=True)  # a completed scenario leaked it
    assert not (runner.SHM_DIR / shm.name).exists()
    shm = shared_memory.SharedMemory(create=True, size=64)
    shm.close()
    logs = {0: [SharedMemoryCreated("/" + shm.name)]}
    assert runner._posix_shm_left(logs, counted=False) == ""  # a killed rank's: removed, not blamed
    assert not (runner.SHM_DIR / shm.name).exists()
    assert runner._posix_shm_left(logs, counted=True) == ""  # gone already


# The review's holes, as scenarios (the fuzz strategy draws each dimension too).
HOLES = [
    ("top_k 10 with the reference experts, mxfp8 scales padded to 128",
     dict(top_k=10, experts=32, mx_alignment=128, hidden=96, stages=((Layer("mxfp8", 8), Layer("bf16", 8)),))),
    ("top_k 22 on the two-sided path, int64 router ids",
     dict(top_k=22, experts=32, path="two_sided", router_ids="int64", layout=ParallelLayout(4, 1, 4, 1),
          passes=((0, 5, 1, 3),))),
    ("top_k 10, TRT-LLM experts", dict(top_k=10, experts=32, expert_kernel="trtllm",
                                       stages=((Layer("nvfp4", 8), Layer("bf16", 8)),))),
]


@pytest.mark.parametrize("label, change", HOLES, ids=[h[0] for h in HOLES])
def test_scenario_review_holes_pass(cluster, label, change):
    base = dict(layout=ParallelLayout(4, 2, 2, 1), stages=((Layer("nvfp4", 8), Layer("bf16", 8)),), passes=((0, 5),))
    v = runner.run(cluster, Scenario.make(**{**base, **change}), timeout_s=60)
    assert v.passed, failure_text(v)


def test_scenario_trtllm_weight_global_scales_are_drawn():
    """The scales differ between experts and between w1 and w2, so a scale dropped or swapped
    changes the output (the mutants trtllm-w2-global-scale-of-w1 and trtllm-global-scale-dropped
    show that it does)."""
    from testbed.scenario.reference import swiglu_weights

    scales = {(w.gs1, w.gs2) for w in (swiglu_weights(0, 0, 0, e, "nvfp4", 256, 128) for e in range(16))}
    assert len(scales) > 4 and any(a != b for a, b in scales) and all(a >= 1 and b >= 1 for a, b in scales)
    assert swiglu_weights(0, 0, 0, 0, "bf16", 256, 128).gs1 == 1.0


def test_scenario_flags_are_the_fields_own_type_default_and_round_trip():
    """Every scalar scenario field is a flag of its own type, its help ends with the field's
    default, and a scenario differing from the defaults in every field round-trips through
    ``to_cli`` and the parser."""
    import argparse
    import dataclasses

    from testbed.scenario.model import FLAGS, Flag, add_arguments, from_cli

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    actions = {a.dest: a for a in parser._actions}
    for flag in FLAGS:
        assert isinstance(flag, Flag)
        field = next(f for f in dataclasses.fields(Scenario) if f.name == flag.name)
        action = actions[flag.name]
        assert action.default is None and flag.option in action.option_strings
        if field.type == "bool":
            assert action.nargs == 0 and field.default is False
        else:
            assert action.type is flag.kind and action.help.endswith(f"(default {'none' if field.default == '' else field.default})")
    sc = Scenario.make(layout=ParallelLayout.parse("2,1,2,1"), stages=((Layer("bf16", 8),),), passes=((3, 2),),
                       path="one_sided", experts=4, top_k=1, hidden=128, routing="spread", seed=7,
                       routed_scaling=2.5, shared_experts=True, slot_order="deterministic", router_ids="int64")
    line = sc.to_cli()
    assert from_cli(line) == sc
    assert "--integration" not in line and "--level" not in line  # written only where they differ
    assert " --routed-scaling 2.5 " in line and " --shared-experts" in line
