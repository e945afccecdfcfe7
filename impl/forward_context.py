"""Per-forward facts prepare needs from outside the layer (vLLM's ``dp_metadata``).

The runtime max tokens per rank of a dispatch is the max over the DP ranks of their token
counts: every EP rank must pass the same value, so it comes from the forward's metadata,
not from the local batch.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional, Sequence

_TOKENS_ACROSS_DP: contextvars.ContextVar[Optional[tuple[int, ...]]] = contextvars.ContextVar(
    "num_tokens_across_dp", default=None
)
_SP_SIZES: contextvars.ContextVar[Optional[tuple[int, ...]]] = contextvars.ContextVar(
    "sequence_parallel_sizes", default=None
)


@contextlib.contextmanager
def forward_context(num_tokens_across_dp: Optional[Sequence[int]]) -> Iterator[None]:
    """Make ``num_tokens_across_dp`` (one count per DP rank) visible to prepare in this block."""
    counts = None if num_tokens_across_dp is None else tuple(int(n) for n in num_tokens_across_dp)
    if counts is not None and (not counts or min(counts) < 0):
        raise ValueError(f"num_tokens_across_dp must be non-negative counts, got {counts}")
    token = _TOKENS_ACROSS_DP.set(counts)
    try:
        yield
    finally:
        _TOKENS_ACROSS_DP.reset(token)


def num_tokens_across_dp() -> Optional[tuple[int, ...]]:
    return _TOKENS_ACROSS_DP.get()


def sp_chunk(num_tokens: int, tp_size: int, tp_rank: int) -> range:
    """The rows of a DP rank's ``num_tokens`` that TP rank ``tp_rank`` routes under
    sequence-parallel MoE: chunks of ``ceil(num_tokens / tp_size)``, the last ones short or
    empty (vLLM pads them with zero rows instead; the runtime max is the same)."""
    chunk = -(-num_tokens // tp_size)
    return range(min(tp_rank * chunk, num_tokens), min((tp_rank + 1) * chunk, num_tokens))


@contextlib.contextmanager
def sequence_parallel_sizes(tp_size: int) -> Iterator[None]:
    """Inside the forward context: each EP rank's (``dp_rank * tp_size + tp_rank``) token
    count under sequence-parallel MoE (vLLM's ``sp_local_sizes``)."""
    counts = num_tokens_across_dp()
    if counts is None:
        raise RuntimeError("sequence-parallel MoE needs num_tokens_across_dp in the forward context")
    token = _SP_SIZES.set(tuple(len(sp_chunk(n, tp_size, t)) for n in counts for t in range(tp_size)))
    try:
        yield
    finally:
        _SP_SIZES.reset(token)


def sequence_parallel_active() -> bool:
    return _SP_SIZES.get() is not None


def token_counts_per_rank() -> Optional[tuple[int, ...]]:
    """What each rank of the dispatching group holds: the sequence-parallel sizes per EP rank
    inside :func:`sequence_parallel_sizes`, else the counts per DP rank (None outside a
    forward context)."""
    sp = _SP_SIZES.get()
    return sp if sp is not None else num_tokens_across_dp()


def runtime_max_tokens_per_rank(local_num_tokens: int) -> int:
    """Max over the dispatching ranks (:func:`token_counts_per_rank`) when the forward
    context has the counts, else the local count.

    At least 1: the kernels reject a runtime max of 0 even when no rank has tokens."""
    counts = token_counts_per_rank()
    if counts is not None and local_num_tokens > max(counts):
        raise ValueError(f"this rank has {local_num_tokens} tokens but num_tokens_across_dp is "
                         f"{list(counts)}: the forward context is stale")
    return max(max(counts) if counts is not None else local_num_tokens, 1)
