"""Fake ``flashinfer.comm.mnnvl``: the communicator interface FlashInfer calls for its
collective set-up, and NVLink "fabric" memory backed by the testbed's shared-memory arena.

A ``_MnnvlMemory`` of ``size`` bytes is one arena segment that every rank of the
communicator maps; ``as_torch_strided_tensor`` views it as ``[comm_size, size]`` with a
row stride rounded up to the allocation granularity, as the real one is (its stride is
the fabric page, not ``size``): code that assumes a contiguous workspace breaks here too.
"""

from __future__ import annotations

import abc
import functools
import itertools
import socket
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any, Optional, Protocol, runtime_checkable

import torch

from fakes.flashinfer import profiles
from fakes.flashinfer.comm.mapping import Mapping
from fakes import observe
from fakes.arena import ShmArena

if _TYPE_CHECKING:  # served per release by __getattr__ below
    CommBackend = Any

_ALLOCATION_GRANULARITY = 2 << 20  # the CUDA VMM granularity; the fake's row stride unit
SIDE_SLOTS = 4


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
    # The fake's own channel beside the fabric memory, never part of the workspace's bytes:
    # int32 [comm_size (reader), comm_size (writer), SIDE_SLOTS], for checks the real kernels lack.
    side: torch.Tensor
    address_range: object = None  # the reserved range it lives in
    mapped: bool = True


class _MnnvlMemory:
    """Memory every rank of the communicator can read and write (one-sided puts); the class
    state (``allocated_map``, ``comm``) is this base's, shared by every release's subclass."""

    initialized: bool = False
    comm: Optional[CommBackend] = None
    config: Optional[MnnvlConfig] = None
    allocated_map: dict[int, _AllocationRecord] = {}
    _watched_arena: Optional[ShmArena] = None
    _fabric_supported: Optional[bool] = None
    # The address range allocations are carved from (real: new_mnnvl_memory_address reserves one
    # of whole fabric pages when the next allocation does not fit, and drops it once it is empty).
    _range: object = None
    _range_left = 0
    _next_ptr = itertools.count(1 << 40, 1 << 32)

    def __init__(self, mapping: Mapping, size: int):
        self.mapping = mapping
        self.segment_size = size
        self.ptr, self.rank_stride = _MnnvlMemory.open_mnnvl_memory(mapping, size)

    def as_torch_strided_tensor(self, dtype: torch.dtype) -> torch.Tensor:
        """``[comm_size, segment_size / itemsize]`` view whose row stride is the rank stride."""
        record = _MnnvlMemory.allocated_map[self.ptr]
        item = torch.empty((), dtype=dtype).element_size()
        return torch.as_strided(
            record.segment.view(dtype),
            (record.comm_size, self.segment_size // item),
            (record.rank_stride // item, 1),
        )

    @staticmethod
    def initialize() -> None:
        _MnnvlMemory.initialized = True

    @staticmethod
    def set_comm_from_config(mapping: Mapping, config: MnnvlConfig = None) -> None:
        if config is None or config.comm_backend is None:
            raise RuntimeError(
                "fake _MnnvlMemory has no MPI fallback: pass MnnvlConfig(comm_backend=...)"
            )
        _MnnvlMemory.config = config
        _MnnvlMemory.comm = config.comm_backend.Split(
            mapping.pp_rank * mapping.cp_size + mapping.cp_rank, mapping.tp_rank
        )

    @staticmethod
    def get_comm(mapping: Mapping) -> CommBackend:
        if _MnnvlMemory.comm is None:
            raise RuntimeError(
                "_MnnvlMemory has no communicator: the real one would fall back to MPI "
                "(mpi4py); pass mnnvl_config=MnnvlConfig(comm_backend=...) instead"
            )
        return _MnnvlMemory.comm

    @staticmethod
    def open_mnnvl_memory(mapping: Mapping, size: int) -> tuple[int, int]:
        """The release's communicator calls, in its order (``testbed.contract.setup_calls``
        reads them from each release's ``mnnvl.py``; FABRIC path): rank, size and an all-gather
        of the sizes, then what the release does to reserve addresses and exchange the handles
        (:meth:`_exchange_handles`); no broadcast and no barrier. The fake's one handle is rank
        0's segment of every rank's row, created before rank 0 contributes it, so a peer
        attaches only after the exchange."""
        memory = _MnnvlMemory._release_class()
        given = _MnnvlMemory.get_comm(mapping)
        comm = observe.Noting(given)
        try:
            ptr, stride = _MnnvlMemory._open(memory, given, comm, size)
        finally:
            observe.emit("mnnvl_setup", calls=tuple(comm.calls))
        return ptr, stride

    @staticmethod
    def _open(memory, given, comm, size: int) -> tuple[int, int]:
        """:meth:`open_mnnvl_memory` with the integration's communicator ``given``, called
        through ``comm``."""
        comm_rank, comm_size = comm.Get_rank(), comm.Get_size()
        sizes = comm.allgather(size)
        assert len(sizes) == comm_size
        assert all(x == size for x in sizes), "Not all rank allocating same size."
        memory._before_reserving(comm)
        stride = -(-size // _ALLOCATION_GRANULARITY) * _ALLOCATION_GRANULARITY
        if stride > _MnnvlMemory._range_left:  # new_mnnvl_memory_address: a new address range
            comm.Get_size()
            page = (_MnnvlMemory.config.fabric_page_size if _MnnvlMemory.config else None) or MnnvlConfig.fabric_page_size
            _MnnvlMemory._range = object()
            _MnnvlMemory._range_left = -(-stride // page) * page
        _MnnvlMemory._range_left -= stride
        arena = ShmArena.current()
        key = None
        if comm_rank == 0:
            key = f"mnnvl-{uuid.uuid4().hex[:16]}"
            segment = arena.create(key, comm_size * stride)
            side = arena.create(key + "-side", comm_size * comm_size * SIDE_SLOTS * 4)
            # Peers attach right after the exchange, long before the scenario can end: the names
            # go when this rank's scenario does (mappings live on).
            arena.on_close(functools.partial(arena.unlink, key))
            arena.on_close(functools.partial(arena.unlink, key + "-side"))
        handles = memory._exchange_handles(comm, key)
        if comm_rank != 0:
            segment, side = arena.attach(handles[0]), arena.attach(handles[0] + "-side")
        ptr = next(_MnnvlMemory._next_ptr)
        _MnnvlMemory.allocated_map[ptr] = _AllocationRecord(
            given, comm_size, comm_rank, segment, stride, side.view(torch.int32).view(comm_size, comm_size, SIDE_SLOTS),
            _MnnvlMemory._range)
        if _MnnvlMemory._watched_arena is not arena:
            _MnnvlMemory._watched_arena = arena
            arena.on_close(_MnnvlMemory._forget_scenario)
        return ptr, stride

    @staticmethod
    def _release_class() -> type:
        """The active release's ``MnnvlMemory`` (its set-up steps differ)."""
        return __getattr__("MnnvlMemory")

    @staticmethod
    def _before_reserving(comm) -> None:
        """0.6.8 and 0.6.14 go straight on."""

    @staticmethod
    def _exchange_handles(comm, key):
        """0.6.8 and 0.6.14: every rank's exported handle, all-gathered in open_mnnvl_memory."""
        return comm.allgather(key)

    @staticmethod
    def _resolve_fabric_support(comm) -> bool:
        """Every rank's fabric support AND-reduced by an all-gather, once per scenario (the
        real one caches it for the process); the fake's fabric is always there."""
        if _MnnvlMemory._fabric_supported is None:
            _MnnvlMemory._fabric_supported = all(comm.allgather(True))
        return _MnnvlMemory._fabric_supported

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
        """What the real one asks CUDA VMM for: pinned device memory exported as a fabric handle."""
        return SimpleNamespace(type="CU_MEM_ALLOCATION_TYPE_PINNED",
                               location=SimpleNamespace(type="CU_MEM_LOCATION_TYPE_DEVICE", id=dev_id),
                               requestedHandleTypes="CU_MEM_HANDLE_TYPE_FABRIC")

    @staticmethod
    def new_mnnvl_memory_address(mapping, size):
        raise NotImplementedError("the CPU fake reserves no CUDA virtual addresses: use MnnvlMemory(mapping, size)")

    @staticmethod
    def close_mnnvl_memory(ptr: int) -> None:
        record = _MnnvlMemory.allocated_map.pop(ptr, None)
        if record is not None and not any(r.address_range is record.address_range
                                          for r in _MnnvlMemory.allocated_map.values()):
            if record.address_range is _MnnvlMemory._range:  # the range is empty: the next open reserves anew
                _MnnvlMemory._range, _MnnvlMemory._range_left = None, 0

    @staticmethod
    def _forget_scenario() -> None:
        """The scenario's processes and segments are gone: drop every handle to them."""
        _MnnvlMemory.allocated_map.clear()
        _MnnvlMemory._watched_arena = None
        _MnnvlMemory.comm = None
        _MnnvlMemory.config = None
        _MnnvlMemory.initialized = False
        _MnnvlMemory._fabric_supported = None
        _MnnvlMemory._range, _MnnvlMemory._range_left = None, 0
        for hook in _SCENARIO_END_HOOKS:
            hook()


_SCENARIO_END_HOOKS: list = []


def side_channel(workspace: torch.Tensor) -> Optional[torch.Tensor]:
    """The fake's int32 ``[readers, writers, SIDE_SLOTS]`` channel of the fabric memory that
    holds ``workspace``, or None for a tensor that is not fabric memory (no peer sees it)."""
    at = workspace.data_ptr()
    for record in _MnnvlMemory.allocated_map.values():
        base = record.segment.data_ptr()
        if base <= at < base + record.segment.numel():
            return record.side
    return None


def on_scenario_end(hook) -> None:
    """Register ``hook()`` to run when the memory of a scenario is forgotten (workspace caches)."""
    _SCENARIO_END_HOOKS.append(hook)


class _MnnvlMemory_0_6(_MnnvlMemory):
    pass


class _MnnvlMemory_0_6_15(_MnnvlMemory):
    @staticmethod
    def _exchange_handles(comm, key):
        """``_create_and_map_handles``: rank and size again, then the FABRIC handles."""
        comm.Get_rank(), comm.Get_size()
        return comm.allgather(key)

    @property
    def mapped(self) -> bool:
        """False between ``MoeAlltoAll.checkpoint_prepare`` and ``checkpoint_restore``."""
        return _MnnvlMemory.allocated_map[self.ptr].mapped


class _MnnvlMemory_0_6_16(_MnnvlMemory_0_6_15):
    @staticmethod
    def _before_reserving(comm) -> None:
        _MnnvlMemory._resolve_fabric_support(comm)


class _MnnvlMemory_0_7_4(_MnnvlMemory_0_6_16):
    """0.7.4 chooses FABRIC handles or POSIX file descriptors collectively; the fake's shared
    memory stands in for FABRIC handles (what CFT counted writes would need)."""

    @staticmethod
    def _before_reserving(comm) -> None:
        """0.7.4 votes on the handle type at each allocation instead (allocate_mnnvl_handles)."""

    @staticmethod
    def _exchange_handles(comm, key):
        """``allocate_mnnvl_handles``: the handle-type vote (host, fabric status), then
        ``_create_and_import_handles``: rank and size, the creation errors, the FABRIC handles,
        the import errors."""
        votes = comm.allgather((socket.gethostname(), None, b"fake-fabric"))
        assert all(reason is None for _, reason, _ in votes)
        comm.Get_rank(), comm.Get_size()
        if any(comm.allgather(None)):
            raise RuntimeError("a rank failed to create its MNNVL allocation")
        handles = comm.allgather(key)
        if any(comm.allgather(None)):
            raise RuntimeError("a rank failed to import a peer's MNNVL allocation")
        return handles

    @property
    def fabric_handles(self) -> bool:
        return True

    @property
    def local_mem_handle(self) -> int:
        return self.ptr

    @staticmethod
    def uses_fabric_handles(comm: CommBackend, dev_id: int) -> bool:
        return all(comm.allgather(True))

    @staticmethod
    def get_allocation_prop(dev_id, handle_type):
        return SimpleNamespace(type="CU_MEM_ALLOCATION_TYPE_PINNED",
                               location=SimpleNamespace(type="CU_MEM_LOCATION_TYPE_DEVICE", id=dev_id),
                               requestedHandleTypes=handle_type)


for _cls in (_MnnvlMemory_0_6, _MnnvlMemory_0_6_15, _MnnvlMemory_0_6_16, _MnnvlMemory_0_7_4):
    _cls.__name__ = _cls.__qualname__ = "MnnvlMemory"

# 0.6.15 asks rank and size again before exchanging the handles (its checkpoint remap shares
# that code) and tells whether they are mapped; 0.6.16 first votes on FABRIC support.
_MNNVL_MEMORY = {"0.6.8": _MnnvlMemory_0_6, "0.6.15": _MnnvlMemory_0_6_15, "0.6.16": _MnnvlMemory_0_6_16,
                 "0.7.4": _MnnvlMemory_0_7_4}
__fake_only__ = ("SIDE_SLOTS", "on_scenario_end", "side_channel")


def __getattr__(name: str):
    new = profiles.active().eplb_and_rank_mask  # 0.6.16 on
    if name == "CommBackend":
        return _CommBackendProtocol if new else _CommBackendABC
    if name == "TorchDistBackend" and new:  # imported from .comm_backend from 0.6.16 on
        from fakes.flashinfer.comm.comm_backend import TorchDistBackend

        return TorchDistBackend
    if name == "MnnvlMemory":
        return profiles.pick(_MNNVL_MEMORY)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"CommBackend", "MnnvlMemory"}
                  | ({"TorchDistBackend"} if profiles.active().eplb_and_rank_mask else set()))
