"""Fake against real: the same routing and payloads through two backends' ``MoeAlltoAll``.

On every EP rank, each backend in turn gets a one-sided workspace from ``impl``'s manager,
dispatches this rank's ``[x, topk_ids, topk_weights]`` (ids sanitized past each source's
count), runs the same linear experts on what arrived and combines. Compared order-insensitively
(slot order is not fixed on GPUs): per source, the count (also against what the routing
implies) and the arrived rows as a multiset;
whether every id past the count is the invalid id; the combined output against the other
side and against a dense fp32 reference that never calls either. A difference is a bug in the
fake (or in the real release): :func:`differential` returns both sides to print.

Legend: T tokens of this rank, K top_k, H hidden, R EP ranks, S slots per source.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from testbed.scenario.moe import MoECase, one_sided_manager, rank_api, rank_device, rank_inputs
from testbed.scenario.reference import local_experts

INVALID_ID = -1
RTOL = 2e-2  # the expert outputs travel as bf16


@dataclass
class Side:
    """What one backend did on one rank."""

    backend: str
    counts_R: list[int]  # rows that arrived from each source
    rows_R: list[list[str]]  # per source, the sorted digests of the arrived (x, ids, w) rows
    sanitized: bool  # every id past each source's count is INVALID_ID
    raw_digest: str  # the received tensors as laid out (slot order included)
    out_TH: torch.Tensor  # combined, fp32 on the CPU

    def describe(self) -> str:
        return (f"{self.backend}: counts {self.counts_R}, rows {[[d[:8] for d in r] for r in self.rows_R]}, "
                f"sanitized {self.sanitized}")


def expert_scale_TK(ids_TK: torch.Tensor, w_TK: torch.Tensor) -> torch.Tensor:
    """Expert ``e`` is ``x -> (e + 1) * x``: lane k of a token adds ``w * (e + 1) * x``."""
    return w_TK.float() * (ids_TK.float() + 1)


def reference_TH(case: MoECase, rank: int) -> torch.Tensor:
    """Dense fp32: ``sum_k w[t, k] * (ids[t, k] + 1) * x[t]``."""
    x_TH, ids_TK, w_TK = rank_inputs(case, rank)
    return x_TH.float() * expert_scale_TK(ids_TK, w_TK).sum(1, keepdim=True)


def one_side(ctx, case: MoECase, backend: str, *, profile: str = "0.7.2", slot_order: str = "shuffled") -> Side:
    """``case`` through ``backend``'s ``MoeAlltoAll`` on this rank (``profile`` and
    ``slot_order``: the fake's)."""
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    device = rank_device(ctx, backend)
    manager = one_sided_manager(ctx, rank_api(ctx, backend, profile, slot_order))
    S, K, H = case.max_tokens, case.top_k, case.hidden
    manager.initialize(max_num_tokens=S, top_k=K, num_experts=case.num_experts, hidden_size=H,
                       x_bytes_per_token=2 * H, x_sf_bytes_per_token=0)
    try:
        x_TH, ids_TK, w_TK = (t.to(device) for t in rank_inputs(case, me))
        recv_x_RSH, recv_ids_RSK, recv_w_RSK = manager.moe_alltoall.dispatch(
            ids_TK, [x_TH, ids_TK, w_TK], S, invalid_token_expert_id=INVALID_ID, expert_id_payload_index=1)
        x_RSH, ids_RSK, w_RSK = (t.cpu() for t in (recv_x_RSH, recv_ids_RSK, recv_w_RSK))  # before combine reuses memory
        experts = local_experts(case.num_experts, R, me)
        local_RSK = (recv_ids_RSK >= experts.start) & (recv_ids_RSK < experts.stop)
        scale_RS = torch.where(local_RSK, expert_scale_TK(recv_ids_RSK, recv_w_RSK), 0).sum(-1, keepdim=True)
        out_TH = torch.empty(x_TH.shape, dtype=x_TH.dtype, device=device)
        manager.combine_into((recv_x_RSH.float() * scale_RS).to(x_TH.dtype), S, out_TH)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier(group=ctx.groups["ep"])  # every peer read this rank's combine region
    finally:
        manager.cleanup()
    counts = (ids_RSK[:, :, 0] != INVALID_ID).sum(1).tolist()
    return Side(
        backend=backend if backend != "fake" else f"fake {profile} {slot_order}",
        counts_R=counts,
        rows_R=[sorted(_digest(x_RSH[r, i], ids_RSK[r, i], w_RSK[r, i]) for i in range(n)) for r, n in enumerate(counts)],
        sanitized=all(bool((ids_RSK[r, n:] == INVALID_ID).all()) for r, n in enumerate(counts)),
        raw_digest=_digest(x_RSH, ids_RSK, w_RSK),
        out_TH=out_TH.float().cpu(),
    )


def expected_counts(case: MoECase, ep_size: int, ep_rank: int) -> list[int]:
    """Per source, its tokens with at least one expert on ``ep_rank`` (from the routing alone)."""
    mine = local_experts(case.num_experts, ep_size, ep_rank)
    return [int(((ids_TK >= mine.start) & (ids_TK < mine.stop)).any(1).sum())
            for ids_TK in (rank_inputs(case, src)[1] for src in range(ep_size))]


def differences(a: Side, b: Side, ref_TH: torch.Tensor, counts_R: list[int]) -> list[str]:
    """What ``b`` did differently from ``a``, and where either strayed from the truth: the
    per-source ``counts_R`` the routing implies and the dense ``ref_TH``."""
    found = []
    if a.counts_R != b.counts_R:
        found.append(f"counts per source: {a.counts_R} ({a.backend}) != {b.counts_R} ({b.backend})")
    for side in (a, b):
        if side.counts_R != counts_R:
            found.append(f"{side.backend}: counts per source {side.counts_R}, the routing sends {counts_R}")
    for src, (rows_a, rows_b) in enumerate(zip(a.rows_R, b.rows_R)):
        if rows_a != rows_b:
            found.append(f"rows from source {src} differ as sets: {len(set(rows_a) - set(rows_b))} only in "
                         f"{a.backend}, {len(set(rows_b) - set(rows_a))} only in {b.backend}")
    for side in (a, b):
        if not side.sanitized:
            found.append(f"{side.backend}: an id past a source's count is not {INVALID_ID}")
    atol = RTOL * max(1.0, float(ref_TH.abs().max())) if ref_TH.numel() else RTOL
    for side in (a, b):
        err = _max_error(side.out_TH, ref_TH)
        if not err <= atol:  # NaN too
            found.append(f"{side.backend}: combine is {err:.3g} from the fp32 reference (tolerance {atol:.3g})")
    err = _max_error(a.out_TH, b.out_TH)
    if not err <= atol:
        found.append(f"combine differs by {err:.3g} between {a.backend} and {b.backend} (tolerance {atol:.3g})")
    return found


def differential(ctx, case: MoECase, sides: tuple[dict, dict]) -> dict:
    """Rank program: ``case`` through both ``sides`` (keyword arguments of :func:`one_side`,
    e.g. ``{"backend": "fake"}`` and ``{"backend": "flashinfer"}``). Returns this rank's
    ``differences`` and both sides."""
    a, b = (one_side(ctx, case, **side) for side in sides)
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    return {"rank": ctx.rank, "differences": differences(a, b, reference_TH(case, me), expected_counts(case, R, me)),
            "sides": (a, b)}


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _max_error(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.shape != y.shape:
        return float("inf")
    return float((x - y).abs().max()) if x.numel() else 0.0
