"""The two-sided ``MnnvlMoe``'s exchanges recorded as collectives of the EP group, and the
communicator calls each of the fake's MNNVL set-ups makes."""

from __future__ import annotations

import inspect

from testbed import patch
from testbed.contract.setup_calls import COMM_METHODS
from testbed.harness import audit
from testbed.scenario.events import Collective, EventLog, MnnvlSetup


def recording_mnnvl_moe(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    """``MnnvlMoe`` logging its exchanges as collectives of the EP group."""
    def logged(name):
        fn = getattr(base, name)

        def call(*args, **kwargs):
            log.write(Collective(op=name, group=tuple(ep_ranks), site=audit.integration_call_site()))
            return fn(*args, **kwargs)

        return staticmethod(call)

    names = ("mnnvl_moe_alltoallv_prepare_without_allgather", "mnnvl_moe_alltoallv", "mnnvl_moe_alltoallv_combine")
    return type("MnnvlMoe", (base,), {name: logged(name) for name in names})


def recording_mnnvl_setup(log: EventLog) -> callable:
    """Log the communicator calls each of the fake's MNNVL set-ups makes (``setup-calls``);
    returns what stops it."""
    from fakes.flashinfer.comm.mnnvl import _MnnvlMemory

    original = inspect.getattr_static(_MnnvlMemory, "open_mnnvl_memory").__func__

    def open_mnnvl_memory(mapping, size):
        comm = _MnnvlMemory.get_comm(mapping)
        calls: list[str] = []
        _MnnvlMemory.comm = _CallRecorder(comm, calls)
        try:
            return original(mapping, size)
        finally:
            _MnnvlMemory.comm = comm
            log.write(MnnvlSetup(calls=tuple(calls)))

    return patch.attribute(_MnnvlMemory, "open_mnnvl_memory", staticmethod(open_mnnvl_memory))


class _CallRecorder:
    """The integration's communicator, noting each CommBackend method FlashInfer calls on it."""

    def __init__(self, comm, calls: list):
        self._comm, self._calls = comm, calls

    def __getattr__(self, name):
        value = getattr(self._comm, name)
        if name in COMM_METHODS:
            self._calls.append(name)
        return value
