"""All-gather over shared memory for the rank pool's process groups.

gloo's all-gather is a ring: W - 1 dependent hops, each waking every rank, so on a laptop's two
cores one all-gather costs O(W^2) context switches (20 ms at 8 ranks, 230 ms at 64; gloo's
all-to-all is no better). ``impl``'s communicator and FlashInfer's workspace exchange call it,
as ``all_gather_object``, at every layer build: half of a 64-rank scenario. Here each member
of a group writes its tensor into its slot of a segment the members mapped when the group was
made and publishes the round number; the first member waits for every round word and wakes the
others with one word. Same results bit for bit, same checks and messages as torch and gloo
(every output the input's shape and dtype), same timeout, asynchronous calls served at once; a
member that left its group (raised) or died fails the others, as gloo's closed connections do.
Every other collective stays on gloo, and so does an all-gather of a dtype gloo refuses or of
more than a slot: what decides is what every member passes alike (the outputs), never one
member's own arguments, so the members never split between the two.

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
from torch._C._distributed_c10d import _create_work_from_future

from fakes import futex
from fakes.arena import ShmArena, pid_alive

SLOT_BYTES = 64 << 10  # larger all-gathers stay on gloo
_SLOT_HEADER = 16  # int64 bytes sent, int64 dtype code
# The dtypes gloo gathers (it refuses int16, uint16/32/64 and fp8: "Invalid scalar type").
_DTYPES = {dtype: code for code, dtype in enumerate(
    (torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
     torch.float64, torch.bool, torch.complex64, torch.complex128), start=1)}
_PID_CHECK_S = 0.05

_groups: dict[int, "_Segment"] = {}  # id(group) -> its segment (which holds the group)
_gloo_all_gather = None
_failed = False  # a gather failed since the groups were attached: the world must not be kept


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


def healthy() -> bool:
    """No gather failed since the groups were attached (after a failure, members may be out
    of step: the world must be left, not kept)."""
    return not _failed


def leave_all() -> None:
    """This process leaves every attached group (before its groups are destroyed): members
    waiting for it in an all-gather fail at once, not at the timeout."""
    global _failed
    for segment in _groups.values():
        segment.left_W[segment.me] = 1
        futex.wake([segment.seq_W[segment.me:segment.me + 1].data_ptr(), segment.done.data_ptr()])
    _groups.clear()
    _failed = False


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    segment = _groups.get(id(group if group is not None else dist.group.WORLD))
    if segment is None or not segment.serves(tensor_list):
        return _gloo_all_gather(tensor_list, tensor, group=group, async_op=async_op)
    c10d._check_tensor_list(tensor_list, "tensor_list")
    c10d._check_single_tensor(tensor, "tensor")
    c10d._ensure_all_tensors_same_dtype(tensor_list, tensor)
    for i, out in enumerate(tensor_list):
        if out.shape != tensor.shape:
            raise RuntimeError(f"ProcessGroupGloo::allgather: invalid tensor size at index {i} "
                               f"(expected {_shape(tensor)}, got {_shape(out)})")
    global _failed
    try:
        segment.gather(tensor_list, tensor)
    except BaseException:
        _failed = True
        raise
    if async_op:
        done = torch.futures.Future()
        done.set_result(tensor_list)
        return _create_work_from_future(done)
    return None


def _shape(t: torch.Tensor) -> str:
    """A shape as gloo prints it (complex tensors travel as their real view)."""
    dims = torch.view_as_real(t).shape if t.is_complex() else t.shape
    return "(" + ", ".join(map(str, dims)) + ")"


class _Segment:
    """One group's all-gather memory: per member a round word, a left word and its pid; the
    round the first member saw complete and the member it found gone (plus one); then two banks of W slots
    (round r uses bank r % 2: a member starts round r + 2 only after round r + 1 completed, so
    after every member read round r). Only the first member waits for every round word, so a
    round costs O(W) wake-ups, not one per member per member."""

    def __init__(self, group, members, me, raw: torch.Tensor, timeout_s: float) -> None:
        W = len(members)
        self.group, self.members, self.me, self.timeout_s = group, members, me, timeout_s
        words = raw[:4 * (3 * W + 2)].view(torch.int32)
        self.seq_W, self.left_W, self.pid_W = words[:W], words[W:2 * W], words[2 * W:3 * W]
        self.done, self.lost = words[3 * W:3 * W + 1], words[3 * W + 1:]
        self.slots = raw[self.data_at(W):].view(2, W, _SLOT_HEADER + SLOT_BYTES)
        self.round = 0

    @staticmethod
    def data_at(W: int) -> int:
        return -(-4 * (3 * W + 2) // 64) * 64

    def serves(self, tensor_list) -> bool:
        """Whether this gather goes through the segment: decided on the outputs, which every
        member passes alike."""
        if len(tensor_list) != len(self.members) or not tensor_list:
            return False
        out = tensor_list[0]
        return isinstance(out, torch.Tensor) and out.is_cpu and out.dtype in _DTYPES and out.nbytes <= SLOT_BYTES

    def gather(self, tensor_list, tensor) -> None:
        self.round += 1
        bank = self.slots[self.round % 2]
        sent = _bytes(tensor.contiguous())
        bank[self.me, :_SLOT_HEADER].view(torch.int64)[:] = torch.tensor([sent.numel(), _DTYPES[tensor.dtype]])
        bank[self.me, _SLOT_HEADER:_SLOT_HEADER + sent.numel()] = sent
        self.seq_W[self.me] = self.round  # after the data: x86 keeps stores in order
        if self.me != 0:
            futex.wake([self.seq_W[self.me:self.me + 1].data_ptr()])
        self._wait()
        n = sent.numel()
        sent_W = bank[:, :_SLOT_HEADER].view(torch.int64)
        bad = (sent_W != torch.tensor([n, _DTYPES[tensor.dtype]])).any(1).nonzero().flatten().tolist()
        if bad:
            got, code = sent_W[bad[0]].tolist()
            got_dtype = next((d for d, c in _DTYPES.items() if c == code), "?")
            raise RuntimeError(
                f"all_gather on the group of ranks {list(self.members)}: rank {self.members[bad[0]]} sent "
                f"{got} bytes of {got_dtype}, rank {self.members[self.me]} {n} bytes of {tensor.dtype} "
                "(every member must gather the same shape and dtype)")
        first = tensor_list[0]
        at = first.data_ptr()
        if (all(out.is_contiguous() and out.data_ptr() == at + p * n for p, out in enumerate(tensor_list))
                and first.storage_offset() * first.element_size() + len(tensor_list) * n
                <= first.untyped_storage().nbytes()):
            # Consecutive slices of the first one's memory (as all_gather_object passes): one copy.
            torch.as_strided(_bytes(first), (len(tensor_list), n), (n, 1)).copy_(
                bank[:, _SLOT_HEADER:_SLOT_HEADER + n])
            return
        for p, out in enumerate(tensor_list):
            out.copy_(bank[p, _SLOT_HEADER:_SLOT_HEADER + n].view(out.dtype).view(out.shape))

    def _wait(self) -> None:
        """Until round ``self.round`` completed; raises when a member left or died, when the
        members are out of step, and at the timeout."""
        deadline = time.monotonic() + self.timeout_s
        next_pid_check = time.monotonic() + _PID_CHECK_S
        lead = self.me == 0
        while True:
            missing = (self.seq_W < self.round).nonzero().flatten().tolist()
            if lead:
                if int(self.seq_W.max()) > self.round:
                    self._fail(f"member(s) {self._ranks((self.seq_W > self.round).nonzero().flatten().tolist())} "
                               f"are past round {self.round}: the members are out of step")
                if not missing:
                    self.done[0] = self.round
                    futex.wake([self.done.data_ptr()])
                    return
                word = self.seq_W[missing[0]:missing[0] + 1]
                watch = missing
            else:
                done = int(self.done[0])
                if done > self.round:
                    self._fail(f"the first member completed round {done}, this one is at {self.round}: "
                               "the members are out of step")
                if done == self.round:
                    return
                word, watch = self.done, [0]
            left = [p for p in (self.left_W != 0).nonzero().flatten().tolist() if p in missing or p == 0]
            # Read after the left words: the first member writes whom it found gone before it
            # leaves, so a member that sees it left also sees that (x86 keeps loads in order).
            lost = int(self.lost[0])
            gone = [lost - 1] if lost else left
            now = time.monotonic()
            if not gone and now >= next_pid_check:
                gone = [p for p in watch if not pid_alive(int(self.pid_W[p]))]
                next_pid_check = now + _PID_CHECK_S
            if gone:
                if lead:
                    self.lost[0] = gone[0] + 1
                    futex.wake([self.done.data_ptr()])
                self._fail(f"rank(s) {self._ranks(gone)} left the group (raised or exited) before "
                           "the gather completed (as gloo's 'Connection closed by peer')")
            if now > deadline:
                self.left_W[self.me] = 1  # the others must not wait for this one either
                futex.wake([self.done.data_ptr()])
                self._fail(f"timed out after {self.timeout_s:g} s waiting for rank(s) {self._ranks(watch)}")
            seen = int(word[0])  # sleep only on the value that said "not yet"
            if (seen < self.round) if lead else (seen != self.round):
                futex.wait(word, seen, min(deadline - now, _PID_CHECK_S))

    def _ranks(self, members: list[int]) -> list[int]:
        return [self.members[p] for p in members]

    def _fail(self, why: str):
        raise RuntimeError(f"all_gather on the group of ranks {list(self.members)}: {why}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)
