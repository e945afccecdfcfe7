"""CPU fake of FlashInfer's MoE all-to-all surface; module paths mirror the real package.

Select the release to imitate with :func:`set_profile` (or ``A2A_FAKE_FLASHINFER_PROFILE``);
:func:`install` makes ``import flashinfer`` itself resolve to the fake.
"""

from fakes.flashinfer._reexport import forwarding
from fakes.flashinfer.aliases import install  # noqa: F401 - the testbed's own (__fake_only__)
from fakes.flashinfer.fused_moe import reorder_rows_for_gated_act_gemm
from fakes.flashinfer.profiles import PROFILES, active, set_profile  # noqa: F401 - as install
from fakes.flashinfer.profiles import release as _release
from fakes.flashinfer.quantization.fp4_quantization import shuffle_matrix_a, shuffle_matrix_sf_a

# The real root exports hundreds of names; these are the ones the fake imitates.
__all__ = ["ActivationType", "RoutingMethodType", "SfLayout", "block_scale_interleave", "fp4_quantize",
           "mxfp8_quantize", "nvfp4_block_scale_interleave", "reorder_rows_for_gated_act_gemm", "shuffle_matrix_a",
           "shuffle_matrix_sf_a", "trtllm_bf16_moe", "trtllm_bf16_routed_moe", "trtllm_fp4_block_scale_routed_moe",
           "trtllm_fp8_block_scale_routed_moe"]
__fake_only__ = ("PROFILES", "active", "install", "set_profile")
# The fake's own modules: no release ships them, so `import flashinfer.<one>` fails under install().
__fake_only_modules__ = ("_check", "_reexport", "aliases", "annotations", "comm.moe_a2a_kernels", "fused_moe.layouts",
                         "moe_ep.communication", "moe_ep.nvlink", "moe_ep.nvlink_jit", "moe_ep.one_sided_ops",
                         "profiles", "quantization.block_quant")
_PER_RELEASE = {"block_scale_interleave": "quantization.fp4_quantization",
                "nvfp4_block_scale_interleave": "quantization.fp4_quantization",
                "fp4_quantize": "quantization.fp4_quantization",
                "mxfp8_quantize": "quantization.fp8_quantization",
                **dict.fromkeys(("ActivationType", "RoutingMethodType", "SfLayout"), "tllm_enums"),
                **dict.fromkeys(("trtllm_bf16_moe", "trtllm_bf16_routed_moe", "trtllm_fp4_block_scale_routed_moe",
                                 "trtllm_fp8_block_scale_routed_moe"), "fused_moe")}
_forward, _names = forwarding(__name__, _PER_RELEASE)


def __dir__() -> list[str]:
    return sorted(set(_names()) | {"__version__"})


def __getattr__(name: str):
    if name == "__version__":
        return _release()
    return _forward(name)
