"""Rank programs used by the tests (module level, so the rank processes can import them)."""

from __future__ import annotations

import functools
import os
import tempfile
import threading

import torch
import torch.distributed as dist

from testbed.cluster.faults import stall_forever


def pid(ctx) -> int:
    return os.getpid()


def temporary_file(ctx) -> str:
    """A file left in the temporary folder, as an engine's socket file is."""
    fd, path = tempfile.mkstemp(prefix="a2atb-test-left-")
    os.close(fd)
    return path


def unpicklable_result(ctx):
    return threading.Lock()


def one_sided_puts(ctx) -> list[list[int]]:
    """Every rank writes a 16-byte tag into every EP peer's row, then reads its own row."""
    n, me = ctx.layout.ep_size, ctx.coords.ep_rank
    ws_RB = ctx.arena.tensor("ws", (n, 16 * n), torch.uint8, group=ctx.groups["ep"])
    for peer in range(n):
        ws_RB[peer, me * 16:(me + 1) * 16] = (me * n + peer) % 256
    dist.barrier(group=ctx.groups["ep"])
    return ws_RB[me].view(n, 16)[:, 0].tolist()


def create_then_raise(ctx) -> None:
    ctx.arena.create(f"seg{ctx.rank}", 4096)
    dist.barrier()
    if ctx.rank == 1:
        raise RuntimeError(f"created {ctx.arena.path(f'seg{ctx.rank}')}")
    dist.barrier()


def create_then_die(ctx) -> None:
    ctx.arena.create(f"seg{ctx.rank}", 4096)
    dist.barrier()
    if ctx.rank == 1:
        os.kill(os.getpid(), 9)
    dist.barrier()


def hold_segment(ctx) -> None:
    """Create a segment, say so on stdout, then never return (for parent-death tests)."""
    ctx.arena.create(f"seg{ctx.rank}", 4096)
    # One write() below PIPE_BUF is atomic; print() may split text and newline, and the
    # two ranks' lines then interleave.
    os.write(1, f"READY {ctx.rank} {os.getpid()} {ctx.arena.path(f'seg{ctx.rank}')}\n".encode())
    stall_forever()


def hold_gil(ctx, rank: int) -> None:
    """``rank`` spins inside the regex engine, which never releases the GIL."""
    import re

    if ctx.rank == rank:
        re.match(r"(a+)+$", "a" * 64 + "b")
    dist.barrier()


def world_mark(ctx, raise_on: int | None = None) -> str:
    """Check an all-reduce on every group of the layout, then return a mark of this
    process's default group, its store's file and the group object: the same mark in a later
    scenario means the same world was kept. ``raise_on``: the rank that raises after the checks."""
    for kind, group in ctx.groups.items():
        total = torch.tensor([ctx.rank])
        dist.all_reduce(total, group=group)
        assert int(total) == sum(ctx.group_ranks[kind]), (kind, int(total), ctx.group_ranks[kind])
    store = dist.distributed_c10d._get_default_store()
    while not hasattr(store, "path"):
        store = store.underlying_store
    if ctx.rank == raise_on:
        raise RuntimeError(f"rank {ctx.rank} fails on purpose")
    return f"{store.path}:{id(dist.group.WORLD)}"


def _gather_input(seed: int, rank: int, dtype: torch.dtype, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(n, generator=g).to(dtype) if not dtype.is_complex else torch.randn(
            n, dtype=dtype, generator=g)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    return torch.randint(0, 100, (n,), generator=g).to(dtype)


def all_gathers(ctx, seed: int) -> tuple[int, int]:
    """all_gather (several dtypes, strided input and outputs, past a slot, asynchronous),
    all_gather_object and the calls torch and gloo refuse, on every group; every rank rebuilds
    every member's input from the seed. Returns how many gathers were checked and how many
    went through shared memory."""
    from testbed.cluster import shm_collectives

    rounds_before = sum(seg.round for seg in shm_collectives._groups.values())
    checked = 0
    for kind, group in ctx.groups.items():
        members = ctx.group_ranks[kind]
        me = members.index(ctx.rank)
        n = int(torch.randint(1, 40, (1,), generator=torch.Generator().manual_seed(seed)))
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint8, torch.complex64):
            want = [_gather_input(seed, r, dtype, n) for r in members]
            out = [torch.empty_like(w) for w in want]
            dist.all_gather(out, want[me], group=group)
            assert all(torch.equal(o, w) for o, w in zip(out, want)), (kind, dtype)
            checked += 1
        for m, step, async_op in ((70_000, 1, False), (64, 2, False), (16, 1, True)):  # past a slot, strided, async
            want = [_gather_input(seed, r, torch.uint8, m * step)[::step] for r in members]
            out = [torch.empty(m * step, dtype=torch.uint8)[::step] for _ in members]
            work = dist.all_gather(out, want[me], group=group, async_op=async_op)
            if async_op:
                assert work.wait()
            assert all(torch.equal(o, w) for o, w in zip(out, want)), (kind, m, step, async_op)
            checked += 1
        objs = [None] * len(members)
        dist.all_gather_object(objs, {"rank": ctx.rank, "items": list(range(seed + ctx.rank))}, group=group)
        assert objs == [{"rank": r, "items": list(range(seed + r))} for r in members], kind
        checked += 1
        for outs, x, error in (
                ([torch.zeros(2)] * (len(members) - 1) + [torch.zeros(3)], torch.zeros(2),
                 f"invalid tensor size at index {len(members) - 1} (expected (2), got (3))"),
                ([torch.zeros(2)] * len(members), torch.zeros(3), "invalid tensor size at index 0 (expected (3), got (2))"),
                ([torch.zeros(2, dtype=torch.float8_e4m3fn)] * len(members), torch.zeros(2, dtype=torch.float8_e4m3fn),
                 "Invalid scalar type"),
                ([torch.zeros(2, dtype=torch.int32)] * len(members), torch.zeros(2), "different dtypes")):
            try:
                dist.all_gather(outs, x, group=group)
            except (RuntimeError, ValueError) as exc:
                assert error in str(exc), (kind, str(exc))
            else:
                raise AssertionError(f"{kind}: all_gather took {[tuple(o.shape) for o in outs]} from {tuple(x.shape)}")
            checked += 1
    return checked, sum(seg.round for seg in shm_collectives._groups.values()) - rounds_before


def _wrapped(value: int, dtype: torch.dtype) -> int:
    """``value`` as a ``dtype`` integer holds it: modulo 2**bits, signed where the dtype is."""
    bits = torch.iinfo(dtype).bits
    value %= 1 << bits
    return value - (1 << bits) if torch.iinfo(dtype).min < 0 and value >= 1 << (bits - 1) else value


_INT_OPS = {
    dist.ReduceOp.SUM: lambda a, b: a + b, dist.ReduceOp.PRODUCT: lambda a, b: a * b,
    dist.ReduceOp.MIN: min, dist.ReduceOp.MAX: max, dist.ReduceOp.BAND: lambda a, b: a & b,
    dist.ReduceOp.BOR: lambda a, b: a | b, dist.ReduceOp.BXOR: lambda a, b: a ^ b,
}


def _int_input(seed: int, rank: int, dtype: torch.dtype, shape: tuple, step: int) -> torch.Tensor:
    """Values over all of ``dtype``'s range, as a ``shape`` view with stride ``step``."""
    g = torch.Generator().manual_seed(seed * 7919 + rank * 31 + len(shape) + step)
    info = torch.iinfo(dtype)
    values = torch.randint(info.min, info.max, (max(1, torch.Size(shape).numel()) * step,), generator=g,
                           dtype=torch.int64)
    return values.to(dtype)[::step].reshape(shape)


def _strided_input(seed: int, rank: int, dtype: torch.dtype, shape: tuple, step: int) -> torch.Tensor:
    return _gather_input(seed, rank, dtype, max(1, torch.Size(shape).numel()) * step)[::step].reshape(shape)


def _rounds(segment) -> int:
    return 0 if segment is None else segment.round


def all_reduces(ctx, seed: int) -> int:
    """On every group: all_reduce of every integer dtype gloo takes with every exact operation
    (values over the whole range, so sums and products wrap), 0-d and asynchronous (the work's
    future holds ``[tensor]``, as gloo's), checked against Python integers element by element,
    each in exactly one shared-memory round; ``ReduceOp(SUM)`` as ``SUM``; a float sum and a
    sparse sum (gloo's, no round). Broadcasts of several dtypes and shapes from several roots
    (named globally or in the group), into a parameter that requires grad, and a
    broadcast_object_list past a slot. A strided tensor and an invalid root are refused.
    all_gather_object with one member's object larger than a slot (every member falls back to
    torch's together). Returns how many calls were checked."""
    from testbed.cluster import shm_collectives

    checked = 0
    for kind, group in ctx.groups.items():
        members = ctx.group_ranks[kind]
        segment = shm_collectives._groups.get(id(group))
        rounds = functools.partial(_rounds, segment)
        served = 1 if segment is not None else 0
        for dtype in (torch.uint8, torch.int8, torch.int32, torch.int64):
            for op, fold in _INT_OPS.items():
                for shape, async_op in (((5,), False), ((), False), ((4,), True)):
                    inputs = [_int_input(seed, r, dtype, shape, 1) for r in members]
                    want = [_wrapped(functools.reduce(fold, (int(x.reshape(-1)[i]) for x in inputs)), dtype)
                            for i in range(inputs[0].numel())]
                    mine, before = _int_input(seed, ctx.rank, dtype, shape, 1), rounds()
                    work = dist.all_reduce(mine, op=dist.ReduceOp(op) if async_op else op, group=group,
                                           async_op=async_op)
                    if async_op:
                        work.wait()
                        assert [t.data_ptr() for t in work.get_future().value()] == [mine.data_ptr()]
                    assert mine.reshape(-1).tolist() == want, (kind, dtype, op, shape)
                    assert rounds() - before == served, (kind, dtype, op, shape)
                    checked += 1
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
            for root_at, shape, async_op in ((0, (6,), False), (-1, (), False), (1, (3, 2), True)):
                root = members[root_at % len(members)]
                mine = _strided_input(seed + root_at, ctx.rank, dtype, shape, 1)
                by_group_rank = root_at % 2 == 1  # name the root as a group rank half of the time
                work = dist.broadcast(mine, **({"group_src": members.index(root)} if by_group_rank else {"src": root}),
                                      group=group, async_op=async_op)
                if async_op:
                    work.wait()
                    assert [t.data_ptr() for t in work.get_future().value()] == [mine.data_ptr()]
                assert torch.equal(mine, _strided_input(seed + root_at, root, dtype, shape, 1)), (kind, dtype, root)
                checked += 1
        weight = torch.nn.Parameter(_strided_input(seed, ctx.rank, torch.float32, (4,), 1))
        dist.broadcast(weight, src=members[-1], group=group)
        assert torch.equal(weight.detach(), _strided_input(seed, members[-1], torch.float32, (4,), 1)), kind
        box = [bytes(100_000) if ctx.rank == members[0] else None, "small"]
        dist.broadcast_object_list(box, src=members[0], group=group)  # the bytes past a slot: gloo's
        assert box == [bytes(100_000), "small"], kind
        checked += 2
        if segment is not None:
            for call, kwargs in ((dist.all_reduce, {}), (dist.broadcast, {"src": members[0]})):
                try:
                    call(torch.zeros(4, 2, dtype=torch.int32).t(), group=group, **kwargs)
                except RuntimeError as exc:
                    assert "tensor must be contiguous" in str(exc), str(exc)
                else:
                    raise AssertionError(f"{kind}: a strided tensor went through")
                checked += 1
            try:
                dist.broadcast(torch.zeros(2), group_src=len(members), group=group)
            except RuntimeError as exc:
                assert f"invalid root rank: {len(members)}" in str(exc), str(exc)
            else:
                raise AssertionError(f"{kind}: a broadcast from group rank {len(members)} went through")
            checked += 1
        floats = [_gather_input(seed, r, torch.float32, 6) for r in members]
        got, before = _gather_input(seed, ctx.rank, torch.float32, 6), rounds()
        dist.all_reduce(got, group=group)
        assert torch.allclose(got.double(), torch.stack(floats).double().sum(0), atol=1e-5), kind
        sparse = torch.sparse_coo_tensor([[members.index(ctx.rank)]], [ctx.rank + 1], (len(members),),
                                         check_invariants=True)
        dist.all_reduce(sparse, group=group)
        assert sparse.to_dense().tolist() == [r + 1 for r in members], kind
        assert rounds() == before, kind  # both gloo's
        checked += 2
        big = ctx.rank == members[0]
        objs = [None] * len(members)
        dist.all_gather_object(objs, bytes(100_000) if big else ctx.rank, group=group)
        assert objs == [bytes(100_000) if r == members[0] else r for r in members], kind
        checked += 1
    return checked


_CALLS = {
    "object": lambda ws: dist.all_gather_object([None] * ws, "x"),
    "gather": lambda ws: dist.all_gather([torch.zeros(3, dtype=torch.int32) for _ in range(ws)],
                                         torch.zeros(3, dtype=torch.int32)),
    "sum": lambda ws: dist.all_reduce(torch.zeros(3, dtype=torch.int32)),
    "max": lambda ws: dist.all_reduce(torch.zeros(3, dtype=torch.int32), op=dist.ReduceOp.MAX),
    "barrier": lambda ws: dist.barrier(),
    "broadcast0": lambda ws: dist.broadcast(torch.zeros(3, dtype=torch.int32), src=0),
    "broadcast1": lambda ws: dist.broadcast(torch.zeros(3, dtype=torch.int32), src=1),
    "broadcast-short": lambda ws: dist.broadcast(torch.zeros(2, dtype=torch.int32), src=0),
}


def different_calls(ctx, calls: tuple[str, str]) -> None:
    """Rank 0 makes the first call of :data:`_CALLS` where rank 1 makes the second."""
    _CALLS[calls[0] if ctx.rank == 0 else calls[1]](ctx.world_size)


def barrier_after_async_work(ctx) -> bool:
    """An asynchronous float all-reduce (gloo's), then a barrier: after the barrier the work
    is complete and its result there, as gloo's barrier guarantees."""
    t = torch.ones(1 << 20)  # float and past a slot: gloo's; large, so not done by itself at the barrier
    work = dist.all_reduce(t, async_op=True)
    dist.barrier()
    done = work.is_completed() and bool((t == ctx.world_size).all())
    work.wait()
    return done


def barrier_order(ctx) -> bool:
    """Every rank appends its line to a file, the last after a while of busy work, then a barrier
    of the world; after it every rank must read every line, and the barrier must have gone
    through shared memory."""
    import tempfile

    from testbed.cluster import shm_collectives

    box = [tempfile.mkstemp(prefix="a2atb-barrier-")[1] if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    segment = shm_collectives._groups[id(dist.group.WORLD)]
    if ctx.rank == ctx.world_size - 1:
        sum(i * i for i in range(2_000_000))  # arrive late, by work (no sleep)
    fd = os.open(box[0], os.O_WRONLY | os.O_APPEND)
    os.write(fd, f"{ctx.rank}\n".encode())
    os.close(fd)
    rounds = segment.round
    dist.barrier()
    with open(box[0]) as f:
        seen = sorted(int(line) for line in f)
    dist.barrier(async_op=True).wait()
    if ctx.rank == 0:
        os.unlink(box[0])
    return seen == list(range(ctx.world_size)) and segment.round == rounds + 2


def gather_after_peer_leaves(ctx, how: str) -> None:
    """Rank 1 raises (or is killed) instead of joining an all-gather of the world."""
    if ctx.rank == 1:
        if how == "kill":
            os.kill(os.getpid(), 9)
        raise RuntimeError("rank 1 leaves before the gather")
    dist.all_gather_object([None] * ctx.world_size, ctx.rank)


def gather_with_wrong_sizes(ctx) -> None:
    """Each rank consistent with itself, not with the other: rank 0 gathers 4 elements, rank 1 3."""
    n = 4 if ctx.rank == 0 else 3
    dist.all_gather([torch.empty(n, dtype=torch.int32) for _ in range(ctx.world_size)], torch.zeros(n, dtype=torch.int32))


def make_own_groups(ctx) -> tuple[tuple[int, ...], int]:
    """A scenario that builds process groups of its own, as an engine's parallel state does:
    two of the whole world (one destroyed at the end, one left, as FlashInfer's
    TorchDistBackend.Split leaves its own) and one with a timeout, each checked by an
    all-reduce. Returns the groups' ids and the world's group count."""
    world = list(range(ctx.world_size))
    groups = [dist.new_group(world), dist.new_group(world, use_local_synchronization=True),
              dist.new_group(world, timeout=ctx.pg_timeout)]
    for group in groups:
        total = torch.tensor([1])
        dist.all_reduce(total, group=group)
        assert int(total) == ctx.world_size
    ctx.add_cleanup(lambda: dist.destroy_process_group(groups[0]))
    return tuple(id(g) for g in groups), len(dist.distributed_c10d._world.pg_map)


def exit_at_start() -> None:
    """A worker initializer that ends the process before it reports ready."""
    os._exit(7)


def alias_flashinfer(profile: str) -> None:
    """A worker initializer: from now on ``import flashinfer`` in this rank process is the
    fake imitating ``profile`` (what a machine with the real package would import)."""
    from fakes.flashinfer import install

    _ALIAS.append(install(profile))  # kept: a collected context manager would leave its block
    _ALIAS[-1].__enter__()


_ALIAS: list = []
