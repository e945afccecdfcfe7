"""The event log of a scenario's rank: one frozen dataclass per kind of event, and its wire form.

A rank writes what happened (a collective, an all-to-all built, a round dispatched, a layer's
forward) as it happens, one JSON line per event (:class:`EventLog`); the parent reads the lines
back as the same typed events (:class:`LogTail`) even after the rank hung or died, and the
invariants match on their types. The wire form is ``{"ev": <kind>, <field>: <value>, ...}``;
reading a line whose kind or fields are not these raises :class:`EventFormatError`, so a
field renamed on one side fails at once instead of reading as None.

Counts are tokens per rank; ``group`` is a collective's members as global ranks; ``build``
numbers an all-to-all object per rank in the order it was built (1, 2, ...).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import ClassVar, Optional


class EventFormatError(ValueError):
    """A log line that is not one of the events below (an unknown kind, a missing or extra field)."""


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str]

    def wire(self) -> dict:
        """The JSON object this event is written as."""
        return {"ev": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class Collective(Event):
    """A ``torch.distributed`` collective (or an all-to-all round, which waits for every
    peer as one) the integration made on ``group`` from ``site``."""

    kind = "coll"
    op: str
    group: tuple[int, ...]
    site: Optional[str]


@dataclass(frozen=True)
class AlltoallBuilt(Event):
    """A ``MoeAlltoAll`` constructed: its token capacity, workspace bytes per rank and the
    workspace's address (``MoeAlltoAll``s of one size share a workspace)."""

    kind = "build"
    index: int
    max_num_tokens: int
    workspace_size: int
    top_k: int
    num_experts: int
    workspace: int


@dataclass(frozen=True)
class CommunicationBuilt(Event):
    """A ``flashinfer.moe_ep`` communication created: its backend, capacity and what one
    token's dispatch row carries."""

    kind = "ep_build"
    index: int
    backend: str
    max_num_tokens: int
    top_k: int
    num_experts: int
    workspace_size: int
    hidden: int
    row_bytes: int


@dataclass(frozen=True)
class Dispatch(Event):
    """A dispatch called with ``runtime_max`` as the round's max tokens per rank (None where
    the API takes none) for ``tokens`` local tokens, on all-to-all ``build`` (None where the
    object logs no build number of its own)."""

    kind = "dispatch"
    runtime_max: Optional[int]
    tokens: int
    build: Optional[int] = None


@dataclass(frozen=True)
class Dispatched(Event):
    """Where the round just dispatched on ``build`` starts its combine region in this rank's
    workspace row (the end of its dispatch payloads)."""

    kind = "dispatched"
    build: int
    combine_offset: int


@dataclass(frozen=True)
class WorkspaceWritten(Event):
    """This rank wrote into the workspace of all-to-all ``build`` after a round's combine and
    before the next round's dispatch (seen by the fake when that dispatch begins)."""

    kind = "workspace_written"
    build: int


@dataclass(frozen=True)
class Combine(Event):
    """A combine on ``build``: whether it got ``output=``, its runtime max tokens per rank
    (None: the API takes none, the dispatch's holds) and ``resident``: whether the caller
    passed its payload as lying in the workspace (``payload_in_workspace``; for a ``moe_ep``
    communication, whether the payload is the combine-input buffer it handed out)."""

    kind = "combine"
    build: int
    output: bool
    runtime_max: Optional[int]
    resident: bool


@dataclass(frozen=True)
class ArgumentRefused(Event):
    """An argument the integration passed straight to ``call`` that the release's annotation
    (``expected``; ``=<literal>``: its default's type) rules out."""

    kind = "arguments"
    call: str
    param: str
    value: str
    expected: str
    site: str


@dataclass(frozen=True)
class MnnvlSetup(Event):
    """The communicator methods one MNNVL memory set-up called, in order."""

    kind = "mnnvl_setup"
    calls: tuple[str, ...]


@dataclass(frozen=True)
class ExpertsCall(Event):
    """The experts called in a forward: asked to defer finalize, handed the combine region
    (``region``) as their output."""

    kind = "experts"
    defer: bool
    region: bool


@dataclass(frozen=True)
class SharedMemoryCreated(Event):
    """A ``multiprocessing.shared_memory`` segment this rank created (the parent removes what
    a killed rank leaves)."""

    kind = "posix_shm"
    name: str


@dataclass(frozen=True)
class LayerBuilt(Event):
    kind = "layer"
    layer: int


@dataclass(frozen=True)
class ForwardStart(Event):
    """Layer ``layer``'s call in forward pass ``pass_index`` begins; what the layer says of
    its output (``output_is_reduced()``, a pending TP reduce, sequence parallel)."""

    kind = "forward"
    pass_index: int
    layer: int
    reduced: bool
    pending: bool
    sp: bool


@dataclass(frozen=True)
class ForwardEnd(Event):
    kind = "forward_end"
    pass_index: int
    layer: int


KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (
    Collective, AlltoallBuilt, CommunicationBuilt, Dispatch, Dispatched, WorkspaceWritten, Combine, ArgumentRefused,
    MnnvlSetup, ExpertsCall, SharedMemoryCreated, LayerBuilt, ForwardStart, ForwardEnd)}
# Per kind, read once: its fields, those without a default, and those written as JSON lists.
_SHAPES = {kind: (frozenset(f.name for f in dataclasses.fields(cls)),
                  frozenset(f.name for f in dataclasses.fields(cls)
                            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING),
                  tuple(f.name for f in dataclasses.fields(cls) if str(f.type).startswith("tuple")))
           for kind, cls in KINDS.items()}


def from_wire(obj: dict) -> Event:
    """The event a log line's object stands for; :class:`EventFormatError` for anything else."""
    fields = dict(obj)
    kind = fields.pop("ev", None)
    if kind not in KINDS:
        raise EventFormatError(f"unknown event kind {kind!r} (known: {', '.join(KINDS)})")
    names, required, tuples = _SHAPES[kind]
    if not required <= fields.keys() <= names:
        raise EventFormatError(f"event {kind!r} has fields {sorted(fields)}; {KINDS[kind].__name__} takes "
                               f"{sorted(names)} (required {sorted(required)})")
    for name in tuples:
        if name in fields:
            fields[name] = tuple(fields[name])
    return KINDS[kind](**fields)


class EventLog:
    """Append-only JSON lines, one ``os.write`` each (whole lines even if the rank dies)."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, event: Event) -> None:
        if not isinstance(event, Event):
            raise TypeError(f"EventLog.write takes an Event, got {type(event).__name__}")
        os.write(self._fd, (json.dumps(event.wire()) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class LogTail:
    """One rank's log as read so far: each :meth:`events` call parses only the whole lines
    written since the last (the watchdog reads every rank's log several times a second)."""

    def __init__(self, path: str):
        self.path, self._offset, self._events = path, 0, []

    def events(self) -> list[Event]:
        """Every event so far (empty when the rank never started its log)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self._events
        whole = chunk[: chunk.rfind(b"\n") + 1]  # not the line a rank is writing right now
        self._offset += len(whole)
        self._events.extend(from_wire(json.loads(line)) for line in whole.splitlines())
        return self._events
