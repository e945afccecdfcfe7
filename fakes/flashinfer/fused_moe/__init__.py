"""Fake ``flashinfer.fused_moe``: the TRT-LLM-gen MoE entry points and the weight-layout
helpers users prepare weights with. The entry points take the active profile's signature."""

import torch

from fakes.flashinfer.fused_moe.core import ENTRY_POINTS, PERMUTE_TILE, entry_point
from fakes.flashinfer.fused_moe.layouts import (
    gated_reorder_indices,
    interleave_128x4,
    shuffle_indices,
    to_block_major_k,
)
from fakes.flashinfer.tllm_enums import ActivationType, Fp8QuantizationType, RoutingMethodType, WeightLayout

__all__ = [
    "ActivationType", "Fp8QuantizationType", "PERMUTE_TILE", "RoutingMethodType", "WeightLayout",
    "convert_to_block_layout", "reorder_rows_for_gated_act_gemm", "shuffle_matrix_a", "shuffle_matrix_sf_a",
    "block_scale_interleave", *ENTRY_POINTS,
]


def convert_to_block_layout(input_tensor, blockK: int):
    """``[M, K]`` -> ``[K / blockK, M, blockK]`` (``blockK`` in elements of the tensor given)."""
    return to_block_major_k(input_tensor, blockK)


def reorder_rows_for_gated_act_gemm(x):
    return x[gated_reorder_indices(x.shape[0])]


def shuffle_matrix_a(input_tensor, epilogue_tile_m: int):
    return input_tensor[shuffle_indices(input_tensor.shape[0], epilogue_tile_m)]


def block_scale_interleave(unswizzled_sf):
    """Linear ``[rows, cols]`` (or ``[E, rows, cols]``) scales -> the flat 128x4 buffer."""
    assert unswizzled_sf.dtype in (torch.uint8, torch.bfloat16), (
        f"Input dtype must be uint8 or bfloat16, got {unswizzled_sf.dtype}")
    if unswizzled_sf.dim() == 3:
        return torch.cat([interleave_128x4(s) for s in unswizzled_sf])
    return interleave_128x4(unswizzled_sf)


def shuffle_matrix_sf_a(input_tensor, epilogue_tile_m: int, num_elts_per_sf: int = 16):
    """Row-shuffle linear scales for the epilogue tile, then interleave them 128x4."""
    assert input_tensor.shape[0] % 128 == 0
    return block_scale_interleave(shuffle_matrix_a(input_tensor, epilogue_tile_m))


def __getattr__(name: str):
    if name in ENTRY_POINTS:
        return entry_point(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
