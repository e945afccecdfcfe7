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


def runtime_max_tokens_per_rank(local_num_tokens: int) -> int:
    """Max over DP ranks when the forward context has the counts, else the local count.

    At least 1: the kernels reject a runtime max of 0 even when no rank has tokens."""
    counts = num_tokens_across_dp()
    if counts is not None and local_num_tokens > max(counts):
        raise ValueError(f"this rank has {local_num_tokens} tokens but num_tokens_across_dp is "
                         f"{list(counts)}: the forward context is stale")
    return max(max(counts) if counts is not None else local_num_tokens, 1)
