"""A stand-in for the accelerators an engine's own multi-GPU tests ask for, on a CPU.

An engine's tests of its FlashInfer all-to-all spawn one process per GPU, skip below two
accelerators, set each process's device, put tensors on ``cuda:{rank}`` and synchronise. On a
CPU torch every one of those calls fails or reports no device. :func:`install` answers them:

- ``torch.accelerator`` and ``torch.cuda``: the device count is the stand-in's, setting and
  reading the current device index work within it (an index outside it is refused);
- tensors created on, or moved to, ``cuda`` / ``cuda:N`` land on the CPU (a torch function
  mode rewrites the device argument), so ``tensor.device`` reads ``cpu``;
- streams and events behave as one ordered stream: the CPU runs every op in issue order, so
  recording, waiting and synchronising have nothing to wait for;
- emptying the allocators' caches (device and pinned host) has nothing to release;
- the NCCL backend of ``torch.distributed`` is gloo;
- what a CPU cannot do (CUDA graph capture, timing between events) raises
  :class:`NeedsAccelerator`, whose message the pytest plugin turns into a skip naming it.

``torch.cuda.is_available()`` stays ``False``: engines pick their platform from it, and on a CPU
the platform is the CPU's. Installed for good in the process (there is no undo: it is meant
for a test session and the processes it starts, :mod:`fakes.spawned`).
"""

from __future__ import annotations

import contextlib
import re

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

DEVICES_ENV = "A2A_FAKE_DEVICES"  # how many stand-in accelerators every process a run starts has (fakes.spawned)

_CUDA = re.compile(r"cuda(:\d+)?")
_state = {"count": 0, "index": 0}


class NeedsAccelerator(RuntimeError):
    """A call the CPU stand-in cannot answer; its message starts with :data:`MARK`."""

    MARK = "[needs a GPU]"

    def __init__(self, what: str) -> None:
        super().__init__(f"{self.MARK} {what}: the CPU stand-in for the accelerator cannot provide it")


def parse_count(value, name: str = DEVICES_ENV) -> int:
    """``value`` as a device count of at least 1, or a ``ValueError`` naming ``name`` and the rule."""
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(value).strip() != str(count):
        raise ValueError(f"{name}: the number of stand-in accelerators must be a whole number >= 1, got {value!r}")
    return count


def installed() -> int:
    """The stand-in's device count in this process, 0 where it is not installed."""
    return _state["count"]


def install(count: int) -> None:
    """Answer ``torch.accelerator``, ``torch.cuda`` and the NCCL backend in this process as
    ``count`` accelerators would, on the CPU (see the module's docstring)."""
    count = parse_count(count, "count")
    if _state["count"]:
        if _state["count"] != count:
            raise RuntimeError(f"the accelerator stand-in is installed with {_state['count']} devices, not {count}")
        return
    _state["count"] = count
    for module in (torch.accelerator, torch.cuda):
        module.device_count = device_count
        module.synchronize = synchronize
        module.empty_cache = empty_cache
    torch.accelerator.empty_host_cache = empty_cache
    torch.accelerator.set_device_index = set_device_index
    torch.accelerator.set_device_idx = set_device_index
    torch.accelerator.current_device_index = current_device_index
    torch.accelerator.current_device_idx = current_device_index
    torch.cuda.set_device = set_device_index
    torch.cuda.current_device = current_device_index
    torch.cuda.Stream, torch.cuda.Event = Stream, Event
    torch.cuda.current_stream = torch.cuda.default_stream = _the_stream
    torch.cuda.stream = _stream_context
    torch.cuda.CUDAGraph = CUDAGraph
    torch.cuda.graph = _graph
    dist.init_process_group = _on_gloo(dist.init_process_group)
    dist.new_group = _on_gloo(dist.new_group)
    _CudaOnCpu().__enter__()  # for the process's life: never exited


def device_count() -> int:
    return _state["count"]


def set_device_index(device) -> None:
    index = device.index if isinstance(device, torch.device) else device
    if isinstance(device, str):
        index = torch.device(device).index
    if index is None:
        index = 0
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < _state["count"]:
        raise ValueError(f"device: {device!r} is not one of the {_state['count']} stand-in accelerators "
                         f"(0 .. {_state['count'] - 1}; {DEVICES_ENV} or --fake-devices sets how many)")
    _state["index"] = index


def current_device_index() -> int:
    return _state["index"]


def synchronize(device=None) -> None:
    """Nothing to wait for: the CPU has run every op issued so far."""


def empty_cache() -> None:
    """Nothing cached: the CPU allocator returns memory as tensors go."""


class Event:
    """An event on the one ordered stream: complete as soon as it is recorded."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event) -> float:
        raise NeedsAccelerator("the time between two CUDA events (Event.elapsed_time)")


class Stream:
    """The one ordered stream every op runs on."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


_STREAM = Stream()


def _the_stream(device=None) -> Stream:
    return _STREAM


def _stream_context(stream=None):
    return contextlib.nullcontext(stream)


class CUDAGraph:
    def __init__(self, *args, **kwargs) -> None:
        raise NeedsAccelerator("CUDA graph capture and replay (torch.cuda.CUDAGraph)")


def _graph(*args, **kwargs):
    raise NeedsAccelerator("CUDA graph capture and replay (torch.cuda.graph)")


def _on_gloo(create):
    """``create`` (``init_process_group`` or ``new_group``) with NCCL asked for as gloo."""

    def on_gloo(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _gloo(kwargs["backend"])
        elif create.__name__ == "init_process_group" and args:
            args = (_gloo(args[0]),) + args[1:]
        elif create.__name__ == "new_group" and len(args) >= 3:
            args = args[:2] + (_gloo(args[2]),) + args[3:]
        return create(*args, **kwargs)

    on_gloo.__wrapped__ = create
    on_gloo.__name__ = create.__name__
    return on_gloo


def _gloo(backend):
    """``nccl``, and any ``device:backend`` list naming it, as gloo; other backends as given."""
    if isinstance(backend, str) and "nccl" in backend.lower():
        return "gloo"
    return backend


def _on_cpu(value):
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, str) and _CUDA.fullmatch(value):
        return "cpu"
    return value


class _CudaOnCpu(TorchFunctionMode):
    """Every device argument naming ``cuda`` names the CPU; ``Tensor.cuda`` and
    ``Tensor.pin_memory`` return the tensor (it is where it would be moved to)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.cuda, torch.Tensor.pin_memory):
            return args[0]
        args = tuple(_on_cpu(a) for a in args)
        kwargs = {k: _on_cpu(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)
