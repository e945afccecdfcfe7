"""Fake ``flashinfer.comm.mapping.Mapping``: TensorRT-LLM's rank layout as FlashInfer ships
it, with the real constructor's checks, rank formulas and group lists (including their quirk:
the MoE groups of pipeline stage ``i`` start at ``i * tp_size`` whatever ``cp_size`` is)."""

from __future__ import annotations

import torch


def _groups(blocks: int, stride: int, count: int, size: int, step: int, start=lambda b, c: 0) -> list[list[int]]:
    """``blocks x count`` groups of ``size`` ranks ``step`` apart, the c-th of block b starting
    at ``b * stride + start(b, c)``."""
    return [[b * stride + start(b, c) + step * n for n in range(size)] for b in range(blocks) for c in range(count)]


class Mapping:
    """Rank layout as FlashInfer sees it (TensorRT-LLM's Mapping, MoE subset)."""

    def __init__(
        self,
        world_size=1,
        rank=0,
        gpus_per_node=8,
        *,
        cp_size=1,
        cp_config=None,
        tp_size=1,
        pp_size=1,
        moe_cluster_size=-1,
        moe_tp_size=-1,
        moe_ep_size=-1,
        attn_tp_size=-1,
        attn_cp_size=-1,
        auto_parallel=False,
        enable_attention_dp=False,
    ):
        if moe_cluster_size == -1:
            moe_cluster_size = 1
        if moe_tp_size == -1 and moe_ep_size == -1:
            moe_tp_size = tp_size // moe_cluster_size
            moe_ep_size = 1
        elif moe_tp_size == -1:
            moe_tp_size = tp_size // (moe_ep_size * moe_cluster_size)
        elif moe_ep_size == -1:
            moe_ep_size = tp_size // (moe_tp_size * moe_cluster_size)
        if attn_tp_size == -1 and attn_cp_size == -1:
            attn_tp_size, attn_cp_size = tp_size * cp_size, 1
        elif attn_tp_size == -1:
            attn_tp_size = cp_size * tp_size // attn_cp_size
        elif attn_cp_size == -1:
            attn_cp_size = cp_size * tp_size // attn_tp_size
        if attn_cp_size != 1:
            raise ValueError(
                f"attn_cp_size must be 1 for now, but got {attn_tp_size}, {attn_cp_size}."
            )
        if auto_parallel:
            if tp_size != 1 or pp_size != 1:
                raise ValueError(
                    "When auto parallel is enabled, tp_size, pp_size, cp_size must be 1, "
                    f"but got {tp_size}, {pp_size}, {cp_size}."
                )
        elif tp_size * pp_size * cp_size != world_size:
            raise ValueError(
                "world_size must equal to tp_size * pp_size * cp_size, but got "
                f"{world_size} != {tp_size} * {pp_size} * {cp_size}."
            )
        if moe_tp_size * moe_ep_size * moe_cluster_size != tp_size:
            raise ValueError(
                "tp_size must equal to moe_tp_size * moe_ep_size * moe_cluster_size, but got "
                f"{tp_size} != {moe_tp_size} * {moe_ep_size} * {moe_cluster_size}"
            )
        if attn_tp_size * attn_cp_size != tp_size * cp_size:
            raise ValueError(
                "tp_size * cp_size must equal to attn_tp_size * attn_cp_size, but got "
                f"{tp_size} * {cp_size} != {attn_tp_size} * {attn_cp_size}"
            )
        if moe_ep_size != 1 and cp_size > 1:
            raise NotImplementedError("CP don't support MoE tp/ep yet")
        self.world_size = world_size
        self.enable_attention_dp = enable_attention_dp
        self.rank = rank
        self.gpus_per_node = gpus_per_node
        self.tp_size = tp_size
        self.cp_size = cp_size
        self.cp_config = cp_config if cp_config is not None else {}
        self.pp_size = pp_size
        self.moe_tp_size = moe_tp_size
        self.moe_ep_size = moe_ep_size
        self.moe_cluster_size = moe_cluster_size
        self.attn_tp_size = attn_tp_size
        self.attn_cp_size = attn_cp_size
        self.auto_parallel = auto_parallel
        if moe_cluster_size > 1:
            assert moe_ep_size == 1
        tc, ce = tp_size * cp_size, moe_cluster_size * moe_ep_size
        self.pp_groups = _groups(1, 0, tc, pp_size, tc, lambda b, c: c)
        self.cp_groups = _groups(pp_size, tc, tp_size, cp_size, tp_size, lambda b, c: c)
        self.tp_groups = _groups(pp_size, tc, cp_size, tp_size, 1, lambda b, c: c * tp_size)
        self.moe_tp_groups = _groups(pp_size, tp_size, ce, moe_tp_size, ce, lambda b, c: c)
        self.moe_cluster_groups = _groups(pp_size, tp_size, moe_tp_size, ce, 1, lambda b, c: c * ce)
        self.moe_ep_groups = _groups(
            pp_size, tp_size, moe_tp_size * moe_cluster_size, moe_ep_size, 1,
            lambda b, c: (c // moe_cluster_size) * ce + (c % moe_cluster_size) * moe_ep_size)

    @property
    def rank(self) -> int:
        return self._rank

    @rank.setter
    def rank(self, rank: int):
        # The real check's range test can never be true (`rank < 0 and rank >= world_size`).
        if not self.enable_attention_dp and not isinstance(rank, int):
            raise ValueError(f"Rank should be an integer between 0 and {self.world_size - 1}, but got {rank}.")
        self._rank = rank

    @property
    def tp_rank(self) -> int:
        return 0 if self.auto_parallel else self.rank % self.tp_size

    @property
    def pp_rank(self) -> int:
        return 0 if self.auto_parallel else self.rank // (self.tp_size * self.cp_size)

    @property
    def cp_rank(self) -> int:
        return 0 if self.auto_parallel else self.rank % (self.tp_size * self.cp_size) // self.tp_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank // (self.moe_ep_size * self.moe_cluster_size)

    @property
    def moe_cluster_rank(self) -> int:
        return self.tp_rank % self.moe_cluster_size

    @property
    def moe_ep_rank(self) -> int:
        return self.tp_rank % self.moe_ep_size

    @property
    def tp_group(self) -> list[int]:
        return self.tp_groups[self.pp_rank * self.cp_size + self.cp_rank]

    @property
    def pp_group(self) -> list[int]:
        return self.pp_groups[self.cp_rank * self.tp_size + self.tp_rank]

    @property
    def cp_group(self) -> list[int]:
        return self.cp_groups[self.pp_rank * self.tp_size + self.tp_rank]

    @property
    def moe_tp_group(self) -> list[int]:
        return self.moe_tp_groups[(self.pp_rank * self.moe_cluster_size + self.moe_cluster_rank)
                                  * self.moe_ep_size + self.moe_ep_rank]

    @property
    def moe_cluster_group(self) -> list[int]:
        return self.moe_cluster_groups[self.pp_rank * self.moe_tp_size + self.moe_tp_rank]

    @property
    def moe_ep_group(self) -> list[int]:
        return self.moe_ep_groups[(self.pp_rank * self.moe_tp_size + self.moe_tp_rank)
                                  * self.moe_cluster_size + self.moe_cluster_rank]

    @property
    def node_rank(self) -> int:
        return self.get_node_rank(self.rank)

    @property
    def local_rank(self) -> int:
        return self.get_local_rank(self.rank)

    def get_node_rank(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def get_local_rank(self, rank: int) -> int:
        return rank % self.gpus_per_node

    def is_multi_node(self) -> bool:
        return self.world_size > self.gpus_per_node

    def has_cp(self) -> bool:
        return self.cp_size > 1

    def has_tp(self) -> bool:
        return self.tp_size > 1

    def has_pp(self) -> bool:
        return self.pp_size > 1

    def has_moe_cluster(self) -> bool:
        return self.moe_cluster_size > 1

    def has_moe_tp(self) -> bool:
        return self.moe_tp_size > 1

    def has_moe_ep(self) -> bool:
        return self.moe_ep_size > 1

    def is_first_pp_rank(self) -> bool:
        return self.pp_rank == 0

    def is_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def is_second_last_pp_rank(self) -> bool:
        return self.pp_rank == self.pp_size - 2

    def prev_pp_rank(self) -> int:
        return (self.rank - self.tp_size * self.cp_size) % self.world_size

    def next_pp_rank(self) -> int:
        return (self.rank + self.tp_size * self.cp_size) % self.world_size

    def pp_layers(self, num_layers: int) -> list[int]:
        return torch.tensor_split(torch.arange(num_layers), self.pp_size)[self.pp_rank].tolist()

    def ep_experts(self, num_experts: int) -> list[int]:
        assert self.cp_size == 1
        per_rank = num_experts // self.moe_ep_size
        return list(range(self.moe_ep_rank * per_rank, (self.moe_ep_rank + 1) * per_rank))

    @classmethod
    def from_dict(cls, mapping: dict) -> "Mapping":
        return cls(**mapping)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in (
            "world_size", "rank", "gpus_per_node", "cp_size", "tp_size", "pp_size", "moe_tp_size",
            "moe_cluster_size", "moe_ep_size", "attn_tp_size", "attn_cp_size", "auto_parallel")}

    def _key(self) -> tuple:
        return (self.world_size, self.rank, self.gpus_per_node, self.cp_size, self.tp_size,
                self.moe_cluster_size, self.pp_size, self.moe_tp_size, self.moe_ep_size,
                self.attn_tp_size, self.attn_cp_size, self.auto_parallel)

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())
