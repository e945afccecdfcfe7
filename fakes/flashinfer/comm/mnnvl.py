"""Fake ``flashinfer.comm.mnnvl``: the communicator interface FlashInfer calls for its
collective set-up, and NVLink "fabric" memory backed by the testbed's shared-memory arena.

A ``MnnvlMemory`` of ``size`` bytes is one arena segment that every rank of the
communicator maps; ``as_torch_strided_tensor`` views it as ``[comm_size, size]`` with a
row stride rounded up to the allocation granularity, as the real one is (its stride is
the fabric page, not ``size``): code that assumes a contiguous workspace breaks here too.
"""

from __future__ import annotations

import abc
import itertools
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Protocol, runtime_checkable

import torch

from fakes.flashinfer import profiles
from fakes.flashinfer.comm.mapping import Mapping
from fakes.arena import ShmArena

_ALLOCATION_GRANULARITY = 2 << 20  # the CUDA VMM granularity; the fake's row stride unit


class _CommBackendABC(abc.ABC):
    """What FlashInfer needs from a communicator (mpi4py's method names); before 0.6.16 an
    ABC, so a subclass missing a method fails when instantiated."""

    @abc.abstractmethod
    def Get_rank(self) -> int: ...

    @abc.abstractmethod
    def Get_size(self) -> int: ...

    @abc.abstractmethod
    def allgather(self, data: Any) -> list: ...

    @abc.abstractmethod
    def bcast(self, data: Any, root: int) -> Any: ...

    @abc.abstractmethod
    def barrier(self) -> None: ...

    @abc.abstractmethod
    def Split(self, color: int, key: int) -> "CommBackend": ...


@runtime_checkable
class _CommBackendProtocol(Protocol):
    """0.6.16 on: a runtime-checkable Protocol (``flashinfer.comm.abstractions``), so
    ``isinstance`` is structural and a subclass missing a method inherits a stub returning None."""

    def Get_rank(self) -> int: ...

    def Get_size(self) -> int: ...

    def allgather(self, data: Any) -> tuple[Any, ...]: ...

    def bcast(self, data: Any, root: int) -> Any: ...

    def barrier(self) -> None: ...

    def Split(self, color: int, key: int) -> "CommBackend": ...


for _cls in (_CommBackendABC, _CommBackendProtocol):
    _cls.__name__ = _cls.__qualname__ = "CommBackend"


@dataclass
class MnnvlConfig:
    """Configuration for MNNVL memory management."""

    comm_backend: Optional[CommBackend] = None
    allocation_granularity: int = 0
    fabric_page_size: int = 1 << 29


@dataclass
class _AllocationRecord:
    comm: CommBackend
    comm_size: int
    comm_rank: int
    segment: torch.Tensor  # the whole uint8 segment, [comm_size * rank_stride]
    rank_stride: int
    mapped: bool = True


class MnnvlMemory:
    """Memory every rank of the communicator can read and write (one-sided puts)."""

    initialized: bool = False
    comm: Optional[CommBackend] = None
    config: Optional[MnnvlConfig] = None
    allocated_map: dict[int, _AllocationRecord] = {}
    _watched_arena: Optional[ShmArena] = None
    _next_ptr = itertools.count(1 << 40, 1 << 32)

    def __init__(self, mapping: Mapping, size: int):
        self.mapping = mapping
        self.segment_size = size
        self.ptr, self.rank_stride = MnnvlMemory.open_mnnvl_memory(mapping, size)

    def as_torch_strided_tensor(self, dtype: torch.dtype) -> torch.Tensor:
        """``[comm_size, segment_size / itemsize]`` view whose row stride is the rank stride."""
        record = MnnvlMemory.allocated_map[self.ptr]
        item = torch.empty((), dtype=dtype).element_size()
        return torch.as_strided(
            record.segment.view(dtype),
            (record.comm_size, self.segment_size // item),
            (record.rank_stride // item, 1),
        )

    @staticmethod
    def initialize() -> None:
        MnnvlMemory.initialized = True

    @staticmethod
    def set_comm_from_config(mapping: Mapping, config: MnnvlConfig = None) -> None:
        if config is None or config.comm_backend is None:
            raise RuntimeError(
                "fake MnnvlMemory has no MPI fallback: pass MnnvlConfig(comm_backend=...)"
            )
        MnnvlMemory.config = config
        MnnvlMemory.comm = config.comm_backend.Split(
            mapping.pp_rank * mapping.cp_size + mapping.cp_rank, mapping.tp_rank
        )

    @staticmethod
    def get_comm(mapping: Mapping) -> CommBackend:
        if MnnvlMemory.comm is None:
            raise RuntimeError(
                "MnnvlMemory has no communicator: the real one would fall back to MPI "
                "(mpi4py); pass mnnvl_config=MnnvlConfig(comm_backend=...) instead"
            )
        return MnnvlMemory.comm

    @staticmethod
    def open_mnnvl_memory(mapping: Mapping, size: int) -> tuple[int, int]:
        comm = MnnvlMemory.get_comm(mapping)
        comm_rank, comm_size = comm.Get_rank(), comm.Get_size()
        sizes = comm.allgather(size)
        assert len(sizes) == comm_size
        assert all(x == size for x in sizes), "Not all rank allocating same size."
        arena = ShmArena.current()
        stride = -(-size // _ALLOCATION_GRANULARITY) * _ALLOCATION_GRANULARITY
        key = comm.bcast(f"mnnvl-{uuid.uuid4().hex[:16]}" if comm_rank == 0 else None, 0)
        if comm_rank == 0:
            segment = arena.create(key, comm_size * stride)
        comm.barrier()
        if comm_rank != 0:
            segment = arena.attach(key)
        comm.barrier()  # every rank mapped it before anyone may drop the name
        if comm_rank == 0:
            arena.unlink(key)  # mappings live on; nothing is left if a rank dies later
        ptr = next(MnnvlMemory._next_ptr)
        MnnvlMemory.allocated_map[ptr] = _AllocationRecord(comm, comm_size, comm_rank, segment, stride)
        if MnnvlMemory._watched_arena is not arena:
            MnnvlMemory._watched_arena = arena
            arena.on_close(MnnvlMemory._forget_scenario)
        return ptr, stride

    @staticmethod
    def get_allocation_granularity(dev_id):
        return _ALLOCATION_GRANULARITY

    @staticmethod
    def supports_mnnvl():
        return True  # the fake stands in for a multi-node NVLink fabric

    @staticmethod
    def support_nvlink(need_all_up=True):
        return True

    @staticmethod
    def get_allocation_prop(dev_id):
        raise NotImplementedError("the CPU fake has no CUmemAllocationProp: it maps shared memory, not CUDA VMM")

    @staticmethod
    def new_mnnvl_memory_address(mapping, size):
        raise NotImplementedError("the CPU fake reserves no CUDA virtual addresses: use MnnvlMemory(mapping, size)")

    @staticmethod
    def close_mnnvl_memory(ptr: int) -> None:
        MnnvlMemory.allocated_map.pop(ptr, None)

    @staticmethod
    def _forget_scenario() -> None:
        """The scenario's processes and segments are gone: drop every handle to them."""
        MnnvlMemory.allocated_map.clear()
        MnnvlMemory._watched_arena = None
        MnnvlMemory.comm = None
        MnnvlMemory.config = None
        MnnvlMemory.initialized = False
        for hook in _SCENARIO_END_HOOKS:
            hook()


_SCENARIO_END_HOOKS: list = []


def on_scenario_end(hook) -> None:
    """Register ``hook()`` to run when the memory of a scenario is forgotten (workspace caches)."""
    _SCENARIO_END_HOOKS.append(hook)


__fake_only__ = ("on_scenario_end",)


def __getattr__(name: str):
    if name == "CommBackend":
        return _CommBackendProtocol if profiles.active().eplb_and_rank_mask else _CommBackendABC
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"CommBackend"})
