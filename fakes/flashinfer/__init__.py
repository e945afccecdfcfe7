"""CPU fake of FlashInfer's MoE all-to-all surface; module paths mirror the real package.

Select the release to imitate with :func:`set_profile` (or ``A2A_FAKE_FLASHINFER_PROFILE``);
:func:`install` makes ``import flashinfer`` itself resolve to the fake.
"""

from fakes.flashinfer.aliases import install  # noqa: F401 - the testbed's own (__fake_only__)
from fakes.flashinfer.fused_moe import reorder_rows_for_gated_act_gemm
from fakes.flashinfer.profiles import PROFILES, active, set_profile  # noqa: F401 - as install
from fakes.flashinfer.quantization import fp4_quantization
from fakes.flashinfer.quantization.fp4_quantization import shuffle_matrix_a, shuffle_matrix_sf_a

# The real root exports hundreds of names; these are the ones the fake imitates.
__all__ = ["block_scale_interleave", "reorder_rows_for_gated_act_gemm", "shuffle_matrix_a", "shuffle_matrix_sf_a"]
__fake_only__ = ("PROFILES", "active", "install", "set_profile")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"block_scale_interleave", "__version__"})


def __getattr__(name: str):
    if name == "__version__":
        return active().name
    if name == "block_scale_interleave":
        return fp4_quantization.block_scale_interleave
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
