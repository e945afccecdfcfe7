"""The fused-experts kernel stand-in of one EP rank (what the integration hands its received
rows to), independent of ``impl``: it reads the activations as each format defines them.

Legend: N rows this EP rank received, K top_k, H hidden.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from testbed.scenario.reference import ACT_DTYPE, dequantize, lane_keys


class Experts:
    """Per received row, the router-weighted sum of this rank's experts over the row's
    lanes, in bf16; ``lanes`` counts every ``(expert, weight bits)`` lane it computed.

    Parameters
    ----------
    fmt : str
        The layer's activation format (``bf16``, ``nvfp4``, ``mxfp8``, ``fp8_block``).
    hidden : int
    own : range
        The experts this EP rank owns.
    weight : callable
        ``weight(e) -> [H, H] fp32``: expert ``e`` is the linear map ``x @ W_e``.
    weighted : bool
        Apply the router weights (False when prepare already scaled the activations by them).
    """

    def __init__(self, fmt: str, hidden: int, own: range, weight: Callable[[int], torch.Tensor],
                 weighted: bool = True):
        self.fmt, self.hidden, self.own, self.weight, self.weighted = fmt, hidden, own, weight, weighted
        self.lanes: Counter = Counter()

    def __call__(self, prep) -> torch.Tensor:
        ids_NK, w_NK = prep.topk_ids, prep.topk_weights
        device = ids_NK.device
        out_NH = torch.zeros(ids_NK.size(0), self.hidden, device=device)
        self.lanes.update(lane_keys(ids_NK.cpu(), w_NK.cpu(), self.own))
        mine_NK = (ids_NK >= self.own.start) & (ids_NK < self.own.stop)
        # Only rows that hold one of this rank's experts are read: the rest are stale or padding.
        rows = mine_NK.any(1).nonzero().flatten()
        if rows.numel():
            scale = None if prep.a1q_scale is None else prep.a1q_scale[rows]
            x_nH = dequantize(self.fmt, prep.a1q[rows], scale, self.hidden)
            for e in self.own:
                n, lane = (ids_NK[rows] == e).nonzero(as_tuple=True)
                if n.numel():
                    y = x_nH[n] @ self.weight(e).to(device)
                    w = w_NK[rows[n], lane, None].float() if self.weighted else 1.0
                    out_NH.index_add_(0, rows[n], w * y)
        return out_NH.to(ACT_DTYPE)
