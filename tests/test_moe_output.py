"""The MoE output contract (seed 004): each broken field is a ValueError naming it, and the one
consumer (top-k reduce, routed scaling, shared add, TP all-reduce) against a dense loop."""

from __future__ import annotations

import pytest
import torch

from impl.moe_output import MoEOutput, UnfinalizedMoEOutput, finalize_moe_output, topk_reduce

T, K, H, P = 3, 2, 8, 8
BF16 = torch.bfloat16


def _unfinalized(seed=0) -> UnfinalizedMoEOutput:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(P, generator=g)[: T * K].to(torch.int32).view(T, K)
    perm[1, 0] = -1  # an expert on another rank
    return UnfinalizedMoEOutput(torch.randn(P, H, generator=g).to(BF16), torch.rand(T, K, generator=g).to(BF16), perm)


def _dense_topk(u: UnfinalizedMoEOutput) -> torch.Tensor:
    out = torch.zeros(T, H)
    for t in range(T):
        for k in range(K):
            if u.expanded_idx_to_permuted_idx[t, k] >= 0:
                out[t] += u.expert_weights[t, k].float() * u.gemm2_permuted[u.expanded_idx_to_permuted_idx[t, k]].float()
    return out


def _finalize(out: MoEOutput, num_tokens: int = T) -> torch.Tensor:
    return finalize_moe_output(out, activation_dtype=BF16, num_tokens=num_tokens, top_k=K, hidden=H, tp_group=None,
                               reduce=True)


def test_moe_output_topk_reduce_matches_dense_loop():
    u = _unfinalized()
    torch.testing.assert_close(topk_reduce(u), _dense_topk(u))


@pytest.mark.parametrize("unfinalized", [True, False])
def test_moe_output_consumer_scales_routed_before_the_shared_add(unfinalized):
    u = _unfinalized(1)
    routed = u if unfinalized else _dense_topk(u).to(BF16)
    shared = torch.randn(T, H).to(BF16)
    got = _finalize(MoEOutput(routed, shared, 2.5))
    want = 2.5 * (_dense_topk(u) if unfinalized else routed.float()) + shared.float()
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    assert got.dtype == BF16 and got.shape == (T, H)


def test_moe_output_zero_token_rank_returns_the_empty_finalized_tensor():
    assert _finalize(MoEOutput(torch.zeros(0, H, dtype=BF16)), num_tokens=0).shape == (0, H)
    empty = UnfinalizedMoEOutput(torch.zeros(0, H, dtype=BF16), torch.zeros(0, K, dtype=BF16),
                                 torch.zeros(0, K, dtype=torch.int32))
    with pytest.raises(ValueError, match="routed: a rank with 0 tokens must return the finalized"):
        _finalize(MoEOutput(empty), num_tokens=0)


def _broken(field: str):
    u = _unfinalized(2)
    change = {
        "gemm2_dtype": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted.float(), u.expert_weights,
                                                     u.expanded_idx_to_permuted_idx), None),
        "gemm2_hidden": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted[:, :4], u.expert_weights,
                                                      u.expanded_idx_to_permuted_idx), None),
        "gemm2_layout": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted.t().contiguous().t(), u.expert_weights,
                                                      u.expanded_idx_to_permuted_idx), None),
        "weights_dtype": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted, u.expert_weights.float(),
                                                       u.expanded_idx_to_permuted_idx), None),
        "weights_shape": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted, u.expert_weights[:, :1],
                                                       u.expanded_idx_to_permuted_idx), None),
        "map_dtype": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted, u.expert_weights,
                                                   u.expanded_idx_to_permuted_idx.long()), None),
        "map_flat": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted, u.expert_weights,
                                                  u.expanded_idx_to_permuted_idx.flatten()), None),
        "map_range": lambda: (UnfinalizedMoEOutput(u.gemm2_permuted, u.expert_weights,
                                                   u.expanded_idx_to_permuted_idx + P), None),
        "routed_dtype": lambda: (torch.zeros(T, H), None),
        "routed_shape": lambda: (torch.zeros(T + 1, H, dtype=BF16), None),
        "routed_type": lambda: ([[0.0] * H] * T, None),
        "shared_dtype": lambda: (u, torch.zeros(T, H)),
        "shared_shape": lambda: (u, torch.zeros(T, H - 1, dtype=BF16)),
    }[field]
    return change()


@pytest.mark.parametrize("field, message", [
    ("gemm2_dtype", "gemm2_permuted must be in the activation dtype"),
    ("gemm2_hidden", r"gemm2_permuted must be \[rows, hidden=8\]"),
    ("gemm2_layout", "gemm2_permuted must be contiguous along hidden"),
    ("weights_dtype", "expert_weights must match the activation dtype"),
    ("weights_shape", r"expert_weights must be \[num_tokens, top_k\] = \[3, 2\]"),
    ("map_dtype", "expanded_idx_to_permuted_idx must be int32"),
    ("map_flat", r"expanded_idx_to_permuted_idx must be \[num_tokens, top_k\]"),
    ("map_range", "expanded_idx_to_permuted_idx must be -1 or a row of gemm2_permuted"),
    ("routed_dtype", "routed must be in the activation dtype"),
    ("routed_shape", r"routed must be \[num_tokens, hidden\] = \[3, 8\]"),
    ("routed_type", "routed must be a tensor or an UnfinalizedMoEOutput"),
    ("shared_dtype", "shared_output must be in the activation dtype"),
    ("shared_shape", r"shared_output must be \[num_tokens, hidden\]"),
])
def test_moe_output_rejects_each_broken_field(field, message):
    routed, shared = _broken(field)
    with pytest.raises(ValueError, match=message):
        _finalize(MoEOutput(routed, shared))


@pytest.mark.parametrize("factor", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_moe_output_rejects_a_bad_routed_scaling_factor(factor):
    with pytest.raises(ValueError, match="routed_scaling_factor must be a finite number > 0"):
        _finalize(MoEOutput(_unfinalized(), None, factor))
