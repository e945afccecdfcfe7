"""Fake ``flashinfer.fused_moe``: the TRT-LLM-gen MoE entry points and the two weight-layout
helpers this package exports (the row shuffle and scale interleave are ``flashinfer``'s own).
The entry points take the active profile's signature."""

from fakes.flashinfer.fused_moe.core import ENTRY_POINTS, convert_to_block_layout, entry_point, reorder_rows_for_gated_act_gemm
from fakes.flashinfer import profiles, tllm_enums
from fakes.flashinfer.tllm_enums import WeightLayout

__all__ = [
    "ActivationType", "Fp8QuantizationType", "RoutingMethodType", "WeightLayout",
    "convert_to_block_layout", "reorder_rows_for_gated_act_gemm", *ENTRY_POINTS,
]


def __getattr__(name: str):
    # The real package re-exports fused_moe.api's payload formats here from 0.7.0 on (vLLM
    # 0.33.0's layer builder imports them from this module).
    if name == "QuantFormat" and profiles.active().quant_format:
        from fakes.flashinfer.fused_moe.api import QuantFormat

        return QuantFormat
    if profiles.ships("fused_moe", name):
        if name in ENTRY_POINTS:
            return entry_point(name)
        if name in ("ActivationType", "Fp8QuantizationType", "RoutingMethodType"):
            return getattr(tllm_enums, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
