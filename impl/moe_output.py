"""The MoE output contract (vLLM's ``moe_output.py``, seed 004) and its one consumer.

Legend: T tokens, K top_k, H hidden, P permuted rows (padded; padding is never read).

A layer run with ``reduce_results=False`` returns a :class:`MoEOutput` whose reduce is still
open; the routed part may be an :class:`UnfinalizedMoEOutput` (the expert kernel stopped
after GEMM2, ``do_finalize=False``), so that the top-k reduce, the shared-expert add, the
routed scaling factor and the TP all-reduce run as one step: :func:`finalize_moe_output`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.distributed as dist

ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class UnfinalizedMoEOutput:
    """An expert kernel's output before its top-k reduce.

    Attributes
    ----------
    gemm2_permuted : torch.Tensor
        ``[P, H]`` unweighted GEMM2 rows permuted by expert, contiguous along H; rows no
        lane points at are padding.
    expert_weights : torch.Tensor
        ``[T, K]`` router weights in the activation dtype (a wider buffer would be read as
        garbage by a fused consumer).
    expanded_idx_to_permuted_idx : torch.Tensor
        ``[T, K]`` int32: lane ``(t, k)``'s row of ``gemm2_permuted``, -1 when its expert is
        not on this rank.
    """

    gemm2_permuted: torch.Tensor
    expert_weights: torch.Tensor
    expanded_idx_to_permuted_idx: torch.Tensor

    def validate(self, activation_dtype: torch.dtype, num_tokens: int, top_k: int, hidden: int) -> None:
        """ValueError naming the field and the rule it breaks."""
        g, w, m = self.gemm2_permuted, self.expert_weights, self.expanded_idx_to_permuted_idx
        if g.dim() != 2 or g.size(1) != hidden:
            raise ValueError(f"gemm2_permuted must be [rows, hidden={hidden}], got {tuple(g.shape)}")
        if g.dtype != activation_dtype:
            raise ValueError(f"gemm2_permuted must be in the activation dtype {activation_dtype}, got {g.dtype}")
        if g.size(0) and g.stride(1) != 1:
            raise ValueError(f"gemm2_permuted must be contiguous along hidden (stride 1), got strides {g.stride()}")
        if w.dtype != activation_dtype:
            raise ValueError(f"expert_weights must match the activation dtype {activation_dtype} exactly, "
                             f"got {w.dtype}")
        if tuple(w.shape) != (num_tokens, top_k):
            raise ValueError(f"expert_weights must be [num_tokens, top_k] = [{num_tokens}, {top_k}], "
                             f"got {tuple(w.shape)}")
        if m.dtype != torch.int32:
            raise ValueError(f"expanded_idx_to_permuted_idx must be int32, got {m.dtype}")
        if tuple(m.shape) != (num_tokens, top_k):
            raise ValueError(f"expanded_idx_to_permuted_idx must be [num_tokens, top_k] = [{num_tokens}, {top_k}], "
                             f"got {tuple(m.shape)}")
        if m.numel() and (int(m.min()) < -1 or int(m.max()) >= g.size(0)):
            raise ValueError(f"expanded_idx_to_permuted_idx must be -1 or a row of gemm2_permuted "
                             f"[0, {g.size(0)}), got values in [{int(m.min())}, {int(m.max())}]")


@dataclass(frozen=True)
class MoEOutput:
    """A MoE layer's output with its reduce still open.

    Attributes
    ----------
    routed : torch.Tensor or UnfinalizedMoEOutput
        ``[T, H]`` routed-expert output, or its unfinalized form.
    shared_output : torch.Tensor, optional
        ``[T, H]`` shared-expert output, added by whoever finalizes.
    routed_scaling_factor : float
        Applied to the routed output before the shared add (1.0 when the router weights
        already carry it).
    """

    routed: Union[torch.Tensor, UnfinalizedMoEOutput]
    shared_output: Optional[torch.Tensor] = None
    routed_scaling_factor: float = 1.0

    def validate(self, activation_dtype: torch.dtype, num_tokens: int, top_k: int, hidden: int) -> None:
        """ValueError naming the field and the rule it breaks."""
        if activation_dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"activation_dtype must be one of {ACTIVATION_DTYPES}, got {activation_dtype}")
        if isinstance(self.routed, UnfinalizedMoEOutput):
            if num_tokens == 0:
                raise ValueError("routed: a rank with 0 tokens must return the finalized (empty) tensor, "
                                 "not an UnfinalizedMoEOutput")
            self.routed.validate(activation_dtype, num_tokens, top_k, hidden)
        elif isinstance(self.routed, torch.Tensor):
            _check_dense("routed", self.routed, activation_dtype, num_tokens, hidden)
        else:
            raise ValueError(f"routed must be a tensor or an UnfinalizedMoEOutput, got {type(self.routed).__name__}")
        if self.shared_output is not None:
            _check_dense("shared_output", self.shared_output, activation_dtype, num_tokens, hidden)
        f = self.routed_scaling_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise ValueError(f"routed_scaling_factor must be a finite number > 0, got {f!r}")


def _check_dense(name: str, t: torch.Tensor, dtype: torch.dtype, num_tokens: int, hidden: int) -> None:
    if tuple(t.shape) != (num_tokens, hidden):
        raise ValueError(f"{name} must be [num_tokens, hidden] = [{num_tokens}, {hidden}], got {tuple(t.shape)}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be in the activation dtype {dtype}, got {t.dtype}")


def topk_reduce(routed: UnfinalizedMoEOutput) -> torch.Tensor:
    """fp32 ``[T, H]``: ``sum_k w[t, k] * gemm2_permuted[map[t, k]]`` over the lanes on this rank."""
    m_TK = routed.expanded_idx_to_permuted_idx.long()
    T, K = m_TK.shape
    out_TH = torch.zeros(T, routed.gemm2_permuted.size(1), device=m_TK.device)
    hit = m_TK >= 0
    tok = torch.arange(T, device=m_TK.device)[:, None].expand(T, K)[hit]
    rows = routed.gemm2_permuted[m_TK[hit]].float()
    out_TH.index_add_(0, tok, routed.expert_weights.float()[hit][:, None] * rows)
    return out_TH


def finalize_moe_output(out: MoEOutput, *, activation_dtype: torch.dtype, num_tokens: int, top_k: int,
                        hidden: int, tp_group: Optional[dist.ProcessGroup], reduce: bool) -> torch.Tensor:
    """The one consumer: top-k reduce (when unfinalized), ``* routed_scaling_factor``, ``+
    shared_output``, then the TP all-reduce when ``reduce``, all in fp32.

    Parameters
    ----------
    out : MoEOutput
        Validated here against ``activation_dtype``, ``num_tokens``, ``top_k``, ``hidden``.
    tp_group : ProcessGroup, optional
        The all-reduce group; with one rank (or None) there is nothing to reduce.
    reduce : bool
        Whether the parts are per-TP-rank partial sums (the prepare/finalize's output is not
        already reduced).

    Returns
    -------
    torch.Tensor
        ``[T, H]`` in ``activation_dtype``.
    """
    out.validate(activation_dtype, num_tokens, top_k, hidden)
    routed = topk_reduce(out.routed) if isinstance(out.routed, UnfinalizedMoEOutput) else out.routed.float()
    y_TH = routed * float(out.routed_scaling_factor)
    if out.shared_output is not None:
        y_TH += out.shared_output.float()
    if reduce and tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(y_TH, group=tp_group)
    return y_TH.to(activation_dtype)
