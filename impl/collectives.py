"""Variable-size all-gather and reduce-scatter over a CPU (gloo) process group: rank ``i``
holds ``sizes[i]`` rows. Gloo has neither, so they are built from its all-gather (rows padded
to the largest count) and all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gatherv(t_N: torch.Tensor, sizes: tuple[int, ...], group: dist.ProcessGroup) -> torch.Tensor:
    """Concatenate every group rank's ``t`` (``sizes[i]`` rows on rank ``i``) in rank order."""
    if len(sizes) == 1:
        return t_N
    rows = max(max(sizes), 1)
    raw = t_N.view(torch.uint8) if t_N.element_size() == 1 else t_N  # gloo has no fp8
    padded = raw.new_zeros((rows,) + tuple(raw.shape[1:]))
    padded[: raw.size(0)] = raw
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    out = torch.cat([p[:n] for p, n in zip(parts, sizes)])
    return out.view(t_N.dtype) if t_N.element_size() == 1 else out


def reduce_scatterv(t_NH: torch.Tensor, sizes: tuple[int, ...], group: dist.ProcessGroup) -> torch.Tensor:
    """fp32 sum over the group of ``t``, this rank's ``sizes[rank]`` rows (gloo has no
    reduce_scatter: an all-reduce, then this rank's slice)."""
    total = t_NH.to(torch.float32, copy=True)  # the all-reduce works in place
    if len(sizes) == 1:
        return total
    dist.all_reduce(total, group=group)
    me = dist.get_rank(group)
    start = sum(sizes[:me])
    return total[start:start + sizes[me]]
