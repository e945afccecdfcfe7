"""Fake ``flashinfer.comm.comm_backend``: ``TorchDistBackend``, the ``CommBackend`` over a
torch.distributed group that ``moe_ep`` uses when given no communicator (no CUDA involved)."""

from __future__ import annotations

from typing import Any


class TorchDistBackend:
    """``CommBackend`` adapter over torch.distributed (object collectives on ``group``)."""

    def __init__(self, group: Any | None = None):
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized. "
                               "Please call torch.distributed.init_process_group() first.")
        self._group = group
        self._dist = dist

    def Get_rank(self) -> int:
        return self._dist.get_rank(self._group)

    def Get_size(self) -> int:
        return self._dist.get_world_size(self._group)

    def allgather(self, data: Any) -> tuple[Any, ...]:
        out = [None] * self.Get_size()
        self._dist.all_gather_object(out, data, group=self._group)
        return tuple(out)

    def bcast(self, data: Any, root: int) -> Any:
        objects = [data]
        src = self._dist.get_global_rank(self._group, root) if self._group is not None else root
        self._dist.broadcast_object_list(objects, src=src, group=self._group)
        return objects[0]

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def Split(self, color: int, key: int) -> "TorchDistBackend":
        """MPI_Comm_split: every rank builds the same partition (colors ascending, ranks by
        ``(key, rank)``), as torch names sub-groups by a global counter."""
        info = self.allgather((color, key, self.Get_rank()))
        partition = [[r for _, r in sorted((k, r) for c, k, r in info if c == col)]
                     for col in sorted({c for c, _, _ in info})]
        group, _ = self._dist.new_subgroups_by_enumeration(partition)
        self.barrier()
        return TorchDistBackend(group=group)
