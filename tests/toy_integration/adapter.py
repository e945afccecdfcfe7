"""The toy integration on a rank: impl's session, each layer behind :class:`ToyLayer`."""

from __future__ import annotations

import torch


class ToySession:
    def __init__(self, inner):
        self.inner = inner

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts):
        return ToyLayer(self.inner.build_layer(index, fmt, max_num_tokens, experts))

    def forward_pass(self, num_tokens: int):
        return self.inner.forward_pass(num_tokens)

    def layer_call(self, num_tokens: int):
        return self.inner.layer_call(num_tokens)


class ToyLayer:
    def __init__(self, inner):
        self.inner = inner
        self.sequence_parallel, self.reduce_pending = inner.sequence_parallel, inner.reduce_pending
        self.output_is_reduced, self.topk_indices_dtype = inner.output_is_reduced, inner.topk_indices_dtype

    def __call__(self, x_TH: torch.Tensor, w_TK: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
        out_TH = self.inner(x_TH, w_TK, ids_TK)
        return out_TH
