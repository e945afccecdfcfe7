"""Blocking waits on 32-bit words of shared memory (the arena's segments), across processes.

A GPU kernel spins on a completion flag at no cost to its peers: each GPU has its own SMs.
Ranks sharing a laptop's two cores do not: a rank polling its flags takes the cycles of the
rank it waits for, and the more ranks, the worse (64 ranks polling at 1 kHz keep a core busy).
On Linux a waiter sleeps in the kernel on one flag word (``FUTEX_WAIT`` on a shared mapping
keys the word by file and offset, so it works between processes) and the rank that writes the
word wakes it; elsewhere :data:`AVAILABLE` is False and callers poll.
"""

from __future__ import annotations

import ctypes
import platform
import sys

import torch

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine()) if sys.platform == "linux" else None
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFFFFFF
AVAILABLE = _SYS_FUTEX is not None
_libc = ctypes.CDLL(None, use_errno=True) if AVAILABLE else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def wait(word: torch.Tensor, seen: int, timeout_s: float) -> None:
    """Sleep while the int32 ``word`` (a one-element view of shared memory) still holds
    ``seen``, at most ``timeout_s``; returns at once if it holds something else. A wake-up
    says nothing: callers read the word again."""
    ts = _Timespec(int(timeout_s), int(timeout_s % 1 * 1e9))
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(word.data_ptr()), _FUTEX_WAIT, ctypes.c_int(seen),
                  ctypes.byref(ts), None, 0)


def wake(addresses) -> None:
    """Wake every process sleeping on the int32 word at any of ``addresses`` (ints)."""
    for address in addresses:
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
