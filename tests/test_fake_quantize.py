"""The fake's activation quantizers (``fp4_quantize``'s NVFP4 recipe, ``mxfp8_quantize``):
the device kernels' numerics and layouts, checked against hand-made cases and an independent
reading of the formats (grid values times scales), per release."""

from __future__ import annotations

import pytest
import torch

from fakes.flashinfer import install

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _codes(packed: torch.Tensor) -> list[int]:
    return torch.stack([packed & 0xF, packed >> 4], -1).flatten().tolist()


def _value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1[code & 7]


def test_fp4_quantize_rounds_to_nearest_even_on_the_e2m1_grid():
    # one block of 16: amax 6 with global scale 448 gives sf = e4m3(448) = 448, so x * 448 / 448 = x
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, 6.0, 0.1, 0.0, -0.0, 7.0, 0.5, 1.0, 1.5]
    x = torch.tensor([mids], dtype=torch.bfloat16)
    with install("0.7.2"):
        from flashinfer import fp4_quantize

        q, sf = fp4_quantize(x, torch.tensor([448.0 / 7.0 * 6.0 / 6.0]), is_sf_swizzled_layout=False)
    assert q.shape == (1, 8) and q.dtype == torch.uint8 and sf.shape == (1, 1)
    scale = sf.view(torch.float8_e4m3fn).float().item() / (448.0 / 7.0)
    # amax 7 over 6 at global scale 64: sf = e4m3(64 * 7 / 6) = 72 (nearest e4m3), each x * 64 / 72
    assert sf.view(torch.float8_e4m3fn).float().item() == 72.0
    got = [_value(c) * scale for c in _codes(q[0])]
    expect = []
    for v in mids:
        t = v / scale
        best = min(range(8), key=lambda i: (abs(abs(t) - E2M1[i]), i % 2))
        if abs(t) > 6:
            best = 7
        expect.append((-1.0 if str(t).startswith("-") else 1.0) * E2M1[best] * scale)
    assert got == expect


def test_fp4_quantize_swizzled_scales_are_the_linear_ones_interleaved():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 64, generator=g) * 3).to(torch.bfloat16)
    gs = torch.tensor([448.0 * 6.0 / float(x.float().abs().max())])
    with install("0.7.2"):
        from flashinfer import block_scale_interleave, fp4_quantize

        q_lin, sf_lin = fp4_quantize(x, gs, is_sf_swizzled_layout=False)
        q_sw, sf_sw = fp4_quantize(x, gs)
        inv_q, inv_sf = fp4_quantize(x, 1.0 / gs, is_sf_swizzled_layout=False, is_global_scale_inversed=True)
    assert torch.equal(q_lin, q_sw) and torch.equal(q_lin, inv_q) and torch.equal(sf_lin, inv_sf)
    assert sf_sw.shape == (128, 4)  # rows padded to 128, the 4 blocks of 16 already a multiple of 4
    assert torch.equal(sf_sw.flatten(), block_scale_interleave(sf_lin))
    # the codes times their block scale over the global scale give x back within a grid step
    vals = torch.tensor([_value(c) for c in _codes(q_lin)]).reshape(37, 64)
    recon = vals * sf_lin.view(torch.float8_e4m3fn).float().repeat_interleave(16, 1) / gs
    blocks = x.float().reshape(37, 4, 16).abs().amax(-1).repeat_interleave(16, 1)
    # half the widest e2m1 gap (4 to 6) in grid units of amax / 6, and the e4m3 rounding of the scale
    assert ((recon - x.float()).abs() <= blocks / 6 * 1.1).all()


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(sf_vec_size=32, sf_use_ue8m0=True), NotImplementedError, "NVFP4 recipe"),
    (dict(sf_vec_size=8), NotImplementedError, "sf_vec_size can only be 16 or 32"),
    (dict(is_sf_8x4_layout=True), NotImplementedError, "not 8x4"),
    (dict(backend="triton"), ValueError, "Unknown backend: triton"),
    (dict(backend="cute-dsl"), RuntimeError, "needs an SM100 GPU"),
])
def test_fp4_quantize_refuses_what_the_fake_does_not_run(kwargs, error, text):
    with install("0.7.2"):
        from flashinfer import fp4_quantize

        with pytest.raises(error, match=text):
            fp4_quantize(torch.ones(2, 32, dtype=torch.bfloat16), torch.tensor([1.0]), **kwargs)


def test_fp4_quantize_signature_follows_the_release():
    import inspect

    with install("0.6.8"):
        from flashinfer import fp4_quantize as old
    with install("0.7.4"):
        from flashinfer import fp4_quantize as new
    assert "is_global_scale_inversed" not in inspect.signature(old).parameters
    assert inspect.signature(new).parameters["backend"].default == "auto"
    assert inspect.signature(new).parameters["batch_invariant"].kind is inspect.Parameter.KEYWORD_ONLY


def test_mxfp8_quantize_scales_round_up_and_padding_is_zero():
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    x[0, :32] = 448.0 * 1.5  # amax / 448 = 1.5: e8m0 rounds up to 2 (exponent 1, code 128)
    x[1, 32:] = 1.0  # 1 / 448 -> 2^-8 (code 119)
    with install("0.7.2"):
        from flashinfer import mxfp8_quantize

        q, sf = mxfp8_quantize(x, False, alignment=128)
    assert q.shape == (3, 128) and q.dtype == torch.float8_e4m3fn and sf.shape == (12,)
    sf_MB = sf.view(3, 4)
    assert sf_MB.tolist() == [[128, 0, 0, 0], [0, 119, 0, 0], [0, 0, 0, 0]]
    assert q[0, :32].float().unique().tolist() == [320.0]  # 672 / 2 = 336, a tie between 320 and 352: even
    assert (q[:, 64:].float() == 0).all()  # the padded columns
    assert q[1, 32:64].float().unique().tolist() == [256.0]  # 1 * 2^8


def test_mxfp8_quantize_swizzled_layout_size_and_release_backends():
    x = torch.randn(5, 64).to(torch.bfloat16)
    with install("0.7.2"):
        from flashinfer import mxfp8_quantize

        _, sf = mxfp8_quantize(x)
        with pytest.raises(AssertionError, match="backend must be"):
            mxfp8_quantize(x, backend="auto")  # 0.7.4's
    assert sf.shape == (128 * 4,)
    with install("0.7.4"):
        from flashinfer import mxfp8_quantize

        mxfp8_quantize(x, backend="auto")


def test_quantizers_are_reexported_where_the_release_has_them():
    with install("0.7.2"):
        import flashinfer
        import flashinfer.fp4_quantization as stub4
        import flashinfer.fp8_quantization as stub8
        import flashinfer.quantization as package
        from flashinfer.quantization import fp4_quantization, fp8_quantization

        assert flashinfer.fp4_quantize is stub4.fp4_quantize is package.fp4_quantize is fp4_quantization.fp4_quantize
        assert flashinfer.mxfp8_quantize is stub8.mxfp8_quantize is fp8_quantization.mxfp8_quantize
        assert flashinfer.nvfp4_block_scale_interleave is flashinfer.block_scale_interleave
        assert package.SfLayout is flashinfer.SfLayout


def test_fp4_quantize_global_scale_per_tensor_or_per_row_as_the_kernel_checks():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 32, generator=g).to(torch.bfloat16)
    with install("0.7.2"):
        from flashinfer import fp4_quantize

        rows = fp4_quantize(x, torch.tensor([1.0, 64.0, 448.0]), is_sf_swizzled_layout=False)
        each = [fp4_quantize(x[i:i + 1], torch.tensor([s]), is_sf_swizzled_layout=False)
                for i, s in enumerate((1.0, 64.0, 448.0))]
        assert torch.equal(rows[0], torch.cat([q for q, _ in each])) and torch.equal(rows[1], torch.cat([s for _, s in each]))
        with pytest.raises(RuntimeError, match="globalScale is required when sfUseUE8M0 is false"):
            fp4_quantize(x, None)
        with pytest.raises(RuntimeError, match=r"globalScale should have shape \[1\] or \[num_tokens\]"):
            fp4_quantize(x, torch.ones(2))
        with pytest.raises(RuntimeError, match="self must be contiguous"):
            fp4_quantize(torch.randn(3, 64).to(torch.bfloat16)[:, :32], torch.ones(1))
        fp4_quantize(x, torch.ones(1, dtype=torch.bfloat16))  # cast to fp32 before the C++ op
    with install("0.6.8"):
        from flashinfer import fp4_quantize

        with pytest.raises(RuntimeError, match="Inconsistency of Tensor type: globalScale.value()"):
            fp4_quantize(x, torch.ones(1, dtype=torch.bfloat16))  # 0.6.8 does not cast


def test_quantizers_0_7_4_batch_invariant_and_backend_messages():
    x = torch.randn(2, 32).to(torch.bfloat16)
    with install("0.7.4"):
        from flashinfer import fp4_quantize, mxfp8_quantize

        for fn, args in ((fp4_quantize, (x, torch.ones(1))), (mxfp8_quantize, (x,))):
            with pytest.raises(ValueError, match="batch_invariant=True requires backend='auto'"):
                fn(*args, backend="cuda", batch_invariant=True)
            with pytest.raises(NotImplementedError, match="batch-invariant"):
                fn(*args, batch_invariant=True)
        with pytest.raises(ValueError, match=r"Must be 'auto', 'cuda' or 'cute-dsl'\.$"):
            fp4_quantize(x, torch.ones(1), backend="x")
        with pytest.raises(AssertionError, match="backend must be 'auto', 'cuda' or 'cute-dsl', got 'x'"):
            mxfp8_quantize(x, backend="x")
        with pytest.raises(RuntimeError, match="input must be contiguous"):
            mxfp8_quantize(torch.randn(2, 64).to(torch.bfloat16)[:, :32])


def test_fp4_quantize_swizzled_scale_shape_before_0_6_8():
    """Before 0.6.8 a swizzled scale tensor is reshaped to ``[-1, K/16]``: where K/16 is not a
    multiple of 4 the padded 128x4 rows split in two; 0.6.8 on keeps ``[-1, K/16 rounded to 4]``.
    The bytes are the same."""
    x = torch.randn(37, 32).to(torch.bfloat16)
    gs = torch.tensor([1.0])
    with install("0.6.7.post2"):
        from flashinfer import fp4_quantize

        _, sf_old = fp4_quantize(x, gs)
    with install("0.6.8"):
        from flashinfer import fp4_quantize

        _, sf_new = fp4_quantize(x, gs)
    assert sf_old.shape == (256, 2) and sf_new.shape == (128, 4)
    assert torch.equal(sf_old.flatten(), sf_new.flatten())


def test_quantizers_before_the_quantization_package():
    """0.6.6 and older ship fp4_/fp8_quantization as modules of their own, no
    flashinfer.quantization package of quantizers and no flashinfer.tllm_enums."""
    import importlib
    import inspect

    with install("0.6.6"):
        import flashinfer
        import flashinfer.fp4_quantization as fp4

        assert flashinfer.fp4_quantize is fp4.fp4_quantize
        assert "backend" not in inspect.signature(flashinfer.mxfp8_quantize).parameters
        assert "backend" not in inspect.signature(flashinfer.fp4_quantize).parameters
        importlib.import_module("flashinfer.quantization")  # a flat module of other helpers there
        with pytest.raises(ImportError):
            from flashinfer.quantization import fp4_quantize  # noqa: F401
        for name in ("flashinfer.tllm_enums", "flashinfer.quantization.fp4_quantization"):
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(name)
    with install("0.6.7"):
        from flashinfer.quantization import fp4_quantize  # noqa: F401
        from flashinfer.tllm_enums import RoutingMethodType

        assert RoutingMethodType.Unspecified == 6 and not hasattr(RoutingMethodType, "SigmoidRenorm")


def test_fused_moe_entries_before_0_6_5():
    """0.6.3 and 0.6.4 export only the logits-routed bf16 entry (from fused_moe, not the root),
    which always finalizes; the bf16 routed entry does not exist."""
    import inspect

    with install("0.6.4"):
        import flashinfer.fused_moe as fused_moe

        with pytest.raises(ImportError):
            from flashinfer import trtllm_bf16_moe  # noqa: F401
        with pytest.raises(ImportError):
            from flashinfer.fused_moe import trtllm_bf16_routed_moe  # noqa: F401
        assert not hasattr(fused_moe, "Fp8QuantizationType")
        assert "do_finalize" not in inspect.signature(fused_moe.trtllm_bf16_moe).parameters
        with pytest.raises(TypeError):
            fused_moe.trtllm_fp8_block_scale_routed_moe(*[None] * 16, do_finalize=False)
