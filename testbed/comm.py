"""A FlashInfer ``CommBackend`` over one torch process group, for tests and benchmarks of
the fake (the integration's own communicator lives in ``impl/``)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from fakes.flashinfer.comm.mapping import Mapping
from fakes.flashinfer.comm.mnnvl import CommBackend, MnnvlConfig


class GroupComm(CommBackend):
    """Every collective runs on ``group``, never on the world."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def Get_rank(self) -> int:
        return dist.get_rank(self.group)

    def Get_size(self) -> int:
        return dist.get_world_size(self.group)

    def allgather(self, data: Any) -> list:
        out = [None] * self.Get_size()
        dist.all_gather_object(out, data, group=self.group)
        return out

    def bcast(self, data: Any, root: int) -> Any:
        box = [data]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, root), group=self.group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def Split(self, color: int, key: int) -> "GroupComm":
        # The group handed in is already the EP group of this pipeline stage.
        return self


def ep_mapping_and_config(ctx) -> tuple[Mapping, MnnvlConfig]:
    """FlashInfer's view of this rank's EP group, built as vLLM builds it
    (``tp_size = moe_ep_size = ep_size``), with a communicator over that group."""
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    mapping = Mapping(world_size=R, rank=me, tp_size=R, moe_ep_size=R)
    return mapping, MnnvlConfig(comm_backend=GroupComm(ctx.groups["ep"]))
