"""The weight and scale-factor layouts the TRT-LLM MoE kernels read, as index maps.

Users prepare weights with the forward maps (as FlashInfer's own helpers do); the fake's
kernels apply the inverses to get the logical ``[rows, K]`` matrices back. Legend: M rows
(output features), K columns (input features), E experts.

- gated row reorder: ``[r0, r1, ..., r(M/2-1) | rM/2, ...]`` -> ``[r0, rM/2, r1, rM/2+1, ...]``
  (the kernel reads the linear and gate halves of GEMM1 in pairs).
- row shuffle for the epilogue tile (``shuffle_matrix_a``): inside blocks of 16 rows (tile
  64) or 32 rows (tile 128), source row ``i`` lands at ``i // n + 8 * (i % n)``, n = block / 8.
- ``BlockMajorK``: ``[M, K]`` -> ``[K / blockK, M, blockK]``; the kernels take blockK = 128
  bytes (users block the uint8 view, then view it back).
- 128x4 scale-factor interleave (``block_scale_interleave``): rows padded to 128 and columns
  to 4, element ``(r, c)`` stored at
  ``((r // 128) * (C / 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``.
"""

from __future__ import annotations

import torch

def gated_reorder_indices(m: int) -> torch.Tensor:
    """``new[i] = old[idx[i]]`` for the gated-activation row reorder."""
    if m % 2:
        raise ValueError(f"x.shape[0] must be even, not {m}")
    idx = torch.empty(m, dtype=torch.long)
    idx[0::2] = torch.arange(m // 2)
    idx[1::2] = torch.arange(m // 2, m)
    return idx


def shuffle_indices(m: int, epilogue_tile_m: int) -> torch.Tensor:
    """``new[i] = old[idx[i]]`` for the epilogue-tile row shuffle."""
    block = 32 if epilogue_tile_m % 128 == 0 else 16
    if m % block:
        raise AssertionError(f"input_tensor.shape[0] must be multiples of {block}")
    old = torch.arange(m)
    within = old % block
    per = block // 8
    new = old // block * block + within // per + 8 * (within % per)
    idx = torch.empty(m, dtype=torch.long)
    idx[new] = old
    return idx


def to_block_major_k(w_MK: torch.Tensor, block_k: int) -> torch.Tensor:
    """``[M, K]`` -> ``[K / block_k, M, block_k]`` (``block_k`` in elements of ``w``)."""
    M, K = w_MK.shape
    assert K % block_k == 0, "K must be divisible by blockK"
    return w_MK.view(M, K // block_k, block_k).permute(1, 0, 2).contiguous()


def from_block_major_k(w: torch.Tensor) -> torch.Tensor:
    """``[..., K / blockK, M, blockK]`` -> ``[..., M, K]``."""
    B, M, b = w.shape[-3:]
    return w.transpose(-3, -2).reshape(*w.shape[:-3], M, B * b)


def interleave_128x4_indices(rows: int, cols: int) -> tuple[torch.Tensor, int]:
    """Flat position of each ``(r, c)`` of a ``[rows, cols]`` scale matrix, and the padded size."""
    rp, cp = -(-rows // 128) * 128, -(-cols // 4) * 4
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    pos = ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    return pos, rp * cp


def interleave_128x4(sf_RC: torch.Tensor) -> torch.Tensor:
    """Linear ``[rows, cols]`` scales -> the flat, padded 128x4 buffer."""
    pos, size = interleave_128x4_indices(*sf_RC.shape)
    out = torch.zeros(size, dtype=sf_RC.dtype)
    out[pos.flatten()] = sf_RC.flatten()
    return out


def deinterleave_128x4(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The flat 128x4 buffer(s) ``[..., size]`` -> linear ``[..., rows, cols]`` scales."""
    pos, size = interleave_128x4_indices(rows, cols)
    if flat.size(-1) < size:
        raise RuntimeError(f"128x4 scale buffer holds {flat.size(-1)} elements, needs {size} for [{rows}, {cols}]")
    return flat[..., pos]


def unpermute_rows(w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Undo ``w = orig[..., idx, :]`` (rows are the second-to-last dimension)."""
    orig = torch.empty_like(w)
    orig[..., idx, :] = w
    return orig
