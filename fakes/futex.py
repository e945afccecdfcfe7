"""Blocking waits on 32-bit words of shared memory (the arena's segments), across processes.

A GPU kernel spins on a completion flag at no cost to its peers: each GPU has its own SMs.
Ranks sharing a laptop's two cores do not: a rank polling its flags takes the cycles of the
rank it waits for, and the more ranks, the worse (64 ranks polling at 1 kHz keep a core busy).
On Linux a waiter sleeps in the kernel on one flag word (``FUTEX_WAIT`` on a shared mapping
keys the word by file and offset, so it works between processes) and the rank that writes the
word wakes it; elsewhere (or where a sandbox forbids the call) :data:`AVAILABLE` is False and
a wait is a 1 ms sleep.

A rank in a loop of such waits may also be *parked*: waiting for words that only processes
which have stopped writing could change. A watcher tells it apart from a slow one through
the rank's record (:func:`report_to`, :func:`awaiting`, :func:`parked`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import sys
import time

import torch

# x86-64 only: its stores are seen in program order, so a peer that sees a flag sees the data
# written before it; elsewhere the callers poll (and no ordering is promised either).
_SYS_FUTEX = 202 if sys.platform == "linux" and platform.machine() == "x86_64" else None
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFFFFFF
_EXPECTED = {0, errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR}  # woken, changed, timed out, signal


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.syscall
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p, ctypes.c_int]
    return fn


_futex = _syscall() if _SYS_FUTEX is not None else None


def _call(address: int, op: int, value: int, timeout: "_Timespec | None") -> int:
    """The futex call's errno, 0 when it succeeded (a wake returns how many it woke)."""
    if _futex(_SYS_FUTEX, address, op, value, ctypes.byref(timeout) if timeout is not None else None, None, 0) != -1:
        return 0
    return ctypes.get_errno()


def _works() -> bool:
    """A sandbox may forbid the call (seccomp: ENOSYS, EPERM): then every wait would return at
    once and the callers would spin, worse than polling."""
    word = ctypes.c_int32(0)
    changed = _call(ctypes.addressof(word), _FUTEX_WAIT, 1, _Timespec(1, 0))
    timed_out = _call(ctypes.addressof(word), _FUTEX_WAIT, 0, _Timespec(0, 1000))
    return changed == errno.EAGAIN and timed_out in (errno.ETIMEDOUT, errno.EINTR)


AVAILABLE = _futex is not None and _works()


# Where the call is unavailable a wait is a short sleep (what the callers poll with).
_POLL_S = 1e-3


def wait(word: torch.Tensor, seen: int, timeout_s: float) -> None:
    """Sleep while the int32 ``word`` (a one-element view of shared memory) still holds
    ``seen``, at most ``timeout_s``; returns at once if it holds something else. A wake-up
    says nothing: callers read the word again. Without futexes, sleeps 1 ms at most."""
    record = _record if _awaiting else None
    if record is not None:
        record[_SLEEPS] += 1
        record[_ASLEEP] = 1
    try:
        if not AVAILABLE:
            time.sleep(min(timeout_s, _POLL_S))
            return
        err = _call(word.data_ptr(), _FUTEX_WAIT, seen, _Timespec(int(timeout_s), int(timeout_s % 1 * 1e9)))
        if err not in _EXPECTED:
            raise OSError(err, f"futex wait: {os.strerror(err)}")
    finally:
        if record is not None:
            record[_ASLEEP] = 0


def wake(addresses) -> None:
    """Wake every process sleeping on the int32 word at any of ``addresses`` (ints); nothing
    without futexes (the sleepers poll)."""
    if not AVAILABLE:
        return
    for address in addresses:
        err = _call(address, _FUTEX_WAKE, _WAKE_ALL, None)
        if err not in _EXPECTED:
            raise OSError(err, f"futex wake: {os.strerror(err)}")


# A rank's record, int64 words in shared memory that only the rank writes: the loops of
# :func:`awaiting` it entered, the sleeps it began in them, whether it sleeps now, and the
# deadline of its loop (``time.monotonic_ns``, one clock for every process of the machine).
RECORD_WORDS = 4
_LOOPS, _SLEEPS, _ASLEEP, _DEADLINE = range(RECORD_WORDS)
_record: torch.Tensor | None = None
_awaiting = False


def report_to(record: torch.Tensor | None) -> None:
    """Keep this process's record in ``record`` (int64 ``[RECORD_WORDS]``, shared memory a
    watcher maps; zeroed), or nowhere (None)."""
    global _record
    _record = record


@contextlib.contextmanager
def awaiting(deadline: float):
    """Around a loop that reads shared words and calls :func:`wait` until they hold what it
    needs or ``deadline`` (``time.monotonic()``) passes, and writes nothing any peer reads
    before it ends: what makes a rank in it parked once those who could write have stopped."""
    global _awaiting
    if _record is not None:
        _record[_DEADLINE] = int(deadline * 1e9)
        _record[_LOOPS] += 1
    _awaiting = True
    try:
        yield
    finally:
        _awaiting = False


def in_the_same_loops(before: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether the ranks whose records were read as ``before`` and later as ``after`` (int64
    ``[R, RECORD_WORDS]``) were asleep in an :func:`awaiting` loop at both reads, each in the
    same loop (none entered another): from ``before`` to ``after`` none wrote a word a peer reads."""
    return bool(
        before.shape == after.shape and before.numel() > 0
        and (before[:, _ASLEEP] == 1).all() and (after[:, _ASLEEP] == 1).all()
        and (after[:, _LOOPS] == before[:, _LOOPS]).all()
    )


def parked(before: torch.Tensor, after: torch.Tensor, until: float) -> bool:
    """Whether those ranks are parked for good, as far as ``until`` (``time.monotonic()``),
    given that every other process writing their words had stopped before ``before`` was read.

    They were :func:`in_the_same_loops`, and each began two sleeps after the first read: so
    it read the words again after that read, found them short, and wrote nothing in between,
    nor did the others. The words stay as they are; each waits until its deadline, which lies
    past ``until``."""
    return bool(
        in_the_same_loops(before, after)
        and (after[:, _SLEEPS] >= before[:, _SLEEPS] + 2).all()
        and (before[:, _DEADLINE] > int(until * 1e9)).all()
    )
