"""Cluster self-check: every collective the testbed relies on, on every group kind.

Each rank learns its groups' members from the wire (an all-gather), never from the
layout, so :func:`check_layouts` can compare what the ranks saw with what the layout
promised. The values each rank sends are functions of its global rank, so every rank
can rebuild what it must receive without asking anyone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from testbed.cluster.layout import DEFAULT_LAYOUTS, GROUP_KINDS, ParallelLayout

# torch 2.13 renamed these (the old names warn); older releases have only the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CollectiveMismatch(AssertionError):
    """A collective delivered something other than what its inputs imply."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise CollectiveMismatch(what)


def collectives_rank(ctx) -> dict:
    """Rank program: run the collectives on each group; return the members seen per kind.

    Returns
    -------
    dict
        ``{"coords": RankCoords, "members": {kind: tuple of global ranks}, "ops": [...]}``.
    """
    me = ctx.rank
    seen: dict[str, tuple[int, ...]] = {}
    ops: list[str] = []
    for kind in GROUP_KINDS:
        group = ctx.groups[kind]
        n = dist.get_world_size(group)
        gathered_N = torch.empty(n, dtype=torch.int64)
        _all_gather(gathered_N, torch.tensor([me]), group=group)
        members = tuple(gathered_N.tolist())
        seen[kind] = members
        _expect(members[dist.get_rank(group)] == me, f"{kind}: own slot holds {members}")

        total = torch.tensor([me + 1], dtype=torch.int64)
        dist.all_reduce(total, group=group)
        _expect(total.item() == sum(m + 1 for m in members), f"{kind}: all_reduce gave {total}")

        value = torch.tensor([me * 10 + 7], dtype=torch.bfloat16)
        dist.broadcast(value, src=members[0], group=group)
        _expect(value.item() == members[0] * 10 + 7, f"{kind}: broadcast gave {value}")

        # Uneven splits: rank i sends (i + j + 1) bytes of value (i * 16 + j) % 251 to rank j.
        me_g = dist.get_rank(group)
        send_sizes = [me_g + j + 1 for j in range(n)]
        recv_sizes = [j + me_g + 1 for j in range(n)]
        send = torch.cat(
            [torch.full((s,), (me * 16 + members[j]) % 251, dtype=torch.uint8)
             for j, s in enumerate(send_sizes)]
        )
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8)
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
        want = torch.cat(
            [torch.full((s,), (members[j] * 16 + me) % 251, dtype=torch.uint8)
             for j, s in enumerate(recv_sizes)]
        )
        _expect(torch.equal(recv, want), f"{kind}: all_to_all_single delivered wrong bytes")

        chunks_N = torch.arange(n, dtype=torch.float32) * 1000 + me
        out = torch.empty(1, dtype=torch.float32)
        _reduce_scatter(out, chunks_N, group=group)
        _expect(out.item() == me_g * 1000 * n + sum(members), f"{kind}: reduce_scatter gave {out}")

        dist.barrier(group=group)
        ops.append(kind)

    # Point to point along the pipeline: each stage sends to the next, receives from the previous.
    pp_members = seen["pp"]
    pp_n, pp_me = len(pp_members), ctx.coords.pp_rank
    if pp_n > 1:
        nxt, prv = pp_members[(pp_me + 1) % pp_n], pp_members[(pp_me - 1) % pp_n]
        inbox = torch.empty(3, dtype=torch.int64)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, torch.tensor([me, me, me]), nxt, group=ctx.groups["pp"]),
            dist.P2POp(dist.irecv, inbox, prv, group=ctx.groups["pp"]),
        ])
        for req in reqs:
            req.wait()
        _expect(inbox.tolist() == [prv] * 3, f"pp: p2p from {prv} gave {inbox.tolist()}")
        ops.append("pp-p2p")
    return {"coords": ctx.coords, "members": seen, "ops": ops}


@dataclass(frozen=True)
class LayoutCheck:
    layout: str
    ok: bool
    seconds: float
    detail: str


def check_layouts(pool, layouts=DEFAULT_LAYOUTS, timeout_s: float = 60.0) -> list[LayoutCheck]:
    """Run :func:`collectives_rank` on each layout and compare the groups the ranks saw
    with the groups the layout defines."""
    results = []
    for text in layouts:
        layout = ParallelLayout.parse(text) if isinstance(text, str) else text
        started = time.monotonic()
        try:
            per_rank = pool.run(collectives_rank, layout, timeout_s=timeout_s, name=f"selfcheck-{layout}")
            wrong = [
                f"rank {r} {kind}: saw {out['members'][kind]}, layout says {layout.group_of(kind, r)}"
                for r, out in enumerate(per_rank)
                for kind in GROUP_KINDS
                if out["members"][kind] != layout.group_of(kind, r)
            ]
            ops = sorted(set(per_rank[0]["ops"]))
            detail = "; ".join(wrong) if wrong else f"groups match; ops on {', '.join(ops)}"
            results.append(LayoutCheck(str(layout), not wrong, time.monotonic() - started, detail))
        except Exception as exc:  # reported per layout: one broken layout must not hide the rest
            results.append(LayoutCheck(str(layout), False, time.monotonic() - started, str(exc)))
    return results
