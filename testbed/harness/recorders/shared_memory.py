"""The ``multiprocessing.shared_memory`` segments a rank creates, recorded."""

from __future__ import annotations

from testbed.scenario.events import EventLog, SharedMemoryCreated


def record_posix_shm(log: EventLog):
    """Log the name of every ``multiprocessing.shared_memory`` segment this rank creates (vLLM's
    message queues make them) until the scenario ends, so the parent can remove what a killed
    rank leaves and count what a finished one leaves; returns the function that stops it."""
    from multiprocessing import resource_tracker

    register = resource_tracker.register

    def recorded(name, rtype):
        if rtype == "shared_memory":
            log.write(SharedMemoryCreated(name=name))
        return register(name, rtype)

    resource_tracker.register = recorded
    return lambda: setattr(resource_tracker, "register", register)
