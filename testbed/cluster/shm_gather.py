"""All-gather over shared memory for the rank pool's process groups.

gloo's all-gather is a ring: W - 1 dependent hops, each waking every rank, so on a laptop's two
cores one all-gather costs O(W^2) context switches (20 ms at 8 ranks, 230 ms at 64; gloo's
all-to-all is no better). ``impl``'s communicator and FlashInfer's workspace exchange call it,
as ``all_gather_object``, at every layer build: half of a 64-rank scenario. Here each member
of a group writes its tensor into its slot of a segment the members mapped when the group was
made, publishes the round number and sleeps on a futex until every member published it: one
copy per peer and one wake-up per rank. Same calls, same results (bit for bit, uneven sizes
included), same timeout; a member that left its group (raised) or died fails the others at
once, as gloo's closed connections do. Every other collective stays on gloo, and so does an
all-gather that is asynchronous, not on CPU, not contiguous or larger than a slot.

Only the pool's ranks use it (they share one host); launched ranks (torchrun, possibly over
several nodes) keep gloo's. Legend: W members of the group.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from fakes import futex
from fakes.arena import ShmArena

SLOT_BYTES = 64 << 10  # larger all-gathers stay on gloo
_SLOT_HEADER = 16  # int64 bytes sent, int64 dtype code
_DTYPES = {dtype: code for code, dtype in enumerate(
    (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
     torch.float32, torch.float64, torch.complex64, torch.complex128, torch.bool, torch.float8_e4m3fn,
     torch.uint16, torch.uint32, torch.uint64), start=1)}
_PID_CHECK_S = 0.05

_groups: dict[int, "_Segment"] = {}  # id(group) -> its segment
_gloo_all_gather = None


def install() -> None:
    """Route ``torch.distributed.all_gather`` (and so ``all_gather_object``) on the groups
    given to :func:`attach` through their segments, in this process (idempotent). Does
    nothing where :mod:`fakes.futex` is unavailable."""
    global _gloo_all_gather
    if _gloo_all_gather is not None or not futex.AVAILABLE:
        return
    _gloo_all_gather = c10d.all_gather
    c10d.all_gather = dist.all_gather = _all_gather


def attach(group, members: tuple[int, ...], arena: ShmArena, timeout_s: float) -> None:
    """Collective over ``group`` (global ranks ``members``, in group order): its first member
    creates the group's segment in ``arena``, every member maps it, then the name goes (the
    mappings stay). Nothing for a one-member group or where :func:`install` did nothing."""
    if _gloo_all_gather is None or len(members) < 2:
        return
    W, me = len(members), dist.get_rank(group)
    key = "gather-" + hashlib.sha1(repr(members).encode()).hexdigest()[:16]
    nbytes = _Segment.data_at(W) + 2 * W * (_SLOT_HEADER + SLOT_BYTES)
    raw = arena.create(key, nbytes) if me == 0 else None
    dist.barrier(group=group)
    if me != 0:
        raw = arena.attach(key)
    segment = _Segment(group, members, me, raw, timeout_s)
    segment.pid_W[me] = os.getpid()
    dist.barrier(group=group)  # every member mapped it and wrote its pid
    if me == 0:
        arena.unlink(key)
    _groups[id(group)] = segment


def leave_all() -> None:
    """This process leaves every attached group (before its groups are destroyed): members
    waiting for it in an all-gather fail at once, not at the timeout."""
    for segment in _groups.values():
        segment.left_W[segment.me] = 1
        futex.wake([segment.seq_W[segment.me:segment.me + 1].data_ptr()])
    _groups.clear()


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    segment = _groups.get(id(group if group is not None else dist.group.WORLD))
    if segment is None or async_op or not segment.fits(tensor_list, tensor):
        return _gloo_all_gather(tensor_list, tensor, group=group, async_op=async_op)
    segment.gather(tensor_list, tensor)
    return None


class _Segment:
    """One group's all-gather memory: per member a round word, a left word and its pid; the
    round the first member saw complete; then two banks of W slots (round r uses bank r % 2:
    a member starts round r + 2 only after round r + 1 completed, so after every member read
    round r). The first member waits for every member's round word and then wakes the others
    with one word, so a round costs O(W) wake-ups, not one per member per member."""

    def __init__(self, group, members, me, raw: torch.Tensor, timeout_s: float) -> None:
        W = len(members)
        self.group, self.members, self.me, self.timeout_s = group, members, me, timeout_s
        words = raw[:4 * (3 * W + 1)].view(torch.int32)
        self.seq_W, self.left_W, self.pid_W, self.done = words[:W], words[W:2 * W], words[2 * W:3 * W], words[3 * W:]
        self.slots = raw[self.data_at(W):].view(2, W, _SLOT_HEADER + SLOT_BYTES)
        self.round = 0

    @staticmethod
    def data_at(W: int) -> int:
        return -(-4 * (3 * W + 1) // 64) * 64

    def fits(self, tensor_list, tensor) -> bool:
        return len(tensor_list) == len(self.members) and all(
            t.is_cpu and t.is_contiguous() and t.dtype in _DTYPES and t.nbytes <= SLOT_BYTES
            for t in (tensor, *tensor_list))

    def gather(self, tensor_list, tensor) -> None:
        self.round += 1
        bank = self.slots[self.round % 2]
        sent = _bytes(tensor)
        bank[self.me, :_SLOT_HEADER].view(torch.int64)[:] = torch.tensor([sent.numel(), _DTYPES[tensor.dtype]])
        bank[self.me, _SLOT_HEADER:_SLOT_HEADER + sent.numel()] = sent
        self.seq_W[self.me] = self.round  # after the data: x86 and the futex keep the order
        if self.me != 0:
            futex.wake([self.seq_W[self.me:self.me + 1].data_ptr()])
        self._wait()
        got_W = torch.tensor([[out.nbytes, _DTYPES[out.dtype]] for out in tensor_list])
        sent_W = bank[:, :_SLOT_HEADER].view(torch.int64)
        bad = (sent_W != got_W).any(1).nonzero().flatten().tolist()
        if bad:
            p = bad[0]
            n, code = sent_W[p].tolist()
            sent_dtype = next((d for d, c in _DTYPES.items() if c == code), "?")
            raise RuntimeError(
                f"all_gather on the group of ranks {list(self.members)}: rank {self.members[p]} sent "
                f"{n} bytes of {sent_dtype}, but rank {self.members[self.me]}'s tensor_list[{p}] holds "
                f"{int(got_W[p, 0])} bytes of {tensor_list[p].dtype} (every rank must pass the same output sizes)")
        n, first = int(got_W[0, 0]), tensor_list[0]
        at = first.data_ptr()
        if (all(out.data_ptr() == at + p * n for p, out in enumerate(tensor_list)) and bool((got_W[:, 0] == n).all())
                and first.storage_offset() * first.element_size() + len(tensor_list) * n
                <= first.untyped_storage().nbytes()):
            # Consecutive slices of the first one's memory (as all_gather_object passes): one copy.
            rows = torch.as_strided(_bytes(first), (len(tensor_list), n), (n, 1))
            rows.copy_(bank[:, _SLOT_HEADER:_SLOT_HEADER + n])
            return
        for p, out in enumerate(tensor_list):
            _bytes(out).copy_(bank[p, _SLOT_HEADER:_SLOT_HEADER + int(got_W[p, 0])])

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        next_pid_check = time.monotonic() + _PID_CHECK_S
        while True:
            missing = (self.seq_W < self.round).nonzero().flatten().tolist()
            if self.me == 0:
                if not missing:
                    self.done[0] = self.round
                    futex.wake([self.done.data_ptr()])
                    return
                word = self.seq_W[missing[0]:missing[0] + 1]
            else:
                if int(self.done[0]) >= self.round:
                    return
                word = self.done
                missing = missing or [0]  # every member posted; the first has yet to see it
            gone = [p for p in missing if self.left_W[p]]
            now = time.monotonic()
            if not gone and now >= next_pid_check:
                gone = [p for p in missing if not _alive(int(self.pid_W[p]))]
                next_pid_check = now + _PID_CHECK_S
            if gone:
                raise RuntimeError(
                    f"all_gather on the group of ranks {list(self.members)}: rank(s) "
                    f"{[self.members[p] for p in gone]} left the group (raised or exited) before the "
                    "gather completed (as gloo's 'Connection closed by peer')")
            if now > deadline:
                raise RuntimeError(
                    f"all_gather on the group of ranks {list(self.members)}: timed out after "
                    f"{self.timeout_s:g} s waiting for rank(s) {[self.members[p] for p in missing]}")
            seen = int(word[0])  # sleep only on the value that said "not yet"
            if seen < self.round:
                futex.wait(word, seen, min(deadline - now, _PID_CHECK_S))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _alive(pid: int) -> bool:
    """Not gone and not a zombie (a dead rank its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
