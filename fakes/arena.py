"""Shared-memory arena: named ``/dev/shm`` segments that rank processes map as tensors.

It stands in for NVLink symmetric memory: one segment mapped by every rank of a group,
so a write by one rank is visible to all (``torch.distributed._symmetric_memory`` has no
CPU support). Every segment of a scenario carries the scenario's prefix, which is how
they are found again and unlinked: by the parent when the scenario ends, by a surviving
rank when the parent dies, and by :func:`sweep_orphans` at the next pool start.

Processes an engine starts itself also create POSIX shared memory of their own (vLLM's
message queues, multiprocessing's named semaphores), which they cannot remove when they are
killed. Each such process of an arena notes what it creates in the arena's register
(:func:`record_created`, ``<prefix>created``); the arena's end removes those too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

SHM_DIR = Path("/dev/shm")
PREFIX_ROOT = "a2atb"
_KEY_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def scenario_prefix(owner_pid: int, token: str) -> str:
    """Segment-name prefix for one scenario run by the pool of process ``owner_pid``."""
    return f"{PREFIX_ROOT}-{owner_pid}-{token}-"


CREATED = "created"  # after an arena's prefix: its register of what its processes created


def unlink_prefix(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix``, and what the arena's register
    names; return the names removed (the register, bookkeeping, not among them)."""
    register = SHM_DIR / (prefix + CREATED)
    removed = _unlink_all(_registered(register) + [p for p in SHM_DIR.glob(prefix + "*") if p != register])
    _unlink_all([register])
    return removed


def sweep_orphans() -> list[str]:
    """Unlink the segments of pools whose owner process no longer exists (and what their
    registers name)."""
    gone = [p for p in SHM_DIR.glob(PREFIX_ROOT + "-*") if _owner_gone(p.name)]
    return _unlink_all([q for p in gone if p.name.endswith("-" + CREATED) for q in _registered(p)] + gone)


def record_created(prefix: str, name: str) -> None:
    """Note in arena ``prefix``'s register that this process created POSIX shared memory
    ``name`` (as ``shm_open`` takes it: ``/psm_1234``, or ``/sem.mp-ab12`` for a named
    semaphore's file); one ``os.write`` per line, whole even among concurrent processes."""
    fd = os.open(SHM_DIR / (prefix + CREATED), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, (name + "\n").encode())
    finally:
        os.close(fd)


def _registered(register: Path) -> list[Path]:
    try:
        names = register.read_text().split()
    except FileNotFoundError:
        return []
    # Plain names in SHM_DIR only: a line is never a path elsewhere.
    return [SHM_DIR / n.lstrip("/") for n in names if _KEY_RE.fullmatch(n.lstrip("/"))]


def _unlink_all(paths) -> list[str]:
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:  # another rank of the scenario got there first
            pass
    return removed


def _owner_gone(name: str) -> bool:
    parts = name.split("-")
    return len(parts) >= 3 and parts[1].isdigit() and not pid_alive(int(parts[1]))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: not gone and, where ``/proc`` tells, not a zombie (a dead
    process its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return not Path("/proc/self").exists() and _signal_reaches(pid)
    except (ProcessLookupError, IndexError):
        return False


def _signal_reaches(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ShmArena:
    """The segments of one scenario, as seen from one rank process.

    Parameters
    ----------
    prefix : str
        The scenario's segment-name prefix (from :func:`scenario_prefix`).
    """

    _current: "ShmArena | None" = None

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._on_close: list = []

    @classmethod
    def current(cls) -> "ShmArena":
        """The arena of the scenario running in this process (fakes allocate from it)."""
        if cls._current is None:
            raise RuntimeError(
                "no shared-memory arena is active in this process: the fake FlashInfer's "
                "NVLink memory exists only inside a testbed scenario (RankPool.run)"
            )
        return cls._current

    def activate(self) -> None:
        type(self)._current = self

    def on_close(self, callback) -> None:
        """Call ``callback()`` when the scenario ends (e.g. to drop caches of its segments)."""
        self._on_close.append(callback)

    def close(self) -> None:
        """End of scenario in this process: run the close callbacks, stop being current."""
        callbacks, self._on_close = self._on_close, []
        if type(self)._current is self:
            type(self)._current = None
        for callback in reversed(callbacks):
            callback()

    def path(self, key: str) -> Path:
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise ValueError(
                f"arena key {key!r}: must be 1-128 characters of letters, digits, '_', '.', '-'"
            )
        return SHM_DIR / (self.prefix + key)

    def create(self, key: str, nbytes: int) -> torch.Tensor:
        """Create segment ``key`` of ``nbytes`` zero bytes and map it as a uint8 tensor ``[nbytes]``."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"arena segment {key!r}: nbytes must be a positive int, got {nbytes!r}")
        path = self.path(key)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            raise FileExistsError(f"arena segment {key!r} already exists in this scenario") from None
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        return self._map(path, nbytes)

    def attach(self, key: str) -> torch.Tensor:
        """Map an existing segment ``key`` as a uint8 tensor ``[nbytes]``."""
        path = self.path(key)
        try:
            nbytes = path.stat().st_size
        except FileNotFoundError:
            raise FileNotFoundError(
                f"arena segment {key!r} does not exist; create it first (or use ShmArena.tensor)"
            ) from None
        return self._map(path, nbytes)

    def tensor(
        self,
        key: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        """Collective over ``group``: its first rank creates segment ``key``, every member maps it.

        Returns
        -------
        torch.Tensor
            A zero-initialised tensor of ``shape`` and ``dtype`` backed by the shared segment.
        """
        numel = 1
        for dim in shape:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if dist.get_rank(group) == 0:
            raw = self.create(key, nbytes)
        dist.barrier(group=group)
        if dist.get_rank(group) != 0:
            raw = self.attach(key)
        return raw.view(dtype).view(shape)

    def unlink(self, key: str) -> None:
        """Remove segment ``key``; ranks that mapped it keep their mapping."""
        self.path(key).unlink(missing_ok=True)

    def sweep(self) -> list[str]:
        return unlink_prefix(self.prefix)

    @staticmethod
    def _map(path: Path, nbytes: int) -> torch.Tensor:
        return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
