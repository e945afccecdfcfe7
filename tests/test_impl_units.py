"""Single-process tests of impl: backend resolution, supports_kw, dispatch layout,
quantizers, the DeepSeek fp8 activation check, the forward context."""

from __future__ import annotations

import inspect
import re
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from impl.backend import FlashInferUnavailableError
from testbed.scenario.rank import resolve_backend
from impl.compat import supports_kw
from impl.formats import FP8_DTYPE, DispatchLayout, QuantConfig, dispatch_layout
from impl.forward_context import forward_context, runtime_max_tokens_per_rank
from impl.quant import (
    dequantize_input,
    nvfp4_global_scale,
    prepare_deepseek_fp8_x_sf,
    quantize_input,
)

NVFP4 = QuantConfig("nvfp4", a1_gscale=torch.tensor(1.0))
MXFP8 = QuantConfig("mxfp8")
FP8_BLOCK = QuantConfig(FP8_DTYPE, block_shape=(128, 128))


# --- backend -------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["0.6.8", "0.6.14", "0.6.16", "0.7.2"])
def test_backend_fake_profile_selects_signatures(profile):
    api = resolve_backend("fake", profile=profile)
    assert api.name == "fake" and api.version == profile
    has_output = "output" in inspect.signature(api.MoeAlltoAll.combine).parameters
    assert has_output == (profile in ("0.6.16", "0.7.2"))
    resolve_backend("fake", profile="0.7.2")


def test_backend_bad_names_are_value_errors():
    with pytest.raises(ValueError, match=r"backend must be one of \('fake', 'flashinfer'\), got 'cuda'"):
        resolve_backend("cuda")
    with pytest.raises(ValueError, match="FlashInfer release '0.5.0' is not served by the fake: it serves 0.6.3, 0.6.4, "):
        resolve_backend("fake", profile="0.5.0")
    with pytest.raises(ValueError, match="applies to the fake backend only"):
        resolve_backend("flashinfer", profile="0.7.2")


def test_backend_flashinfer_missing_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> ImportError
    with pytest.raises(FlashInferUnavailableError, match="needs the flashinfer-python package"):
        resolve_backend("flashinfer")


def _flashinfer_modules() -> dict:
    return {n: m for n, m in sys.modules.items() if n == "flashinfer" or n.startswith("flashinfer.")}


@pytest.fixture
def site_flashinfer(tmp_path, monkeypatch):
    """``install(version, modules)``: a ``flashinfer`` tree of empty modules first on the path.
    Afterwards the modules the test imported from it go and those before it come back (a later
    test in this process would otherwise import this tree's ``flashinfer``)."""
    saved = _flashinfer_modules()

    def install(version: str, modules: list[str]) -> None:
        root = tmp_path / "site"
        for mod in ["flashinfer", "flashinfer/comm"] + modules:
            (root / mod).mkdir(parents=True, exist_ok=True)
            (root / mod / "__init__.py").write_text("")
        (root / "flashinfer" / "__init__.py").write_text(f"__version__ = {version!r}\n")
        monkeypatch.syspath_prepend(str(root))
        for name in _flashinfer_modules():
            del sys.modules[name]

    yield install
    for name in _flashinfer_modules():
        del sys.modules[name]
    sys.modules.update(saved)


COMM_HELPERS = ["flashinfer/comm/mnnvl", "flashinfer/comm/mapping"]


def test_backend_flashinfer_without_either_api_names_both_homes(site_flashinfer):
    site_flashinfer("0.7.9", COMM_HELPERS + ["flashinfer/moe_ep"])
    with pytest.raises(FlashInferUnavailableError) as e:
        resolve_backend("flashinfer")
    assert str(e.value).startswith("flashinfer 0.7.9 has no one-sided all-to-all: neither "
                                   "flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll nor "
                                   "flashinfer.moe_ep.NVLinkOneSidedAlltoAll; ")
    # why each absent module is absent: here, not shipped
    assert "flashinfer.comm.trtllm_moe_alltoall: ModuleNotFoundError: No module named " \
           "'flashinfer.comm.trtllm_moe_alltoall'" in str(e.value)


def test_backend_flashinfer_one_api_failing_to_import_leaves_the_other():
    """A moe_ep that fails on a missing dependency does not take the comm all-to-alls down."""
    from fakes.flashinfer import install

    with install("0.7.2"):
        moe_ep = sys.modules["flashinfer.moe_ep"]
        sys.modules["flashinfer.moe_ep"] = None  # import -> ImportError
        try:
            api = resolve_backend("flashinfer")
        finally:
            sys.modules["flashinfer.moe_ep"] = moe_ep  # install() restores the rest on exit
        assert api.moe_ep is None and api.a2a_api() == "comm"
        assert dict(api.unavailable)["flashinfer.moe_ep"].startswith("ModuleNotFoundError")
        with pytest.raises(FlashInferUnavailableError, match="no one-sided all-to-all in flashinfer.moe_ep"):
            api.a2a_api(prefer="moe_ep")


def test_backend_flashinfer_without_one_sided_and_without_moe_ep(site_flashinfer):
    site_flashinfer("0.5.3", COMM_HELPERS)
    with pytest.raises(FlashInferUnavailableError, match="flashinfer 0.5.3 has no one-sided all-to-all"):
        resolve_backend("flashinfer")


@pytest.mark.parametrize("release, one_sided, two_sided", [
    ("0.6.16", "comm", "comm"), ("0.7.2", "comm", "comm"), ("0.7.4", "moe_ep", "moe_ep")])
def test_backend_flashinfer_probes_the_apis_by_symbol(release, one_sided, two_sided):
    """Through the real names (the fake installed as ``flashinfer``): 0.7.4 resolves to
    ``moe_ep``, where ``MoeAlltoAll`` is gone and says so; 0.7.2 offers both."""
    from fakes.flashinfer import install

    with install(release):
        api = resolve_backend("flashinfer")
        assert (api.a2a_api(), api.a2a_api(two_sided=True)) == (one_sided, two_sided)
        assert api.has("moe_ep") == (release != "0.6.16")
        if release == "0.7.4":
            assert api.moe_alltoall is None and api.alltoall is None
            with pytest.raises(FlashInferUnavailableError, match="0.7.4 has no flashinfer.comm.trtllm_moe_alltoall"):
                api.MoeAlltoAll  # noqa: B018
            with pytest.raises(FlashInferUnavailableError, match="no one-sided all-to-all in flashinfer.comm"):
                api.a2a_api(prefer="comm")
        else:
            assert api.MoeAlltoAll.__name__ == "MoeAlltoAll"


# --- supports_kw ---------------------------------------------------------------------------

def _plain(payload, output=None): ...
def _kw_only(payload, *, output=None): ...
def _var_kwargs(payload, **kwargs): ...
def _named_var(payload, **output): ...
def _no_params(): ...


class _Obj:
    def combine(self, payload, output=None): ...


@pytest.mark.parametrize("fn, kwargs, expected", [
    (_plain, {}, True),
    (_plain, {"requires_kw_only": True}, False),
    (_kw_only, {"requires_kw_only": True}, True),
    (_var_kwargs, {}, True),
    (_var_kwargs, {"allow_var_kwargs": False}, False),
    (_named_var, {}, False),
    (_no_params, {}, False),
    (_Obj().combine, {"allow_var_kwargs": False}, True),
    (lambda payload: None, {}, False),
])
def test_supports_kw_semantics(fn, kwargs, expected):
    assert supports_kw(fn, "output", **kwargs) is expected


def test_supports_kw_propagates_uninspectable_callables():
    with pytest.raises((TypeError, ValueError)):
        supports_kw(42, "output")


# --- dispatch layout -------------------------------------------------------------------------

@pytest.mark.parametrize("hidden, qc, dtype, expected", [
    (4096, QuantConfig(), torch.bfloat16, (8192, 0)),
    (4096, QuantConfig(), torch.float16, (8192, 0)),
    (4096, NVFP4, torch.bfloat16, (2048, 256)),
    (4096, MXFP8, torch.bfloat16, (4096, 128)),
    (2880, QuantConfig("mxfp8", mx_alignment=256), torch.bfloat16, (2880, 96)),  # 2880 -> 3072
    (7168, FP8_BLOCK, torch.bfloat16, (7168, 56 * 4)),
])
def test_dispatch_layout_per_format(hidden, qc, dtype, expected):
    assert dispatch_layout(hidden, qc, dtype) == DispatchLayout(*expected)


@pytest.mark.parametrize("hidden, qc, dtype, error, match", [
    (4096, QuantConfig(FP8_DTYPE), torch.bfloat16, NotImplementedError, r"quant_dtype=torch.float8_e4m3fn, block_shape=None"),
    (4096, QuantConfig(FP8_DTYPE, block_shape=(128, 128), per_act_token_quant=True), torch.bfloat16,
     NotImplementedError, "per_act_token_quant=True"),
    (4096, QuantConfig(torch.int8), torch.bfloat16, NotImplementedError, "quant_dtype=torch.int8"),
    (4096, QuantConfig("mxfp4"), torch.bfloat16, NotImplementedError, "quant_dtype='mxfp4'"),
    (4096, QuantConfig(), torch.float32, NotImplementedError, "got input dtype torch.float32"),
    (200, FP8_BLOCK, torch.bfloat16, NotImplementedError, "hidden divisible by 128; got hidden=200"),
    (200, NVFP4, torch.bfloat16, ValueError, "nvfp4 needs hidden divisible by 16 .*got hidden=200"),
    (4096, QuantConfig("mxfp8", mx_alignment=48), torch.bfloat16, ValueError, "mx_alignment must be 0 or a positive multiple of 32, got 48"),
])
def test_dispatch_layout_rejects_with_named_errors(hidden, qc, dtype, error, match):
    with pytest.raises(error, match=match):
        dispatch_layout(hidden, qc, dtype)


FORMAT_CONFIGS = {
    "bf16": lambda align: QuantConfig(),
    "nvfp4": lambda align: QuantConfig("nvfp4", a1_gscale=nvfp4_global_scale(4.0)),
    "mxfp8": lambda align: QuantConfig("mxfp8", mx_alignment=align),
    "fp8_block": lambda align: FP8_BLOCK,
}


@given(fmt=st.sampled_from(sorted(FORMAT_CONFIGS)), blocks=st.integers(1, 12), tokens=st.integers(0, 5),
       align=st.sampled_from([0, 32, 128, 256]), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_dispatch_layout_matches_quantizer_bytes(fmt, blocks, tokens, align, dtype):
    hidden = blocks * 128
    qc = FORMAT_CONFIGS[fmt](align)
    x = torch.randn(tokens, hidden).to(dtype)
    q, sf = quantize_input(x, qc)
    layout = dispatch_layout(hidden, qc, dtype)
    assert q.shape == (tokens, q.size(1)) and q.size(1) * q.element_size() == layout.x_bytes_per_token
    sf_bytes = 0 if sf is None else sf.size(1) * sf.element_size()
    assert sf is None or sf.size(0) == tokens
    assert sf_bytes == layout.x_sf_bytes_per_token


# --- quantizers ------------------------------------------------------------------------------

def test_nvfp4_exact_for_representable_values_and_low_nibble_first():
    # amax 6 and gs = 448*6/6 make the block scale exactly 448 and x/scale*gs == x.
    vals = torch.tensor([0.5, 6.0, -1.5, 0.0, 3.0, -4.0, 1.0, 2.0] * 2)
    x = vals.repeat(3, 2)  # [3, 32]
    qc = QuantConfig("nvfp4", a1_gscale=nvfp4_global_scale(6.0))
    q, sf = quantize_input(x, qc)
    assert q[0, 0].item() == (7 << 4) | 1  # 0.5 -> code 1 (low nibble), 6.0 -> code 7 (high)
    assert q[0, 1].item() == (0 << 4) | (8 | 3)  # -1.5 -> sign | code 3, 0.0 -> 0
    assert torch.all(sf.float() == 448.0)
    assert torch.equal(dequantize_input(q, sf, qc, 32), x)


def test_mxfp8_and_fp8_block_exact_for_representable_values():
    x = torch.tensor([448.0, -0.5, 3.5, 0.0] * 32).repeat(2, 1)  # [2, 128], e4m3 values
    q, sf = quantize_input(x, MXFP8)
    assert torch.all(sf == 127)  # amax 448 -> scale 2^0
    assert torch.equal(dequantize_input(q, sf, MXFP8, 128), x)
    q, sf = quantize_input(x, FP8_BLOCK)
    assert torch.all(sf == 1.0)
    assert torch.equal(dequantize_input(q, sf, FP8_BLOCK, 128), x)


@pytest.mark.parametrize("fmt, rel", [("nvfp4", 1 / 6 + 1 / 16), ("mxfp8", 1 / 16), ("fp8_block", 1 / 16)])
def test_quantizer_error_within_format_bound(fmt, rel):
    # Per block: |x - dq| <= rel * amax(block) (e4m3: half an ulp is 1/16 of the value;
    # nvfp4 adds e2m1's widest half-step, 1 of 6, plus the e4m3 rounding of its scale).
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 256, generator=g) * torch.logspace(-2, 2, 16)[:, None]
    qc = FORMAT_CONFIGS[fmt](0) if fmt != "nvfp4" else QuantConfig("nvfp4", a1_gscale=nvfp4_global_scale(x.abs().max()))
    dq = dequantize_input(*quantize_input(x, qc), qc, 256)
    block = {"nvfp4": 16, "mxfp8": 32, "fp8_block": 128}[fmt]
    amax = x.abs().reshape(16, -1, block).amax(-1).repeat_interleave(block, 1)
    assert torch.all((dq - x).abs() <= rel * amax + 1e-6)
    assert (dq - x).abs().max() > 0  # really quantized


def test_nvfp4_without_global_scale_is_a_value_error():
    with pytest.raises(ValueError, match="needs quant_config.a1_gscale"):
        quantize_input(torch.randn(2, 64), QuantConfig("nvfp4"))


def test_prepare_deepseek_fp8_x_sf_transposes_and_checks():
    x = torch.randn(3, 256).to(FP8_DTYPE)
    sf = torch.rand(3, 2)
    out = prepare_deepseek_fp8_x_sf(x, sf)
    assert out.shape == (2, 3) and out.is_contiguous() and torch.equal(out, sf.t())
    with pytest.raises(RuntimeError, match="require precomputed activation scales"):
        prepare_deepseek_fp8_x_sf(x, None)
    with pytest.raises(ValueError, match="must use the E4M3 dtype"):
        prepare_deepseek_fp8_x_sf(x.float(), sf)
    with pytest.raises(ValueError, match=r"K divisible by 128; got \(3, 200\)"):
        prepare_deepseek_fp8_x_sf(torch.zeros(3, 200).to(FP8_DTYPE), sf)
    with pytest.raises(ValueError, match=r"fp32 \[M, K/128\] = \[3, 2\]; got dtype=torch.bfloat16"):
        prepare_deepseek_fp8_x_sf(x, sf.bfloat16())
    with pytest.raises(ValueError, match=r"shape=\(2, 3\)"):
        prepare_deepseek_fp8_x_sf(x, sf.t())


# --- forward context -------------------------------------------------------------------------

def test_runtime_max_tokens_is_max_over_dp_and_at_least_one():
    assert runtime_max_tokens_per_rank(3) == 3
    with forward_context([0, 7, 2]):
        assert runtime_max_tokens_per_rank(2) == 7
        with pytest.raises(ValueError, match="forward context is stale"):
            runtime_max_tokens_per_rank(9)
    with forward_context([0, 0]):
        assert runtime_max_tokens_per_rank(0) == 1
    with pytest.raises(ValueError, match="non-negative counts"):
        with forward_context([1, -1]):
            pass


@pytest.mark.parametrize("hidden, qc, sizes", [
    (64, QuantConfig("mxfp8"), "64 + 2"),
    (96, QuantConfig("nvfp4", a1_gscale=torch.tensor(448.0)), "48 + 6"),
    (33, QuantConfig(), "66 + 0"),
])
def test_one_sided_layer_rejects_activation_bytes_that_misalign_the_ids(hidden, qc, sizes):
    """FlashInfer packs [x, x_sf, ids, weights] back to back and requires each payload to end
    aligned to its element size: an activation payload that is not a multiple of 4 bytes per
    token fails in dispatch whenever ep_size * runtime max tokens is odd, so at an odd EP size
    the layer refuses it; at an even one every step's product is even and the kernels take it."""
    import types

    from impl.one_sided import OneSidedPrepareFinalize, check_activation_alignment

    layout = dispatch_layout(hidden, qc, torch.bfloat16)
    with pytest.raises(ValueError, match=rf"hidden_size={hidden}: the one-sided dispatch at an odd EP size \(3\) "
                                          rf".*= {re.escape(sizes)} bytes per token\) to be a multiple of 4 bytes"):
        OneSidedPrepareFinalize(types.SimpleNamespace(world_size=3), max_num_tokens=4, top_k=2, num_experts=6,
                                hidden_size=hidden, layout=layout)
    for ep_size in (2, 4, 8):
        check_activation_alignment(layout, hidden, ep_size)


def test_supports_kw_positional_only_is_not_a_keyword():
    def combine(output=None, /, payload=None):
        return output

    assert supports_kw(combine, "payload") and not supports_kw(combine, "output")


@pytest.mark.parametrize("invalid", [0, 7, True, 1.5, 9, -2])
def test_one_sided_invalid_expert_id_outside_the_experts(invalid):
    from impl.formats import DispatchLayout
    from impl.one_sided import OneSidedPrepareFinalize

    with pytest.raises(ValueError, match="invalid_expert_id must be -1 or num_experts=8"):
        OneSidedPrepareFinalize(None, max_num_tokens=4, top_k=2, num_experts=8, hidden_size=64,
                                layout=DispatchLayout(128, 0), invalid_expert_id=invalid)
