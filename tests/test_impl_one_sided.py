"""impl's one-sided path on the simulated cluster: workspace growth (seed 001), the rebuild
barrier's scope, combine_into and its probe (seed 000), checkpoints, bad input."""

from __future__ import annotations

import pytest
import torch

from impl_programs import (
    bad_initialize,
    checkpoint_cycle,
    finalize_ops,
    heterogeneous,
    run_layers_mutated,
    custom_combine,
    split_colors,
    wrong_layout,
)
from testbed.cluster.pool import RankFailedError, ScenarioTimeoutError
from testbed.cluster.layout import ParallelLayout
from testbed.integrations.impl.cases import MoECase, reference_output, run_layers

PROFILES = ["0.6.8", "0.7.2"]


def assert_matches_reference(case: MoECase, dp_rank: int, got: torch.Tensor) -> None:
    ref = reference_output(case, dp_rank)
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2 * scale)


def _pad(x: int) -> int:
    return -(-x // 128) * 128


def _layers(world: int, fmts, tokens=None, hidden=256, top_k=2):
    tokens = tokens or tuple(2 + r for r in range(world))
    return tuple(MoECase(num_experts=4 * world, top_k=top_k, hidden=hidden, tokens_per_dp=tokens, fmt=f, seed=i)
                 for i, f in enumerate(fmts))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("profile", PROFILES)
def test_one_sided_workspace_grows_for_heterogeneous_layers(cluster, world, profile):
    layers = _layers(world, ["nvfp4", "bf16", "nvfp4"])
    results = cluster.run(run_layers, ParallelLayout(world, dp=world), ((layers,),), {"profile": profile})
    H, K, M = 256, 2, layers[0].max_tokens
    for res in results:
        assert res.builds == [1, 2, 2]
        assert res.rebuilt == [True, True, False]
        nvfp4_ws, bf16_ws, last_ws = res.workspace_sizes
        # The payload regions grow by exactly the bf16-minus-nvfp4 dispatch bytes (aux unchanged).
        grow = _pad(world * M * (2 * H + 8 * K)) - _pad(world * M * (H // 2 + H // 16 + 8 * K))
        assert bf16_ws - nvfp4_ws == grow and last_ws == bf16_ws
        for case, out in zip(layers, res.outputs):
            assert_matches_reference(case, res.dp_rank, out)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("profile", PROFILES)
def test_one_sided_first_layer_workspace_overflows_in_combine(cluster, world, profile):
    layers = _layers(world, ["nvfp4", "bf16"])
    with pytest.raises(RankFailedError) as e:
        cluster.run(run_layers_mutated, ParallelLayout(world, dp=world), ("first-layer-workspace", (layers,)),
                    {"profile": profile})
    assert "workspace insufficient for combine payload region" in str(e.value)


PP_STAGES = (_layers(2, ["nvfp4", "bf16"]), _layers(2, ["nvfp4"]))


@pytest.mark.parametrize("profile", PROFILES)
def test_one_sided_rebuild_barrier_is_ep_scoped_under_pp(cluster, profile):
    layout = ParallelLayout(4, dp=2, pp=2)
    results = cluster.run(run_layers, layout, (PP_STAGES,), {"profile": profile}, timeout_s=60)
    for rank, res in enumerate(results):
        stage = layout.coords(rank).pp_rank
        assert res.builds == ([1, 2] if stage == 0 else [1])
        for case, out in zip(PP_STAGES[stage], res.outputs):
            assert_matches_reference(case, res.dp_rank, out)


def test_one_sided_world_barrier_deadlocks_under_pp(cluster):
    layout = ParallelLayout(4, dp=2, pp=2)
    with pytest.raises(ScenarioTimeoutError) as e:
        cluster.run(run_layers_mutated, layout, ("world-barrier-rebuild", PP_STAGES), {"forward": False},
                    timeout_s=8)
    stage0 = [r for r in range(4) if layout.coords(r).pp_rank == 0]
    assert e.value.stuck == stage0, str(e.value)
    assert e.value.finished == [r for r in range(4) if r not in stage0]
    assert "_barrier_after_build" in str(e.value)


@pytest.mark.parametrize("world", [2, 4])
def test_one_sided_combine_into_same_numbers_with_and_without_output(cluster, world):
    case = _layers(world, ["bf16"], tokens=(0,) + (3,) * (world - 1))[0]
    layout = ParallelLayout(world, dp=world)
    runs = {p: cluster.run(run_layers, layout, (((case,),),), {"profile": p}) for p in PROFILES}
    custom = {v: cluster.run(custom_combine, layout, (case, v)) for v in ("kwargs_only", "uninspectable")}
    for rank in range(world):
        assert runs["0.6.8"][rank].probe is False and runs["0.7.2"][rank].probe is True
        out = runs["0.7.2"][rank].outputs[0]
        assert torch.equal(out, runs["0.6.8"][rank].outputs[0])
        for variant, results in custom.items():
            assert results[rank]["probe"] is False, variant
            assert torch.equal(out, results[rank]["out"]), variant
        assert_matches_reference(case, rank, out)


def test_one_sided_combine_into_writes_output_in_place(cluster):
    """On 0.7.2 the integration hands ``output`` to combine and issues no op of its own
    (no temporary, no copy); on 0.6.8 the recorder sees its copy, so it can fail."""
    case = _layers(2, ["bf16"], tokens=(4, 3))[0]
    new = cluster.run(finalize_ops, ParallelLayout(2, dp=2), (case, "0.7.2"))
    old = cluster.run(finalize_ops, ParallelLayout(2, dp=2), (case, "0.6.8"))
    for rank in range(2):
        assert new[rank]["probe"] and new[rank]["same_storage"]
        assert new[rank]["ops"] == [], new[rank]["ops"]
        assert old[rank]["ops"] == ["aten.copy_.default"], old[rank]["ops"]
        assert torch.equal(new[rank]["out"], old[rank]["out"])
        assert_matches_reference(case, rank, new[rank]["out"])


def test_one_sided_unprobed_output_fails_on_old_flashinfer(cluster):
    layers = _layers(2, ["bf16"])
    with pytest.raises(RankFailedError, match="unexpected keyword argument 'output'"):
        cluster.run(run_layers_mutated, ParallelLayout(2, dp=2), ("unprobed-output", (layers,)), {"profile": "0.6.8"})


@pytest.mark.parametrize("what, match", [
    ("top_k", r"heterogeneous top_k across MoE layers \(got 4, was built with 2\)"),
    ("num_experts", r"heterogeneous num_experts across MoE layers \(got 16, was built with 8\)"),
])
def test_one_sided_manager_rejects_heterogeneous_layers(cluster, what, match):
    with pytest.raises(RankFailedError, match=match):
        cluster.run(heterogeneous, ParallelLayout(2, dp=2), (what,))


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_num_tokens=0, top_k=2, num_experts=8, hidden_size=64, x_bytes_per_token=128,
          x_sf_bytes_per_token=0), "max_num_tokens must be a positive int, got 0"),
    (dict(max_num_tokens=4, top_k=2.0, num_experts=8, hidden_size=64, x_bytes_per_token=128,
          x_sf_bytes_per_token=0), "top_k must be a positive int, got 2.0"),
    (dict(max_num_tokens=4, top_k=2, num_experts=8, hidden_size=64, x_bytes_per_token=128,
          x_sf_bytes_per_token=-1), "x_sf_bytes_per_token must be >= 0, got -1"),
])
def test_one_sided_manager_initialize_rejects_bad_sizes(cluster, kwargs, match):
    with pytest.raises(RankFailedError, match=match):
        cluster.run(bad_initialize, ParallelLayout(2, dp=2), (kwargs,))


def test_one_sided_layout_disagreeing_with_quantizer_is_named(cluster):
    case = _layers(2, ["nvfp4"])[0]
    with pytest.raises(RankFailedError, match=r"carry 128 \+ 16 bytes per token but the workspace was sized for 256 \+ 8"):
        cluster.run(wrong_layout, ParallelLayout(2, dp=2), (case, "mxfp8"))


@pytest.mark.parametrize("what, match", [
    ("weights_bf16", r"topk_weights must be fp32 \(3, 2\) \(the workspace is sized for 4-byte weights\)"),
    ("ids_int64", r"topk_ids must be int32 \[3, 2\], got torch.int64"),
    ("hidden", r"a1 must be \[tokens, 256\], got \(3, 240\)"),
    ("num_experts", r"num_experts=16 but this layer was built for 8"),
    ("router_weight_top_k_2", r"apply_router_weight_on_input is only implemented for top_k == 1; got top_k=2"),
])
def test_one_sided_prepare_rejects_bad_input(cluster, what, match):
    from impl_programs import bad_prepare

    case = _layers(2, ["bf16"], tokens=(3, 3))[0]
    with pytest.raises(RankFailedError, match=match):
        cluster.run(bad_prepare, ParallelLayout(2, dp=2), (case, what))


def test_one_sided_finalize_rejects_expert_output_of_the_wrong_size(cluster):
    from impl_programs import short_expert_output

    case = _layers(2, ["bf16"], tokens=(3, 3))[0]
    with pytest.raises(RankFailedError, match=r"fused_expert_output must be \[ep_size \* runtime_max_tokens_per_rank, "
                                              r"hidden\] = \[6, 256\] .*got \(5, 256\)"):
        cluster.run(short_expert_output, ParallelLayout(2, dp=2), (case,))


@pytest.mark.parametrize("how, rule", [
    ("copy", "the combine region itself"),
    ("dtype", "of dtype torch.bfloat16, got torch.float16"),
    ("shape", r"of shape \[6, 256\], got \[6, 128\]"),
    ("strided", "contiguous"),
])
def test_one_sided_workspace_output_refuses_another_buffer(cluster, how, rule):
    from impl_programs import wrong_workspace_output

    case = _layers(2, ["bf16"], tokens=(3, 3))[0]
    with pytest.raises(RankFailedError, match="fused_expert_output: the experts were handed the workspace's combine "
                                              f"region .*must be {rule}"):
        cluster.run(wrong_workspace_output, ParallelLayout(2, dp=2), (case, how))


def test_one_sided_workspace_output_accepts_the_region_itself(cluster):
    from impl_programs import wrong_workspace_output

    case = _layers(2, ["bf16"], tokens=(3, 3))[0]
    cluster.run(wrong_workspace_output, ParallelLayout(2, dp=2), (case, "region"))


def test_one_sided_ep_65_refused_as_the_real_kmaxranks_check(cluster):
    """65 EP ranks get through impl to the kernel, which refuses them as the real one does
    (the scenario model refuses them before running, naming kMaxRanks)."""
    case = MoECase(num_experts=65, top_k=2, hidden=256, tokens_per_dp=(1,) * 65)
    with pytest.raises(RankFailedError, match=r"RuntimeError: Check failed: \(epSize > 0 && epSize <= "
                                              r"tl_throughput::kMaxRanks\) is false: epSize must be in the range "
                                              r"\(0, 64\]"):
        cluster.run(run_layers, ParallelLayout(65, dp=65), (((case,),),), timeout_s=120)


@pytest.mark.parametrize("profile", ["0.6.8", "0.6.16", "0.7.2"])
@pytest.mark.parametrize("impl_barrier", [True, False], ids=["impl-barrier", "no-impl-barrier"])
def test_one_sided_late_initialize_erases_a_fast_peer_without_a_barrier(cluster, profile, impl_barrier, tmp_path):
    """Before 0.7.x MoeAlltoAll does not barrier after zeroing its row: without the
    integration's own EP barrier a fast peer's first dispatch is erased and the round fails;
    with it, or with 0.7.2's built-in one, the round completes. The schedule says what ordered
    the late zeroing: the barrier, entered from whichever code made it, or nothing (the fast
    peer's dispatch posted first)."""
    from impl_programs import late_initialize

    from testbed.harness import late_zeroing

    case = _layers(2, ["bf16"], tokens=(3, 3))[0]
    args = (case, profile, None if impl_barrier else "no-barrier-after-rebuild", str(tmp_path))
    if impl_barrier or profile == "0.7.2":
        cluster.run(late_initialize, ParallelLayout(2, dp=2), args, timeout_s=30)
        how = late_zeroing.released_by(str(tmp_path), 0)
        assert how.startswith("entered barrier on ranks [0,1] from impl/"), how
        # 0.7.2's set-up barriers through the caller's communicator first; before, impl's own barrier
        assert ("called from fakes/flashinfer/comm/trtllm_moe_alltoall.py" in how) == (profile == "0.7.2"), how
    else:
        with pytest.raises(RankFailedError, match="timed out after 2 s waiting for completion flag"):
            cluster.run(late_initialize, ParallelLayout(2, dp=2), args, timeout_s=30)
        assert late_zeroing.released_by(str(tmp_path), 0) == "posted its dispatch flags into its peers' rows"


def test_one_sided_checkpoint_prepare_restore(cluster):
    case = _layers(2, ["bf16"])[0]
    for rank, res in enumerate(cluster.run(checkpoint_cycle, ParallelLayout(2, dp=2), (case, "0.7.2"))):
        assert res["unmapped_error"] == "MNNVL handles are unmapped"
        assert torch.equal(res["before"], res["after"])
        assert_matches_reference(case, rank, res["after"])
    with pytest.raises(RankFailedError, match="FlashInfer 0.6.8 MoeAlltoAll has no checkpoint_prepare"):
        cluster.run(checkpoint_cycle, ParallelLayout(2, dp=2), (case, "0.6.8"))


def test_communicator_split_refuses_to_split_its_group(cluster):
    with pytest.raises(RankFailedError, match=r"passed colors \[0, 1\]"):
        cluster.run(split_colors, ParallelLayout(2, dp=2))


@pytest.mark.parametrize("first, corrupted", [("nvfp4", True), ("bf16", False)])
def test_one_sided_back_to_back_rounds_of_growing_payload_race(cluster, first, corrupted):
    """FlashInfer's protocol has no wait after combine. When the next round's dispatch payload
    is larger, its region reaches into the combine region a slow peer is still reading: rank 1,
    stalled in its first combine until rank 0 has written the next dispatch, reads rank 0's
    overwritten rows (nvfp4 then bf16). With equal rounds (bf16 then bf16) the regions do not
    overlap and the same stall is harmless. Why run_layers starts each forward with a collective."""
    from impl_programs import back_to_back_rounds

    layers = tuple(MoECase(num_experts=4, top_k=2, hidden=256, tokens_per_dp=(8, 8), fmt=f, seed=3 + i)
                   for i, f in enumerate([first, "bf16"]))
    outs = cluster.run(back_to_back_rounds, ParallelLayout(2, dp=2), (layers,), timeout_s=60)
    assert_matches_reference(layers[0], 0, outs[0][0])  # rank 0 was not slow
    for rank in range(2):
        assert_matches_reference(layers[1], rank, outs[rank][1])
    if corrupted:
        with pytest.raises(AssertionError, match="not close"):
            assert_matches_reference(layers[0], 1, outs[1][0])
    else:
        assert_matches_reference(layers[0], 1, outs[1][0])


@pytest.mark.parametrize("profile, kind", [("0.7.4", "one_sided"), ("0.7.2", "one_sided"), ("0.7.4", "two_sided")])
def test_moe_ep_one_communication_per_budget_and_cleanup_destroys_them(cluster, profile, kind):
    from impl_programs import moe_ep_layers_then_cleanup

    hidden = 512 if kind == "two_sided" else 256
    cases = tuple(MoECase(num_experts=8, top_k=2, hidden=hidden, tokens_per_dp=(3, 5), fmt=fmt, seed=i,
                          max_num_tokens=budget)
                  for i, (fmt, budget) in enumerate([("nvfp4", 8), ("bf16", 8), ("mxfp8", 16)]))
    results = cluster.run(moe_ep_layers_then_cleanup, ParallelLayout(2, dp=2), (cases, profile, kind), timeout_s=120)
    for rank, (builds, outputs, left, after) in enumerate(results):
        assert builds == 2  # budgets 8 and 16: the two 8-token layers share one
        for case, out in zip(cases, outputs):
            assert_matches_reference(case, rank, out)
        assert left == {}
        assert after is not None and "has been destroyed" in after, after
