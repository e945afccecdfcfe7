"""The fused-experts kernel stand-in of one rank (what the integration hands its received rows
to), independent of ``impl``: it reads the activations as each format defines them.

Legend: N rows this rank received, K top_k, H hidden, P permuted rows.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from impl.moe_output import UnfinalizedMoEOutput
from testbed.scenario.reference import ACT_DTYPE, LinearMap, dequantize


class Experts:
    """Per received row, the router-weighted sum of this rank's experts over the row's lanes,
    in bf16; with ``defer`` the unfinalized form (each lane's unweighted row, permuted by
    expert, and the lane -> row map), as a TRT-LLM kernel with ``do_finalize=False`` returns.

    Parameters
    ----------
    fmt : str
        The layer's activation format (``bf16``, ``nvfp4``, ``mxfp8``, ``fp8_block``).
    hidden : int
    own : range
        The experts this rank owns.
    weight : callable
        ``weight(e) -> LinearMap``: expert ``e`` is the linear map ``x @ W_e``
        (:class:`testbed.scenario.reference.LinearMap`).
    weighted : bool
        Apply the router weights (False when prepare already scaled the activations by them).
    shard : (int, int)
        ``(tp_rank, tp_size)``: with expert parallel off each TP rank computes the partial
        map over its slice of the hidden (contraction) dimension; the TP all-reduce sums them.
    """

    def __init__(self, fmt: str, hidden: int, own: range, weight: Callable[[int], torch.Tensor],
                 weighted: bool = True, shard: tuple[int, int] = (0, 1)):
        self.fmt, self.hidden, self.own, self.weight, self.weighted = fmt, hidden, own, weight, weighted
        rank, size = shard
        part = hidden // size
        self.cols = slice(rank * part, (rank + 1) * part)

    def supports_deferred_finalize(self) -> bool:
        return True

    def __call__(self, prep, *, defer: bool = False, output: Optional[torch.Tensor] = None):
        ids_NK, w_NK = prep.topk_ids, prep.topk_weights
        N, K = ids_NK.shape
        device = ids_NK.device
        out_NH = torch.zeros(N, self.hidden, device=device)
        perm_NK = torch.full((N, K), -1, dtype=torch.int32, device=device)
        rows_PH: list[torch.Tensor] = []
        mine_NK = (ids_NK >= self.own.start) & (ids_NK < self.own.stop)
        # Only rows that hold one of this rank's experts are read: the rest are stale or padding.
        rows = mine_NK.any(1).nonzero().flatten()
        if rows.numel():
            scale = None if prep.a1q_scale is None else prep.a1q_scale[rows]
            x_nH = dequantize(self.fmt, prep.a1q[rows], scale, self.hidden)[:, self.cols]
            placed = 0
            for e in self.own:
                n, lane = (ids_NK[rows] == e).nonzero(as_tuple=True)
                if n.numel():
                    y = self.weight(e)(x_nH[n], self.cols)
                    w = w_NK[rows[n], lane, None].float() if self.weighted else 1.0
                    out_NH.index_add_(0, rows[n], w * y)
                    rows_PH.append(y)
                    perm_NK[rows[n], lane] = torch.arange(placed, placed + n.numel(), dtype=torch.int32,
                                                          device=device)
                    placed += n.numel()
        if defer:
            gemm2 = torch.cat(rows_PH) if rows_PH else torch.zeros(0, self.hidden, device=device)
            weights = w_NK if self.weighted else torch.ones_like(w_NK)
            return UnfinalizedMoEOutput(gemm2.to(ACT_DTYPE), weights.to(ACT_DTYPE), perm_NK)
        if output is not None:
            return output.copy_(out_NH)
        return out_NH.to(ACT_DTYPE)


class SharedLinear(torch.nn.Module):
    """The scenario's shared expert ``x @ W`` in bf16, as a model builds its shared MLP: over
    this TP rank's slice of the contraction dimension, ``shard = (tp_rank, tp_size)`` (a
    partial sum the model's TP all-reduce completes), or whole where the model replicates it
    (``(0, 1)``: vLLM's sequence-parallel layers, SGLang's shared expert under an all-to-all)."""

    def __init__(self, weight: LinearMap, shard: tuple[int, int]):
        super().__init__()
        part = weight.hidden // shard[1]
        self.weight, self.cols = weight, slice(shard[0] * part, (shard[0] + 1) * part)

    def forward(self, x_tH: torch.Tensor) -> torch.Tensor:
        return self.weight(x_tH[:, self.cols], self.cols).to(x_tH.dtype)
