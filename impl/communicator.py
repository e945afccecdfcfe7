"""FlashInfer's ``CommBackend`` over one torch process group (vLLM's ``CustomCommunicator``).

FlashInfer uses it for its collective set-up: exchanging workspace handles (``allgather``,
``bcast``) and the barrier after a workspace is initialized. Every call runs on the group
the communicator was given, never on the world: with pipeline parallelism each stage has
its own EP group, and a world-wide collective there would pair ranks of different stages.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist

from typing import Optional

from impl.backend import FlashInferAPI, default_gpus_per_node


def make_communicator(api: FlashInferAPI, group: dist.ProcessGroup):
    """A ``CommBackend`` of ``api`` whose collectives all run on ``group``.

    Parameters
    ----------
    api : FlashInferAPI
        The FlashInfer whose ``CommBackend`` interface the result implements.
    group : torch.distributed.ProcessGroup
        A CPU (gloo) group: the objects exchanged are Python objects.
    """
    return _communicator_class(api.CommBackend)(group)


@functools.cache
def _communicator_class(base: type) -> type:
    return type("GroupCommunicator", (_GroupCommunicator, base), {})


class _GroupCommunicator:
    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group

    def Get_rank(self) -> int:
        return dist.get_rank(self.group)

    def Get_size(self) -> int:
        return dist.get_world_size(self.group)

    def allgather(self, data: Any) -> list:
        out: list = [None] * self.Get_size()
        dist.all_gather_object(out, data, group=self.group)
        return out

    def bcast(self, data: Any, root: int) -> Any:
        box = [data]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, root), group=self.group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def Split(self, color: int, key: int):
        """Only the trivial split is supported: every rank of the group passes the same color
        (FlashInfer's split by ``pp_rank * cp_size + cp_rank`` of a mapping that spans just
        this EP group); the result is this communicator, in key order."""
        pairs = self.allgather((color, key))
        colors = sorted({c for c, _ in pairs})
        if len(colors) != 1:
            raise ValueError(
                f"Split(color={color}) over a group whose ranks passed colors {colors}: this "
                "communicator wraps one process group and cannot split it; build the mapping "
                "over the EP group so every rank has the same pp/cp coordinates"
            )
        keys = [k for _, k in pairs]
        if keys != sorted(keys):
            raise ValueError(f"Split(key={key}): keys {keys} would reorder the group's ranks")
        return self


class EPGroupManager:
    """What every all-to-all manager knows about its EP group (vLLM's ``All2AllManagerBase``).

    Parameters
    ----------
    api : FlashInferAPI
        The FlashInfer to drive.
    cpu_group : ProcessGroup
        The EP group (gloo): FlashInfer's set-up collectives run on it and on nothing wider.
    gpus_per_node : int, optional
        For FlashInfer's ``Mapping``; default: the visible CUDA devices (the EP size on CPU).
    """

    def __init__(self, api: FlashInferAPI, cpu_group: dist.ProcessGroup, gpus_per_node: Optional[int] = None):
        self.api = api
        self.cpu_group = cpu_group
        self.rank = dist.get_rank(cpu_group)
        self.world_size = dist.get_world_size(cpu_group)
        self.gpus_per_node = gpus_per_node or default_gpus_per_node(self.world_size)
        self.initialized = False
        self.mapping: Any = None

    def mnnvl_config(self, **kwargs):
        """FlashInfer's ``MnnvlConfig`` with a communicator over this EP group."""
        return self.api.MnnvlConfig(comm_backend=make_communicator(self.api, self.cpu_group), **kwargs)
