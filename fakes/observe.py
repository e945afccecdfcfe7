"""What the fake FlashInfer tells whoever listens of what happens inside it, so that a harness
never reads the fake's private state.

Kept outside ``fakes.flashinfer``: the contract holds that tree to the real FlashInfer's
names, and these hooks are none of them. A listener is ``listener(event, **fields)``; the
fake emits (every object is the fake's own, its public attributes readable):

- ``moe_alltoall_built(alltoall)``: a ``MoeAlltoAll`` constructed.
- ``moe_alltoall_dispatch(alltoall, runtime_max, tokens)``: a round's dispatch begins.
- ``moe_alltoall_dispatched(alltoall, combine_offset)``: the round's payloads end (its combine
  region starts) at this byte of the rank's workspace row.
- ``moe_alltoall_combine(alltoall, output, runtime_max, resident)``: a round's combine
  begins (``output``: whether ``output=`` was given; ``resident``: its
  ``payload_in_workspace`` flag).
- ``communication_built(communication, workspace_bytes)``: a ``moe_ep`` communication created,
  with the bytes per rank of its (main) workspace.
- ``communication_dispatched(communication, combine_offset)``: as ``moe_alltoall_dispatched``,
  for a ``moe_ep`` communication whose kernels lay out such an offset (0.7.2's).
- ``workspace_written(owner)``: this rank wrote into ``owner``'s workspace (a ``MoeAlltoAll``
  or a communication) after a round's combine and before the next dispatch, where a peer may
  still read what the round left there: FlashInfer hands its buffers for one round only
  ("valid only between dispatch and combine").
- ``mnnvl_setup(calls)``: an MNNVL set-up made these method calls on the integration's
  communicator, in order.
"""

from __future__ import annotations

from typing import Callable

_listeners: list[Callable] = []


def listen(listener: Callable) -> Callable[[], None]:
    """Call ``listener(event, **fields)`` for every event until the returned function is called."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener)


def emit(event: str, **fields) -> None:
    for listener in tuple(_listeners):
        listener(event, **fields)


class Noting:
    """``target`` with each method call made through it noted by name in ``calls``."""

    def __init__(self, target):
        self._target, self.calls = target, []

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            self.calls.append(name)
            return value(*args, **kwargs)

        return call


class WriteWatch:
    """Local writes into one workspace outside its rounds, seen through the version counter
    torch keeps per storage (every in-place write through any view bumps it; a peer's writes,
    made in its own process, do not): the counter is read when a round's combine ends and
    again when the next dispatch begins."""

    def __init__(self):
        self._quiet = None

    def round_ended(self, workspace) -> None:
        self._quiet = workspace._version

    def round_begins(self, workspace, owner) -> None:
        if self._quiet is not None and workspace._version != self._quiet:
            emit("workspace_written", owner=owner)
        self._quiet = None
