"""The fake TRT-LLM fused MoE entry points against a dense fp32 reference built from the
logical weights; weights go through the same preparation a user applies for the real kernels."""

from __future__ import annotations

import inspect

import pytest
import torch

import fakes.flashinfer as fi
import fakes.flashinfer.fused_moe as fm
from fakes.flashinfer import set_profile
from fakes.flashinfer.fused_moe.core import PERMUTE_TILE
from fakes.flashinfer.comm import moe_a2a_kernels
from impl.quant import dequantize_fp8_block, dequantize_nvfp4, nvfp4_global_scale, quantize_fp8_block, quantize_nvfp4

T, H, I, E, L, OFF, K = 6, 256, 128, 8, 4, 2, 2  # local experts 2..5 of 8


@pytest.fixture(autouse=True)
def _profile():
    set_profile("0.7.2")
    moe_a2a_kernels.SlotOrder.mode = "shuffled"
    yield
    set_profile("0.7.2")


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).bfloat16()
    w1 = torch.randn(L, 2 * I, H, generator=g) / H ** 0.5  # rows: linear half, then gate half
    w2 = torch.randn(L, H, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    w = torch.rand(T, K, generator=g)
    return x, w1, w2, ids, w


def reference(x, w1, w2, ids, w):
    """Dense, one (token, lane) at a time; experts outside [OFF, OFF + L) contribute nothing."""
    out = torch.zeros(x.shape[0], H)
    for t in range(x.shape[0]):
        for k in range(K):
            e = int(ids[t, k]) - OFF
            if 0 <= e < L:
                h = w1[e] @ x[t].float()
                out[t] += w[t, k] * (w2[e] @ (torch.nn.functional.silu(h[I:]) * h[:I]))
    return out


def _bf16_kernel_weights(w1, w2, tile=128):
    """What a user does for the real BF16 kernel: gated reorder, shuffle, 128-byte BlockMajorK."""
    def prep(w, gated):
        w = w.bfloat16()
        w = fm.reorder_rows_for_gated_act_gemm(w) if gated else w
        w = fi.shuffle_matrix_a(w.view(torch.uint8), tile)
        return fm.convert_to_block_layout(w, 128).view(torch.bfloat16)
    return (torch.stack([prep(w, True) for w in w1]), torch.stack([prep(w, False) for w in w2]))


def _pack(ids, w):
    return (ids << 16) | w.bfloat16().view(torch.int16).to(torch.int32) & 0xFFFF


def _bf16_routed(topk_ids, x, g1, g2, **kw):
    return fm.trtllm_bf16_routed_moe(topk_ids, x, g1, g2, E, K, None, None, I, OFF, L, **kw)


def test_fused_moe_layout_helpers_match_the_real_maps():
    # srcToDstBlk16RowMap of flashinfer/utils.py: source row i goes to row MAP[i].
    MAP16 = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]
    rows = fi.shuffle_matrix_a(torch.arange(32)[:, None], 64)[:, 0]
    for src in range(32):
        assert int(rows[src // 16 * 16 + MAP16[src % 16]]) == src
    assert fm.reorder_rows_for_gated_act_gemm(torch.arange(6)[:, None])[:, 0].tolist() == [0, 3, 1, 4, 2, 5]
    sf = torch.arange(256 * 8, dtype=torch.int32).reshape(256, 8).to(torch.uint8)
    flat = fi.block_scale_interleave(sf)
    for (r, c), pos in {(0, 0): 0, (0, 1): 1, (1, 0): 16, (32, 0): 4, (0, 4): 512, (128, 0): 1024}.items():
        assert flat[pos] == sf[r, c], (r, c)


@pytest.mark.parametrize("packed", [True, False])
def test_fused_moe_bf16_routed_matches_dense_reference(packed):
    x, w1, w2, ids, w = _inputs()
    g1, g2 = _bf16_kernel_weights(w1, w2)
    w_used = w.bfloat16().float() if packed else w
    out = _bf16_routed(_pack(ids, w) if packed else (ids, w), x, g1, g2)
    assert out.dtype == torch.bfloat16 and out.shape == (T, H)
    ref = reference(x, w1.bfloat16().float(), w2.bfloat16().float(), ids, w_used)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@pytest.mark.parametrize("sentinel", [-1, E])  # the one-sided dispatch's -1, the two-sided num_experts
def test_fused_moe_invalid_lanes_are_skipped(sentinel):
    x, w1, w2, ids, w = _inputs(7)
    g1, g2 = _bf16_kernel_weights(w1, w2)
    ids[::2, 0] = sentinel
    out = _bf16_routed((ids, w), x, g1, g2)
    ref = reference(x, w1.bfloat16().float(), w2.bfloat16().float(), ids, w)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    _, _, perm = _bf16_routed((ids, w), x, g1, g2, do_finalize=False)
    assert (perm.view(T, K)[::2, 0] == -1).all()


def test_fused_moe_unfinalized_output_contract():
    x, w1, w2, ids, w = _inputs(1)
    g1, g2 = _bf16_kernel_weights(w1, w2)
    gemm2, weights, perm = _bf16_routed((ids, w), x, g1, g2, do_finalize=False)
    assert perm.dtype == torch.int32 and perm.shape == (T * K,)
    local = ((ids >= OFF) & (ids < OFF + L)).flatten()
    assert torch.equal(perm >= 0, local)
    assert gemm2.shape[0] % PERMUTE_TILE == 0 and gemm2.shape[1] == H
    used = set(perm[perm >= 0].tolist())
    assert len(used) == int(local.sum())
    padding = [r for r in range(gemm2.shape[0]) if r not in used]
    assert torch.isnan(gemm2[padding].float()).all()
    assert weights is w  # the caller's weights, borrowed as the real launcher does (fp32 here)
    # Rows are unweighted single-expert outputs.
    for j in range(T * K):
        if perm[j] >= 0:
            t, e = j // K, int(ids.flatten()[j]) - OFF
            h = w1[e].bfloat16().float() @ x[t].float()
            want = w2[e].bfloat16().float() @ (torch.nn.functional.silu(h[I:]) * h[:I])
            torch.testing.assert_close(gemm2[perm[j]].float(), want, rtol=2e-2, atol=2e-2)
    # The finalize formula over the unfinalized pieces is what do_finalize=True returns.
    out = torch.zeros(T, H)
    for j in range(T * K):
        if perm[j] >= 0:
            out[j // K] += w.flatten()[j] * gemm2[perm[j]].float()
    torch.testing.assert_close(out.bfloat16(), _bf16_routed((ids, w), x, g1, g2), rtol=0, atol=0)


def test_fused_moe_bf16_from_logits_renormalize():
    x, w1, w2, _, _ = _inputs(2)
    g1, g2 = _bf16_kernel_weights(w1, w2)
    logits = torch.randn(T, E)
    out = fm.trtllm_bf16_moe(logits, None, x, g1, g2, E, K, None, None, I, OFF, L, routing_method_type=1)
    top, ids = logits.topk(K, -1)
    ref = reference(x, w1.bfloat16().float(), w2.bfloat16().float(), ids, torch.softmax(top, -1))
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_fused_moe_bf16_unshuffled_weights_give_wrong_numbers():
    """The fake really inverts the layout: weights prepared without the shuffle do not pass."""
    x, w1, w2, ids, w = _inputs(3)
    g1, g2 = _bf16_kernel_weights(w1, w2, tile=64)  # the wrong epilogue tile (DeepSeek fp8's)
    ref = reference(x, w1.bfloat16().float(), w2.bfloat16().float(), ids, w)
    out = _bf16_routed((ids, w), x, g1, g2)
    assert (out.float() - ref).abs().max() > 0.2 * ref.abs().max()


def test_fused_moe_fp8_block_scale_routed_matches_dense_reference():
    x, w1, w2, ids, w = _inputs(4)
    xq, xs = quantize_fp8_block(x)

    def q_weights(w_LMK):  # DeepSeek weights: e4m3 with one fp32 scale per 128x128 block
        L_, M, Kd = w_LMK.shape
        blocks = w_LMK.reshape(L_, M // 128, 128, Kd // 128, 128)
        s = blocks.abs().amax((2, 4)) / 448
        q = (blocks / s[:, :, None, :, None]).to(torch.float8_e4m3fn).reshape(L_, M, Kd)
        return q, s
    q1, s1 = q_weights(w1)
    q2, s2 = q_weights(w2)
    out = fm.trtllm_fp8_block_scale_routed_moe((ids, w), None, xq, xs.t().contiguous(), q1, s1, q2, s2,
                                               E, K, None, None, I, OFF, L, None)
    deq = lambda q, s: q.float() * s.repeat_interleave(128, 1).repeat_interleave(128, 2)  # noqa: E731
    ref = reference(dequantize_fp8_block(xq, xs), deq(q1, s1), deq(q2, s2), ids, w)
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_fused_moe_fp4_block_scale_routed_matches_dense_reference():
    x, w1, w2, ids, w = _inputs(5)
    a_gs = nvfp4_global_scale(x.float().abs().max())
    xq, xs = quantize_nvfp4(x, a_gs)

    def q_weights(w_LMK, gated):
        gs = [nvfp4_global_scale(we.abs().max()) for we in w_LMK]
        qs = [quantize_nvfp4(we, g) for we, g in zip(w_LMK, gs)]
        deq = torch.stack([dequantize_nvfp4(q, s, g) for (q, s), g in zip(qs, gs)])
        kernel_w, kernel_sf = [], []
        for q, s in qs:
            if gated:
                q, s = fm.reorder_rows_for_gated_act_gemm(q), fm.reorder_rows_for_gated_act_gemm(s)
            kernel_w.append(fi.shuffle_matrix_a(q, 128))
            kernel_sf.append(fi.shuffle_matrix_sf_a(s.view(torch.uint8), 128).view(torch.float8_e4m3fn)
                             .reshape(s.shape))
        return torch.stack(kernel_w), torch.stack(kernel_sf), torch.stack(gs), deq
    g1, sf1, gs1, d1 = q_weights(w1, True)
    g2, sf2, gs2, d2 = q_weights(w2, False)
    scale1 = 1 / (a_gs * gs1)
    res = fm.trtllm_fp4_block_scale_routed_moe(
        _pack(ids, w), None, xq, xs, g1, sf1, None, None, None, None, g2, sf2, None,
        scale1, scale1, 1 / gs2, E, K, None, None, I, OFF, L, None)
    assert isinstance(res, list) and len(res) == 1
    ref = reference(dequantize_nvfp4(xq, xs, a_gs), d1, d2, ids, w.bfloat16().float())
    torch.testing.assert_close(res[0].float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_fused_moe_signatures_per_profile():
    set_profile("0.6.8")
    assert "output" not in inspect.signature(fm.trtllm_bf16_moe).parameters
    with pytest.raises(TypeError, match="unexpected keyword argument 'output'"):
        fm.trtllm_bf16_routed_moe(None, None, None, None, E, K, None, None, I, OFF, L, output=None)
    assert "per_token_scale" not in inspect.signature(fm.trtllm_fp4_block_scale_routed_moe).parameters
    set_profile("0.6.16")
    assert "output" in inspect.signature(fm.trtllm_bf16_moe).parameters
    assert "valid_hidden_size" not in inspect.signature(fm.trtllm_fp8_block_scale_routed_moe).parameters
    set_profile("0.7.2")
    assert "hidden_states_scale_layout" in inspect.signature(fm.trtllm_fp4_block_scale_routed_moe).parameters


def test_fused_moe_rejects_bad_inputs():
    x, w1, w2, ids, w = _inputs(6)
    g1, g2 = _bf16_kernel_weights(w1, w2)
    with pytest.raises(RuntimeError, match="requires the BlockMajorK weight layout"):
        _bf16_routed((ids, w), x, g1, g2, weight_layout=0)
    with pytest.raises(RuntimeError, match="hidden_states must be bfloat16"):
        _bf16_routed((ids, w), x.float(), g1, g2)
    with pytest.raises(RuntimeError, match=r"expert ids must be in \[0, 8\), -1 or 8"):
        _bf16_routed((ids + 9, w), x, g1, g2)
    with pytest.raises(RuntimeError, match="topk_ids must be int32"):
        _bf16_routed((ids.long(), w), x, g1, g2)
