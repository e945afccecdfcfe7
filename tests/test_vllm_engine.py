"""The engine level: vLLM's own ``LLM`` (external launcher, DP + EP) on a tiny checkpoint
the testbed writes, judged by the round invariants, the step rule and prompt logprobs against
a DP 1, expert-parallel-off run; and the pieces it stands on (the CPU kernels for vLLM's compiled
ops, the checkpoint, the engine scenario), checked without vLLM against their definitions."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from testbed.cli import main
from testbed.harness import engine
from testbed.integrations.vllm import engine_kernels as k
from testbed.integrations.vllm.matrix import ENGINE_MATRIX
from testbed.scenario import checkpoint
from testbed.scenario.engine import EngineScenario, parse_prompts
from testbed.scenario.model import ScenarioInputError

ENGINE_TIMEOUT_S = 150.0


def _entry(label_piece: str) -> EngineScenario:
    return next(es for es in ENGINE_MATRIX if label_piece in es.label)


# -- the engine, run (its whole matrix is the sweep `vllm engine matrix`) -------------------------
@pytest.mark.needs("vllm")
@pytest.mark.parametrize("mutant, entry, invariant", [
    ("r-routed-scale-dropped", "DeepSeek-V2", "logprobs"),
    ("r-shared-reduced-under-sp", "DeepSeek-V2 block's shared expert", "reduce"),
])
def test_engine_catches_a_mutant_of_vllm(no_leaks, mutant, entry, invariant):
    """The engine run has the power to catch what a layer run catches: a lost routed scaling
    moves the logprobs (nothing else sees it at this level); the runner all-reducing the
    shared expert vLLM's model replicated under sequence parallel fails the round invariant
    (and moves the logprobs)."""
    v = engine.run(no_leaks, _entry(entry), mutant=mutant, timeout_s=ENGINE_TIMEOUT_S)
    assert any(f.invariant == invariant for f in v.failures), engine.failure_text(v)


@pytest.mark.needs("vllm")
def test_engine_runs_a_real_model_shape_through_its_familys_block(no_leaks):
    """DeepSeek-V3's MoE shape (hidden 7168, 256 experts, top_k 8) on one layer in the
    deepseek-v2 architecture: vLLM's own DeepseekV2MoE decides the shared expert and the
    scaling (2.5, the model's), DP 2 + EP one-sided on the fake, against the DP 1 run."""
    es = EngineScenario(dp=2, prompts=((5, 11), (7,)), max_tokens=(3, 2), arch="deepseek-v2", model="deepseek-v3")
    v = engine.run(no_leaks, es, timeout_s=ENGINE_TIMEOUT_S)
    assert v.passed and not v.known, engine.failure_text(v)
    sc = v.scenario
    assert (sc.hidden, sc.experts, sc.top_k, sc.shared_experts, sc.routed_scaling) == (7168, 256, 8, True, 2.5)
    assert v.events["dispatch"] == v.events["combine"] == v.events["forward"] >= 2 * es.layout.world_size


def test_engine_model_names_what_it_can_build():
    with pytest.raises(ScenarioInputError, match=r"--model: the engine level writes checkpoints of deepseek-v3, "
                                                 r"deepseek-r1, kimi-k2, qwen3-235b-a22b, qwen3-30b-a3b .*'gpt-oss-120b'"):
        EngineScenario(dp=2, prompts=((5,), (7,)), max_tokens=(1, 1), model="gpt-oss-120b")
    with pytest.raises(ScenarioInputError, match=r"--arch: qwen3-30b-a3b is a qwen3-moe checkpoint"):
        EngineScenario(dp=2, prompts=((5,), (7,)), max_tokens=(1, 1), model="qwen3-30b-a3b", arch="deepseek-v2")
    ck = EngineScenario(dp=2, prompts=((5,), (7,)), max_tokens=(1, 1), model="qwen3-30b-a3b").checkpoint()
    assert (ck.hidden, ck.experts, ck.top_k, ck.layers, ck.head_dim, ck.shared_experts) == (2048, 128, 8, 1, 128, 0)


def test_engine_steps_the_model_would_change_fail():
    """A forward context giving a DP rank 0 tokens is what vLLM's step rule says cannot
    happen: the engine run then fails ``engine-steps`` instead of judging rounds the scenario
    model would not make."""
    es = _entry("DP 2 + EP, one-sided")
    results = [{"prepares": [(0, 5, (5, 1)), (0, 3, (3, 0))], "generate_from": 0},
               {"prepares": [(0, 1, (5, 1)), (0, 0, (3, 0))], "generate_from": 0}]
    v = engine.EngineVerdict(es)
    sc = engine.rounds_scenario(es, {0: [], 1: []}, results, v)
    assert sc.passes == ((5, 1), (3, 0)) and sc.raw_passes
    assert [f.invariant for f in v.failures] == ["engine-steps"]
    assert "step rule" in v.failures[0].evidence and "[1]" in v.failures[0].evidence


def test_engine_ranks_disagreeing_on_a_forward_fail():
    es = _entry("DP 2 + EP, one-sided")
    results = [{"prepares": [(0, 5, (5, 1))], "generate_from": 0},
               {"prepares": [(0, 1, (5, 2))], "generate_from": 0}]
    v = engine.EngineVerdict(es)
    assert engine.rounds_scenario(es, {0: [], 1: []}, results, v) is None
    assert v.failures[0].invariant == "engine-steps" and "rank 1" in v.failures[0].evidence


def test_engine_logprobs_beyond_the_tolerance_fail():
    es = _entry("DP 2 + EP, one-sided")
    reference = [[-1.0] * (n - 1) for d in range(es.dp) for n in es.prompts[d]]
    results = [{"logprobs": [list(r) for r in reference[:2]]}, {"logprobs": [list(reference[2])]}]
    results[1]["logprobs"][0][3] += 2 * engine.LOGPROB_TOLERANCE[es.dtype]
    v = engine.EngineVerdict(es)
    engine._logprobs(es, results, reference, v)
    assert [f.invariant for f in v.failures] == ["logprobs"]
    assert "rank 1 (DP 1) prompt 0 token 4" in v.failures[0].evidence


# -- the command ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--dp", "2", "--prompts", "5", "--max-tokens", "1,1"], "--prompts: one prompt list"),
    (["--dp", "2", "--prompts", "5 x", "--max-tokens", "1,1"], "--prompts: per DP rank"),
    (["--dp", "2", "--prompts", "5 1", "--max-tokens", "1,1"], "--prompts: a prompt is 2 tokens"),
    (["--dp", "2", "--prompts", "- -", "--max-tokens", "1,1"], "at least one DP rank"),
    (["--dp", "2", "--prompts", "5 6", "--max-tokens", "1,a"], "--max-tokens: comma-separated"),
    (["--dp", "2", "--prompts", "5 6", "--max-tokens", "1,1", "--path", "none"], "--path: the engine runs"),
    (["--dp", "2", "--prompts", "5 6", "--max-tokens", "1,1", "--dtype", "fp8"], "--dtype"),
    (["--dp", "2", "--prompts", "5 6", "--max-tokens", "1,1", "--arch", "llama"], "--arch"),
    (["--dp", "2"], "--dp: give --prompts and --max-tokens"),
    (["--prompts", "5 6"], "--prompts goes with --dp"),
    (["--integration", "impl"], "has no engine level"),
    (["--mutant", "nope"], "--mutant: unknown vllm mutant"),
])
def test_engine_command_refuses_bad_input_in_one_line(capsys, argv, message):
    assert main(["engine", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_engine_scenario_reproduces_from_its_line(monkeypatch):
    import shlex

    seen = []
    monkeypatch.setattr(engine, "run", lambda pool, es, **kw: seen.append(es) or engine.EngineVerdict(es))
    monkeypatch.setattr("testbed.commands.common.need_engine", lambda *a, **k: None)
    es = dataclasses.replace(_entry("TP 2"), label="")
    assert main(shlex.split(es.to_cli())[1:]) == 0
    assert seen == [es]


def test_engine_prompts_rebuild_on_every_rank():
    es = _entry("DP 4")
    assert [len(p) for d in range(es.dp) for p in es.prompt_ids(d)] == [n for rank in es.prompts for n in rank]
    assert es.prompt_ids(3) == dataclasses.replace(es).prompt_ids(3)
    ids = [t for d in range(es.dp) for p in es.prompt_ids(d) for t in p]
    assert min(ids) >= 3 and max(ids) < es.checkpoint().vocab and len(set(ids)) > len(ids) // 2
    assert parse_prompts("5,11 - 7") == ((5, 11), (), (7,))
    with pytest.raises(ScenarioInputError):
        EngineScenario(dp=2, prompts=((5,), (300,)), max_tokens=(1, 1))


# -- the checkpoint --------------------------------------------------------------------------------
@pytest.mark.needs("safetensors")
@pytest.mark.parametrize("arch", checkpoint.ARCHITECTURES)
def test_engine_checkpoint_is_its_config(tmp_path, arch):
    from safetensors.torch import load_file

    ck = checkpoint.Checkpoint(arch=arch)
    written = load_file(checkpoint.write(ck, str(tmp_path)) + "/model.safetensors")
    assert {n: tuple(t.shape) for n, t in written.items()} == checkpoint.shapes(ck)
    assert all(t.dtype == torch.bfloat16 for t in written.values())
    experts = {n for n in written if ".mlp.experts." in n}
    assert len(experts) == 3 * ck.experts * ck.layers
    assert any("shared_experts" in n for n in written) == (arch == "deepseek-v2")
    # Every expert differs from every other (a swapped expert must move the logprobs).
    w = [written[f"model.layers.0.mlp.experts.{e}.down_proj.weight"] for e in range(ck.experts)]
    assert all(not torch.equal(w[a], w[b]) for a in range(len(w)) for b in range(a))
    again = checkpoint.weights(ck)
    assert all(torch.equal(again[n], written[n]) for n in written)


# -- the CPU kernels for vLLM's compiled ops, against their definitions ------------------------------
def _paged(lengths, heads=4, groups=2, dim=32, size=32, seed=0):
    """Per request its keys / values ``[L, G, D]`` scattered over shuffled cache blocks."""
    g = torch.Generator().manual_seed(seed)
    blocks_per = [-(-n // size) for n in lengths]
    order = torch.randperm(sum(blocks_per) + 2, generator=g).tolist()
    table = torch.zeros(len(lengths), max(blocks_per), dtype=torch.int32)
    kv = [(torch.randn(n, groups, dim, generator=g), torch.randn(n, groups, dim, generator=g)) for n in lengths]
    key_cache = torch.zeros(len(order), groups, size, dim)
    value_cache = torch.zeros_like(key_cache)
    used = iter(order)
    for r, n in enumerate(lengths):
        for b in range(blocks_per[r]):
            table[r, b] = next(used)
        slots = torch.tensor([int(table[r, p // size]) * size + p % size for p in range(n)])
        k.cpu_attn_reshape_and_cache(kv[r][0], kv[r][1], key_cache, value_cache, slots, "vec")
    return kv, table, key_cache, value_cache


@pytest.mark.parametrize("window", [-1, 3])
def test_engine_kernels_attention_is_causal_attention_over_the_paged_cache(window):
    lengths, queries, heads, dim = [7, 40, 1], [3, 40, 1], 4, 32
    kv, table, key_cache, value_cache = _paged(lengths, heads=heads, dim=dim)
    q = torch.randn(sum(queries), heads, dim, generator=torch.Generator().manual_seed(1))
    starts = torch.tensor([0] + list(torch.tensor(queries).cumsum(0)), dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    meta = k.get_scheduler_metadata(3, heads, 2, dim, torch.tensor(lengths), torch.float32, starts, True, window,
                                    "vec", True, None)
    k.cpu_attention_with_kv_cache(q, key_cache, value_cache, out, starts, torch.tensor(lengths, dtype=torch.int32),
                                  dim ** -0.5, True, None, window, table, 0.0, meta, None, None)
    for r, (n, t) in enumerate(zip(lengths, queries)):
        keys, values = (x.repeat_interleave(2, dim=1) for x in kv[r])  # GQA: 2 query heads per KV head
        for i in range(t):
            pos = n - t + i
            lo = 0 if window < 0 else max(0, pos - window)
            scores = torch.einsum("hd,lhd->hl", q[starts[r] + i], keys[lo:pos + 1]) / math.sqrt(dim)
            want = torch.einsum("hl,lhd->hd", scores.softmax(-1), values[lo:pos + 1])
            torch.testing.assert_close(out[starts[r] + i], want, rtol=1e-5, atol=1e-5)


def test_engine_kernels_slot_mapping_pads_past_the_step():
    table = torch.tensor([[5, 2], [7, 0]], dtype=torch.int32)
    slots = torch.zeros(8, dtype=torch.int64)
    k.compute_slot_mapping_kernel_impl(torch.tensor([0, 3, 5], dtype=torch.int32),
                                       torch.tensor([30, 31, 32, 0, 1, 99, 99, 99]), table, slots, 32)
    assert slots.tolist() == [5 * 32 + 30, 5 * 32 + 31, 2 * 32, 7 * 32, 7 * 32 + 1, -1, -1, -1]


def test_engine_kernels_refuse_what_they_do_not_compute():
    kv, table, key_cache, value_cache = _paged([4])
    q, out = torch.zeros(1, 4, 32), torch.zeros(1, 4, 32)
    args = (q, key_cache, value_cache, out, torch.tensor([0, 1]), torch.tensor([4]), 1.0, True)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        k.cpu_attention_with_kv_cache(*args, torch.ones(4), -1, table, 0.0, None, None, None)
    with pytest.raises(NotImplementedError, match="softcap"):
        k.cpu_attention_with_kv_cache(*args, None, -1, table, 30.0, None, None, None)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype 'fp8'"):
        k.cpu_attn_reshape_and_cache(q, q, key_cache, value_cache, torch.tensor([0]), "vec", kv_cache_dtype="fp8")


def test_engine_kernels_register_under_vllms_schemas():
    k.register()
    assert torch.ops._C.greedy_argmax(torch.tensor([[0.0, 2.0, 2.0], [3.0, 1.0, 0.0]])).tolist() == [1, 0]
    assert torch.ops._C.cpu_attn_has_isa("vec") and not torch.ops._C.cpu_attn_has_isa("amx")
    torch.ops._C.init_cpu_memory_env([0])
    slots = torch.zeros(2, dtype=torch.int64)
    torch.ops._C.compute_slot_mapping_kernel_impl(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([3, 0]),
                                                  torch.tensor([[4]], dtype=torch.int32), slots, 32)
    assert slots.tolist() == [4 * 32 + 3, -1]
    schema = str(torch.ops._C.cpu_attention_with_kv_cache.default._schema)
    assert "SymInt sliding_window_size" in schema and "Tensor(a3!) output" in schema


# -- the standalone CPU runner's ops (vLLM 0.34 on a CPU without Triton) -------------------------
def test_runner_kernels_prefill_inputs_and_positions_follow_each_request_row():
    from testbed.integrations.vllm import runner_kernels as rk

    # Two requests in rows 2 and 0: row 2 prefills tokens 1..3 of its 5-token prompt, row 0 decodes.
    all_ids = torch.arange(100, 140).view(4, 10)
    idx, qsl = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([0, 3, 4], dtype=torch.int32)
    prefill, done = torch.tensor([3, 0, 5, 0], dtype=torch.int32), torch.tensor([4, 0, 1, 0], dtype=torch.int32)
    input_ids, lookahead = torch.full((4,), -7), torch.full((2, 4), -7)
    rk.prepare_prefill_inputs_cpu(input_ids, lookahead, idx, qsl, all_ids, prefill, done)
    assert input_ids.tolist() == [121, 122, 123, -7]  # row 0 is past its prompt: its slot is the sampler's
    assert lookahead[:, 2].tolist() == [124, 0] and lookahead[:, 0].tolist() == [-7, -7]
    pos, seq_lens = torch.zeros(4, dtype=torch.int64), torch.full((4,), 9, dtype=torch.int32)
    rk.prepare_pos_seq_lens_cpu(idx, qsl, done, pos, seq_lens)
    assert pos.tolist() == [1, 2, 3, 4] and seq_lens.tolist() == [4, 5, 0, 0]


def test_runner_kernels_sampled_token_enters_a_decode_step_and_post_update_appends_it():
    from testbed.integrations.vllm import runner_kernels as rk

    idx, qsl = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([0, 3, 4], dtype=torch.int32)
    input_ids = torch.tensor([11, 12, 13, -1])
    last = torch.tensor([50, 60], dtype=torch.int32)
    indices = rk.combine_sampled_and_draft_tokens_cpu(
        input_ids, idx, last, qsl, torch.tensor([3, 6], dtype=torch.int32), torch.tensor([5, 3], dtype=torch.int32),
        torch.zeros(2, 0, dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32), 2, 1)
    assert indices.tolist() == [2, 3] and input_ids.tolist() == [11, 12, 13, 50]
    with pytest.raises(NotImplementedError, match="draft tokens"):
        rk.combine_sampled_and_draft_tokens_cpu(input_ids, idx, last, qsl, torch.tensor([3, 6]), torch.tensor([5, 3]),
                                                torch.zeros(2, 1, dtype=torch.int32), torch.tensor([0, 1, 3]), 3, 1)
    all_ids, total = torch.zeros(2, 8, dtype=torch.int64), torch.tensor([6, 3], dtype=torch.int32)
    done, counts = torch.tensor([5, 0], dtype=torch.int32), torch.zeros(2, 80, dtype=torch.int32)
    rk.post_update_cpu(idx, done, last, counts, torch.tensor([[71], [72]]), torch.tensor([1, 1]),
                       torch.tensor([0, 0]), qsl, all_ids, total)
    assert last.tolist() == [72, 71] and total.tolist() == [7, 4] and done.tolist() == [6, 3]
    assert all_ids[0, 6] == 72 and all_ids[1, 3] == 71 and counts[0, 72] == 1 and counts[1, 71] == 1


def test_runner_kernels_block_tables_slots_and_prompt_logprob_targets():
    from testbed.integrations.vllm import runner_kernels as rk

    table = torch.tensor([[5, 2, 9], [7, 1, 3]], dtype=torch.int32)
    out = torch.full((3, 3), -1, dtype=torch.int32)
    rk.gather_block_table_cpu(table, out, torch.tensor([1, 0], dtype=torch.int32), torch.tensor([2, 1]), 3)
    assert out.tolist() == [[7, -1, -1], [5, 2, -1], [0, 0, 0]]  # num_blocks is per request row
    slots = torch.zeros(6, dtype=torch.int64)
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    rk.compute_slot_mapping_cpu(table, slots, torch.tensor([0, -1], dtype=torch.int32), qsl,
                                torch.tensor([15, 16, 0, 0, 0, 0]), 16, True, -1)
    assert slots.tolist() == [5 * 16 + 15, 2 * 16, -1, -1, -1, -1]
    rk.compute_slot_mapping_cpu(table, slots, torch.tensor([0, 1], dtype=torch.int32), qsl,
                                torch.tensor([15, 16, 0, 0, 0, 0]), 16, False, -1)
    assert slots.tolist() == [-1] * 6
    all_ids = torch.arange(20).view(2, 10)
    targets = rk.get_prompt_logprobs_token_ids_cpu(3, qsl, torch.tensor([1, 0], dtype=torch.int32),
                                                   torch.tensor([4, 0], dtype=torch.int32), all_ids)
    assert targets.tolist() == [11, 12, 5]
    logits = torch.tensor([[0.0, 3.0, 3.0], [1.0, 0.0, 0.0]])
    greedy = rk.gumbel_sample_cpu(logits, torch.tensor([0, 1]), torch.zeros(2), torch.zeros(2), torch.zeros(2),
                                  True, False, False)
    assert greedy.tolist() == [1, 0]
    with pytest.raises(NotImplementedError, match="greedily"):
        rk.gumbel_sample_cpu(logits, torch.tensor([0, 1]), torch.tensor([0.0, 0.7]), torch.zeros(2), torch.zeros(2),
                             True, False, False)
