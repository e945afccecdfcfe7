"""The rank pool's small collectives over shared memory: all-gather (of tensors and of objects),
exact all-reduce, barrier and broadcast.

gloo's all-gather is a ring: W - 1 dependent hops, each waking every rank, so on a laptop's two
cores one all-gather costs O(W^2) context switches (20 ms at 8 ranks, 230 ms at 64; gloo's
all-to-all is no better, and its all-reduce of 64 int64 took 111 ms at 64). ``impl``'s
communicator and FlashInfer's workspace exchange call ``all_gather_object`` at every layer
build, and every forward starts with an all-reduce of the DP token counts. Here each member
of a group writes its bytes into its slot of a segment the members mapped when the group was
made and publishes the round number; the first member waits for every round word and wakes the
others with one word.

- ``all_gather``: same results bit for bit, same checks and messages as torch and gloo (every
  output the input's shape and dtype).
- ``all_gather_object``: one round of pickled bytes (torch's takes two: the sizes, then the
  padded bytes, then a tensor per member); the same pickler, so the same objects.
- ``barrier``: one round of nothing, after this process's unfinished asynchronous gloo work
  on the group (gloo's barrier waits for the work queued before it).
- ``broadcast``: the root's bytes in one round.
- ``all_reduce`` of integer tensors with an exact operation (sum, product, min, max, bitwise):
  every member reduces the gathered rows itself. Exact, so bit for bit what gloo's order gives;
  a floating-point reduction stays on gloo, whose summation order it would not reproduce.

Each round's header says what every member called (the collective, the reduce op or the
broadcast's root, the dtype and size): members that make different calls, or pass different
shapes, fail with both calls named, where gloo would mix the bytes or hang. Stricter than gloo
where gloo is wrong: a non-contiguous tensor to all_reduce or broadcast is refused (gloo works
on the elements from its first one, ignoring the strides; NCCL refuses it too). Not as gloo:
a call with ``async_op=True`` completes before it returns (every member must have made it), so
a program that made an asynchronous collective and then waited for a peer's point-to-point
send before its own wait would stall here; work handles and their futures are otherwise
gloo's (the outputs, none for a barrier).

Same timeout; a member that left its group (raised) or died fails the others, as gloo's closed
connections do. Every other collective stays on gloo, and so does a call of a dtype gloo
refuses or of more than a slot: what decides is what every member passes alike (the outputs,
the tensor's shape and dtype and the operation, or every member's object size once gathered),
never one member's own arguments, so the members never split between the two.

Only the pool's ranks use it (they share one host); launched ranks (torchrun, possibly over
several nodes) keep gloo's. Legend: W members of the group.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import _create_work_from_future

from fakes import futex
from fakes.arena import ShmArena, pid_alive

SLOT_BYTES = 64 << 10  # larger calls stay on gloo
_NOTHING = torch.empty(0, dtype=torch.uint8)
# The dtypes gloo gathers (it refuses int16, uint16/32/64 and fp8: "Invalid scalar type").
_DTYPES = {dtype: code for code, dtype in enumerate(
    (torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
     torch.float64, torch.bool, torch.complex64, torch.complex128), start=1)}
_PID_CHECK_S = 0.05
_REDUCE_DTYPES = (torch.uint8, torch.int8, torch.int32, torch.int64)
_R = dist.ReduceOp.RedOpType
# On the gathered [W, ...] rows.
_REDUCE = {
    _R.SUM: lambda rows: rows.sum(0), _R.PRODUCT: lambda rows: rows.prod(0),
    _R.MIN: lambda rows: rows.amin(0), _R.MAX: lambda rows: rows.amax(0),
    _R.BAND: lambda rows: functools.reduce(torch.bitwise_and, rows.unbind(0)),
    _R.BOR: lambda rows: functools.reduce(torch.bitwise_or, rows.unbind(0)),
    _R.BXOR: lambda rows: functools.reduce(torch.bitwise_xor, rows.unbind(0)),
}
_SERVED = ("all_gather", "all_gather_object", "all_reduce", "barrier", "broadcast")

_groups: dict[int, "_Segment"] = {}  # id(group) -> its segment (which holds the group)
_torch: dict = {}  # name -> torch's own function, once installed
_pending: dict[int, list] = {}  # id(group) -> this process's unfinished async works of gloo on it
_failed = False  # a round failed since the groups were attached: the world must not be kept


def install() -> None:
    """Route ``torch.distributed``'s ``all_gather``, ``all_gather_object``, ``all_reduce``,
    ``barrier`` and ``broadcast`` on the groups given to :func:`attach` through their segments, in this process
    (idempotent). Does nothing where :mod:`fakes.futex` is unavailable."""
    if _torch or not futex.AVAILABLE:
        return
    for name in _SERVED:
        _torch[name] = getattr(c10d, name)
        setattr(c10d, name, globals()[name])  # torch's names, so a stuck rank's stack reads as torch's
        setattr(dist, name, globals()[name])


def attach(group, members: tuple[int, ...], arena: ShmArena, timeout_s: float) -> None:
    """Collective over ``group`` (global ranks ``members``, in group order): its first member
    creates the group's segment in ``arena``, every member maps it, then the name goes (the
    mappings stay). Nothing for a one-member group or where :func:`install` did nothing."""
    if not _torch or len(members) < 2:
        return
    W, me = len(members), dist.get_rank(group)
    key = "gather-" + hashlib.sha1(repr(members).encode()).hexdigest()[:16]
    nbytes = _Segment.data_at(W) + 2 * W * SLOT_BYTES
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
    """No round failed since the groups were attached (after a failure, members may be out
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


def _segment(group) -> "_Segment | None":
    return _groups.get(id(group if group is not None else dist.group.WORLD))


def _on_gloo(name: str, *args, **kwargs):
    """torch's own ``name``; an asynchronous work is kept until done (a barrier waits for it,
    as gloo's waits for the work queued before it)."""
    work = _torch[name](*args, **kwargs)
    if kwargs.get("async_op") and work is not None:
        group = kwargs["group"]
        key = id(group if group is not None else dist.group.WORLD)
        _pending[key] = [w for w in _pending.get(key, []) if not w.is_completed()] + [work]
    return work


def _plain(tensor) -> bool:
    """A dense CPU tensor a slot holds (sparse ones, and the rest, stay on gloo)."""
    return (isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided and tensor.is_cpu
            and tensor.dtype in _DTYPES and tensor.nbytes <= SLOT_BYTES)


def _contiguous(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_contiguous():
        raise RuntimeError(f"{name}: tensor must be contiguous, as NCCL requires (gloo would work on the "
                           f"{tensor.numel()} elements from its first one, ignoring the strides "
                           f"{tuple(tensor.stride())}); pass tensor.contiguous() and copy back")


def all_gather(tensor_list, tensor, group=None, async_op=False):
    segment = _segment(group)
    if segment is None or not segment.serves(tensor_list):
        return _on_gloo("all_gather", tensor_list, tensor, group=group, async_op=async_op)
    c10d._check_tensor_list(tensor_list, "tensor_list")
    c10d._check_single_tensor(tensor, "tensor")
    c10d._ensure_all_tensors_same_dtype(tensor_list, tensor)
    for i, out in enumerate(tensor_list):
        if out.shape != tensor.shape:
            raise RuntimeError(f"ProcessGroupGloo::allgather: invalid tensor size at index {i} "
                               f"(expected {_shape(tensor)}, got {_shape(out)})")
    segment.gather("all_gather", tensor_list, tensor)
    return _done(tensor_list) if async_op else None


def all_gather_object(object_list, obj, group=None):
    segment = _segment(group)
    if segment is None:
        return _torch["all_gather_object"](object_list, obj, group=group)
    f = io.BytesIO()
    c10d._pickler(f).dump(obj)
    sizes_W, flat = segment.exchange("all_gather_object", torch.frombuffer(bytearray(f.getvalue()), dtype=torch.uint8),
                                     _code("all_gather_object"), same_size=False)
    if max(sizes_W) > SLOT_BYTES:  # every member read the same sizes: all go to gloo together
        return _torch["all_gather_object"](object_list, obj, group=group)
    for p, n in enumerate(sizes_W):
        object_list[p] = c10d._unpickler(io.BytesIO(flat[p * SLOT_BYTES:p * SLOT_BYTES + n])).load()


def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    segment = _segment(group)
    kind = op if isinstance(op, _R) else getattr(op, "op", None)  # ReduceOp(SUM) is SUM
    reduce = _REDUCE.get(kind) if isinstance(kind, _R) else None
    if (segment is None or reduce is None or not _plain(tensor) or tensor.dtype not in _REDUCE_DTYPES
            or segment.group in c10d._world.pg_coalesce_state):
        return _on_gloo("all_reduce", tensor, op=op, group=group, async_op=async_op)
    c10d._check_single_tensor(tensor, "tensor")
    _contiguous("all_reduce", tensor)
    rows = torch.empty((len(segment.members), *tensor.shape), dtype=tensor.dtype)
    segment.gather("all_reduce", list(rows.unbind(0)), tensor, arg=int(kind))
    with torch.no_grad():
        tensor.copy_(reduce(rows))  # a wider result wraps back on the copy, as gloo wraps
    return _done([tensor]) if async_op else None


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    segment = _segment(group)
    if segment is None:
        return _torch["barrier"](group=group, async_op=async_op, device_ids=device_ids, timeout=timeout)
    for work in _pending.pop(id(segment.group), []):
        work.wait()
    segment.exchange("barrier", _NOTHING, _code("barrier"), None if timeout is None else timeout.total_seconds())
    return _done([]) if async_op else None


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    segment = _segment(group)
    if segment is None or not _plain(tensor) or segment.group in c10d._world.pg_coalesce_state:
        return _on_gloo("broadcast", tensor, src=src, group=group, async_op=async_op, group_src=group_src)
    root = c10d._canonicalize_group_rank(segment.group, src, group_src, return_global=False)
    c10d._check_single_tensor(tensor, "tensor")
    if not 0 <= root < len(segment.members):
        raise RuntimeError(f"ProcessGroupGloo::broadcast: invalid root rank: {root}")
    _contiguous("broadcast", tensor)
    n = tensor.nbytes
    # The root sends its bytes; every member announces the size and the root it expects.
    _, flat = segment.exchange("broadcast", _bytes(tensor) if segment.me == root else _NOTHING,
                               _code("broadcast", root, tensor.dtype), size=n)
    if segment.me != root and n:
        with torch.no_grad():
            tensor.copy_(torch.frombuffer(flat, dtype=torch.uint8, count=n, offset=root * SLOT_BYTES)
                         .view(tensor.dtype).view(tensor.shape))
    return _done([tensor]) if async_op else None


def _done(result):
    """A completed work handle (the call already finished), whose future holds what gloo's
    would: the output tensors (none for a barrier)."""
    done = torch.futures.Future()
    done.set_result(result)
    return _create_work_from_future(done)


def _code(name: str, arg: int = 0, dtype: torch.dtype | None = None) -> int:
    """What a member called, as its round header says: the collective, its argument (the
    reduce op, the broadcast's root) and the dtype."""
    return (_SERVED.index(name) + 1) << 40 | arg << 8 | (0 if dtype is None else _DTYPES[dtype])


def _shape(t: torch.Tensor) -> str:
    """A shape as gloo prints it (complex tensors travel as their real view)."""
    dims = torch.view_as_real(t).shape if t.is_complex() else t.shape
    return "(" + ", ".join(map(str, dims)) + ")"


class _Segment:
    """One group's collective memory: per member a round word, a left word and its pid; the
    round the first member saw complete and the member it found gone (plus one); then two banks
    of W headers and two banks of W slots (round r uses bank r % 2: a member starts round r + 2 only after round r + 1 completed, so
    after every member read round r). Only the first member waits for every round word, so a
    round costs O(W) wake-ups, not one per member per member."""

    def __init__(self, group, members, me, raw: torch.Tensor, timeout_s: float) -> None:
        W = len(members)
        self.group, self.members, self.me, self.timeout_s = group, members, me, timeout_s
        words = raw[:4 * (3 * W + 2)].view(torch.int32)
        self.seq_W, self.left_W, self.pid_W = words[:W], words[W:2 * W], words[2 * W:3 * W]
        self.done, self.lost = words[3 * W:3 * W + 1], words[3 * W + 1:]
        # Per bank and member: int64 bytes sent, int64 call code (_code); together, so a
        # member reads every header from a page or two.
        at = self.headers_at(W)
        self.headers = raw[at:at + 2 * W * 16].view(torch.int64).view(2, W, 2)
        self.slots = raw[self.data_at(W):].view(2, W, SLOT_BYTES)
        self.round, self.call = 0, "all_gather"

    @staticmethod
    def headers_at(W: int) -> int:
        return -(-4 * (3 * W + 2) // 64) * 64

    @classmethod
    def data_at(cls, W: int) -> int:
        return cls.headers_at(W) + -(-2 * W * 16 // 4096) * 4096

    def serves(self, tensor_list) -> bool:
        """Whether this gather goes through the segment: decided on the outputs, which every
        member passes alike."""
        return len(tensor_list) == len(self.members) and _plain(tensor_list[0])

    def exchange(self, call: str, payload: torch.Tensor, code: int, timeout_s: float | None = None,
                 size: int | None = None, same_size: bool = True) -> tuple[list[int], memoryview]:
        """One round of ``call``: publish ``payload`` (1-D uint8; only its size where it
        exceeds a slot), its ``size`` (the payload's if None) and ``code`` (:func:`_code`),
        wait for every member. Returns every member's size and the bank's bytes (member
        ``p``'s payload at ``p * SLOT_BYTES``), valid until this member's next round. A member
        that made another call, or (``same_size``) announced another size, is reported.
        ``timeout_s``: the group's if None."""
        global _failed
        self.call = call
        try:
            self.round += 1
            bank, headers = self.slots[self.round % 2], self.headers[self.round % 2]
            n = payload.numel()
            headers[self.me] = torch.tensor([n if size is None else size, code])
            if n <= SLOT_BYTES:
                bank[self.me, :n] = payload
            self.seq_W[self.me] = self.round  # after the data: x86 keeps stores in order
            if self.me != 0:
                futex.wake([self.seq_W[self.me:self.me + 1].data_ptr()])
            self._wait(self.timeout_s if timeout_s is None else timeout_s)
            header_W = headers.tolist()
            mine = header_W[self.me]
            other = next((p for p, (_, c) in enumerate(header_W) if c != code), None)
            if other is not None:
                self._fail(f"rank {self.members[other]} made {self._what(*header_W[other])}, rank "
                          f"{self.members[self.me]} {self._what(*mine)} (every member must make the same call)")
            other = next((p for p, (z, _) in enumerate(header_W) if z != mine[0]), None) if same_size else None
            if other is not None:
                self._fail(f"rank {self.members[other]} sent {self._what(*header_W[other], bare=True)}, rank "
                          f"{self.members[self.me]} {self._what(*mine, bare=True)} (every member must pass the "
                          "same shape and dtype)")
        except BaseException:
            _failed = True
            raise
        return [z for z, _ in header_W], memoryview(bank.numpy()).cast("B")

    def gather(self, call: str, tensor_list, tensor, arg: int = 0) -> None:
        n = tensor.nbytes
        self.exchange(call, _bytes(tensor.contiguous()), _code(call, arg, tensor.dtype))
        bank = self.slots[self.round % 2]
        first = tensor_list[0]
        at = first.data_ptr()
        with torch.no_grad():
            if (all(out.is_contiguous() and out.data_ptr() == at + p * n for p, out in enumerate(tensor_list))
                    and first.storage_offset() * first.element_size() + len(tensor_list) * n
                    <= first.untyped_storage().nbytes()):
                # Consecutive slices of the first one's memory (as all_reduce passes): one copy.
                torch.as_strided(_bytes(first), (len(tensor_list), n), (n, 1)).copy_(bank[:, :n])
                return
            for p, out in enumerate(tensor_list):
                out.copy_(bank[p, :n].view(out.dtype).view(out.shape))

    def _what(self, size: int, code: int, bare: bool = False) -> str:
        """A round header in words: the call (unless ``bare``) and what it sent."""
        name, arg = _SERVED[(code >> 40) - 1], (code >> 8) & 0xFFFFFFFF
        dtype = next((d for d, c in _DTYPES.items() if c == code & 0xFF), None)
        sent = f"a {size}-byte object" if name == "all_gather_object" else f"{size} bytes of {dtype}"
        if bare:
            return sent
        if name == "barrier":
            return "a barrier"
        if name == "all_reduce":
            name += f" ({_R(arg).name})"
        elif name == "broadcast":
            name += f" from rank {self.members[arg]}"
        return f"{name} of {sent}"

    def _wait(self, timeout_s: float) -> None:
        """Until round ``self.round`` completed; raises when a member left or died, when the
        members are out of step, and at the timeout."""
        deadline = time.monotonic() + timeout_s
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
            left = (self.left_W != 0).nonzero().flatten().tolist()
            # Read after the left words (x86 keeps loads in order): the first member writes whom
            # it found gone before it leaves, and a member that arrived and then left (after the
            # round completed, or on finding another gone) published its round word first.
            lost = int(self.lost[0])
            if not lead and int(self.done[0]) == self.round:
                return
            missing = (self.seq_W < self.round).nonzero().flatten().tolist()
            gone = [lost - 1] if lost else [p for p in left if p in missing or (p == 0 and not lead)]
            now = time.monotonic()
            if not gone and now >= next_pid_check:
                gone = [p for p in watch if not pid_alive(int(self.pid_W[p]))]
                next_pid_check = now + _PID_CHECK_S
            if gone:
                if lead:
                    self.lost[0] = gone[0] + 1
                    futex.wake([self.done.data_ptr()])
                self._fail(f"rank(s) {self._ranks(gone)} left the group (raised or exited) before "
                          f"the {self.call} completed (as gloo's 'Connection closed by peer')")
            if now > deadline:
                self.left_W[self.me] = 1  # the others must not wait for this one either
                futex.wake([self.done.data_ptr()])
                self._fail(f"timed out after {timeout_s:g} s waiting for rank(s) {self._ranks(watch)}")
            seen = int(word[0])  # sleep only on the value that said "not yet"
            if (seen < self.round) if lead else (seen != self.round):
                futex.wait(word, seen, min(deadline - now, _PID_CHECK_S))

    def _ranks(self, members: list[int]) -> list[int]:
        return [self.members[p] for p in members]

    def _fail(self, why: str):
        raise RuntimeError(f"{self.call} on the group of ranks {list(self.members)}: {why}")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)
