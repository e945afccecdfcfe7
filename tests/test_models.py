"""Real models: the presets against their published configuration, ``--model`` and its
overrides, the model matrix's make-up (its runs are the sweep ``models``), and the output
invariant's power at a real hidden size."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from testbed.harness import runner
from testbed.harness.matrix import MODEL_LAYOUT, ROTATION, model_scenario, on_models, rotated
from testbed.harness.report import failure_text
from testbed.scenario.model import ScenarioInputError, add_arguments, from_args
from testbed.scenario.models import MODELS, MTP_BUDGET


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


# transformers' configuration classes whose defaults are the model's own published numbers
# (Qwen3MoeConfig's and Glm4MoeConfig's are not: 24 layers, and GLM-4.5-Air's shape).
@pytest.mark.parametrize("name, cls, fields", [
    ("deepseek-v3", "DeepseekV3Config", {"hidden": "hidden_size", "experts": "n_routed_experts",
                                         "shared": "n_shared_experts", "top_k": "num_experts_per_tok",
                                         "routed_scaling": "routed_scaling_factor",
                                         "mtp_layers": "num_nextn_predict_layers"}),
    ("gpt-oss-120b", "GptOssConfig", {"hidden": "hidden_size", "experts": "num_local_experts",
                                      "top_k": "num_experts_per_tok", "moe_layers": "num_hidden_layers"}),
])
@pytest.mark.needs("transformers")
def test_models_preset_matches_transformers_config(name, cls, fields):
    import transformers

    config = getattr(transformers, cls)()
    shape = MODELS[name]
    for ours, theirs in fields.items():
        assert getattr(shape, ours) == getattr(config, theirs), (ours, theirs)
    if name == "deepseek-v3":
        assert shape.moe_layers == config.num_hidden_layers - config.first_k_dense_replace


def test_models_every_preset_is_a_valid_ep8_deployment():
    for shape in MODELS.values():
        assert shape.experts % 8 == 0 and shape.formats, shape.name
        sc = model_scenario(shape, shape.formats[0], "one_sided", "0.7.2")
        sc.validate()
        assert sum(layer.max_num_tokens == MTP_BUDGET for layer in sc.stages[-1]) == shape.mtp_layers


def test_model_flag_fills_the_shape_and_flags_override_it():
    sc = from_args(_args("--model", "deepseek-v3"), None)
    assert (sc.hidden, sc.experts, sc.top_k, sc.shared_experts, sc.routed_scaling) == (7168, 256, 8, True, 2.5)
    assert str(sc.layout) == "w8tp1dp8pp1" and [ly.fmt for ly in sc.stages[0]] == ["fp8_block", "fp8_block"]
    sc = from_args(_args("--model", "deepseek-v3", "--hidden", "512", "--stages", "bf16:8"), "4,1,4,1")
    assert (sc.hidden, sc.experts, str(sc.stages[0][0])) == (512, 256, "bf16:8")
    sc = from_args(_args("--model", "llama4-maverick"), None)
    assert sc.router_weight_on_input and sc.top_k == 1
    assert from_args(_args("--model", "gpt-oss-20b"), None).mx_alignment == 256


def test_model_flag_unknown_names_the_flag_and_the_models():
    with pytest.raises(ScenarioInputError, match=r"--model: must be one of deepseek-v3, .*got 'llama5'"):
        from_args(_args("--model", "llama5"), None)
    with pytest.raises(ValueError, match="unknown model 'llama5'"):
        on_models(("llama5",))


def test_model_matrix_has_every_model_path_and_release():
    scenarios, refused = on_models()
    assert len(scenarios) == 179 and not refused
    assert {str(sc.layout) for sc in scenarios} == {"w8tp1dp8pp1"} and MODEL_LAYOUT == "8,1,8,1"
    assert {sc.label.split()[0] for sc in scenarios} == set(MODELS)
    assert {sc.path for sc in scenarios} == {"one_sided", "two_sided", "allgather_reducescatter"}
    # the pin, and every other release with an all-to-all of its own
    assert {sc.profile for sc in scenarios} == {"0.6.3", "0.6.8", "0.6.14", "0.6.16", "0.7.0", "0.7.1", "0.7.2", "0.7.4"}


def test_model_matrix_rotation_keeps_the_pin_whole_and_meets_every_release():
    whole, _ = on_models()
    sample, refused = on_models(rotation=True)
    assert not refused and set(sample) <= set(whole)
    pinned = {sc for sc in whole if sc.profile == "0.7.2"}
    assert pinned <= set(sample)  # every model, format and path on the pin
    others = {sc.profile for sc in whole} - {"0.7.2"}
    met = {name: {sc.profile for sc in sample if sc.label.split()[0] == name} - {"0.7.2"} for name in MODELS}
    assert all(len(releases) == ROTATION for releases in met.values())
    for release in others:  # each release at least ROTATION models, on both all-to-all paths
        models = {sc.label.split()[0] for sc in sample if sc.profile == release}
        assert len(models) >= ROTATION
        assert {sc.path for sc in sample if sc.profile == release} == {"one_sided", "two_sided"}


@pytest.mark.parametrize("releases", [3, 5, 7, 8, 12])
@pytest.mark.parametrize("models", [1, 4, 9, 13])
def test_rotation_is_even_for_any_count(releases, models):
    names = tuple(f"r{j}" for j in range(releases))
    picks = [rotated(names, i) for i in range(models)]
    assert all(len(set(p)) == ROTATION for p in picks)
    if models >= releases:
        assert all(sum(r in p for p in picks) >= ROTATION for r in names)


def _factors(verdict) -> list[float]:
    """The output's projection on the reference per failing rank and layer, from the output
    invariant's evidence (every line it shows)."""
    (failure,) = verdict.failed("output")
    return [float(f) for f in re.findall(r"output ~ (\S+) x the reference", failure.evidence)]


def test_output_tells_a_double_reduce_a_dropped_weight_and_a_wrong_expert_apart(cluster):
    """At real hidden sizes the output invariant catches each bug and sees it as what it is:
    twice the reference (a double reduce over TP 2, DeepSeek-V3's 7168), more than it but not
    twice (Llama 4 Maverick's router weight on the input dropped: each expert sees the unscaled
    token, the shared expert's part unchanged), and far from it (Qwen3-30B-A3B's experts given
    the wrong first local expert: other experts compute the rows)."""
    def caught(sc, mutant):
        sc.validate()
        assert runner.run(cluster, sc, timeout_s=60).passed
        factors = _factors(runner.run(cluster, sc, mutant=mutant, timeout_s=60))
        assert factors
        return factors

    double = caught(model_scenario(MODELS["deepseek-v3"], "bf16", "one_sided", "0.7.2", layout="8,2,4,1",
                                   passes=("16,3,0,9",)), "double-reduce-one-sided")
    assert all(1.9 < f < 2.1 for f in double), double
    unweighted = caught(model_scenario(MODELS["llama4-maverick"], "bf16", "one_sided", "0.7.2"),
                        "router-weight-not-applied")
    assert all(1.02 < f < 1.9 for f in unweighted), unweighted
    qwen = model_scenario(MODELS["qwen3-30b-a3b"], "bf16", "one_sided", "0.7.2", passes=("9,0,3,1,2,5,1,4",))
    wrong = caught(dataclasses.replace(qwen, expert_kernel="trtllm"), "trtllm-offset-zero")
    assert all(f < 0.9 for f in wrong), wrong


def test_gpt_oss_unpadded_mxfp8_refused_only_where_moealltoall_fails():
    """2880 mxfp8 values and 90 scales (2970 bytes, 2 mod 4) before the int32 ids: MoeAlltoAll's
    host check fails each step whose ep_size * runtime max is odd, so only an odd EP size is
    refused (with the rule); at EP 8 the kernels take it, padded (vLLM's 256) or not."""
    shape = MODELS["gpt-oss-120b"]
    for alignment in (0, 256):
        dataclasses.replace(model_scenario(shape, "mxfp8", "one_sided", "0.7.2"), mx_alignment=alignment).validate()
    odd = dataclasses.replace(model_scenario(shape, "mxfp8", "one_sided", "0.7.2", layout="3,1,3,1",
                                             passes=("1,2,3",)), experts=6, mx_alignment=0)
    with pytest.raises(ScenarioInputError, match=r"--hidden: the one-sided dispatch at an odd EP size \(3\) needs "
                                                 r"mxfp8 values \+ scales of a token \(2970 bytes at hidden 2880\)"):
        odd.validate()
    dataclasses.replace(odd, mx_alignment=256).validate()


@pytest.mark.needs("vllm")
def test_model_matrix_under_an_engine_is_built_as_the_engine_builds_it(cluster):
    """Under vLLM every layer, the MTP layer too, takes the scheduler's one budget and vLLM's
    quant method decides the mxfp8 padding; the release is vLLM's pin. DeepSeek-V3's fp8 blocks
    one-sided then pass through vLLM's own MoE layer at hidden 7168."""
    scenarios, refused = on_models(("deepseek-v3", "gpt-oss-20b"), "vllm")
    assert {sc.profile for sc in scenarios} == {"0.7.2.post1"}
    assert all(len({ly.max_num_tokens for st in sc.stages for ly in st}) == 1 for sc in scenarios)
    assert all(sc.mx_alignment == 0 for sc in scenarios) and refused
    (fp8,) = [sc for sc in scenarios if sc.label == "deepseek-v3 fp8_block one_sided on 0.7.2.post1"]
    assert [str(ly) for ly in fp8.stages[0]] == ["fp8_block:16", "fp8_block:16"]
    v = runner.run(cluster, fp8, timeout_s=120)
    assert v.passed and not v.known, failure_text(v)
