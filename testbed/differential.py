"""Fake against real: the same routing and payloads through two backends' ``MoeAlltoAll``, and
the same tokens through two backends' TRT-LLM fused MoE with ``do_finalize=False``.

On every EP rank, each backend in turn gets a one-sided workspace from ``impl``'s manager,
dispatches this rank's ``[x, topk_ids, topk_weights]`` (ids sanitized past each source's
count), runs the same linear experts on what arrived and combines. Compared order-insensitively
(slot order is not fixed on GPUs): per source, the count (also against what the routing
implies) and the arrived rows as a multiset;
whether every id past the count is the invalid id; the combined output against the other
side and against a dense fp32 reference that never calls either. A difference is a bug in the
fake (or in the real release): :func:`differential` returns both sides to print.

The fused MoE (:func:`fused_differential`, one process): ``impl``'s TRT-LLM experts on each
backend, deferred, return the triple ``(gemm2_output [P, H], expert_weights [T, K],
expanded_idx_to_permuted_idx)``. Compared per lane ``(t, k)``, never by permuted row (each
kernel pads and orders an expert's rows its own way): which lanes are local (also against
the routing), the weights (also against the router's), that the local lanes' rows are
distinct and in range, and each local lane's GEMM2 row against the other side and against a
dense fp32 SwiGLU reference of inputs every format represents exactly.

Legend: T tokens of this rank, K top_k, H hidden, R EP ranks, S slots per source, E experts,
L local experts, I intermediate size, P permuted rows.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from testbed.scenario.rank import resolve_backend
from impl.experts import QuantizedWeights, TrtLlmExperts
from impl.moe_layer import PrepareResult
from impl.quant import quantize_input
from testbed.integrations.impl.cases import MoECase, one_sided_manager, rank_inputs
from testbed.scenario.rank import fake_release, quant_config, rank_api, rank_device
from testbed.scenario.model import pair_routing
from testbed.scenario.reference import REAL_TRTLLM_TOLERANCE, local_experts, representable, swiglu_weights

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
    return found + _far_apart("the combine", (a.backend, a.out_TH), (b.backend, b.out_TH), ref_TH, RTOL)


def _far_apart(what: str, a: tuple[str, torch.Tensor], b: tuple[str, torch.Tensor], ref: torch.Tensor,
               rtol: float) -> list[str]:
    """Each side's ``what`` against the fp32 ``ref`` and the sides against each other, within
    ``rtol`` of the reference's largest magnitude (at least 1); NaN is a difference."""
    atol = rtol * max(1.0, float(ref.abs().max())) if ref.numel() else rtol
    found = []
    for name, value in (a, b):
        err = _max_error(value, ref)
        if not err <= atol:
            found.append(f"{name}: {what} off the fp32 reference by {err:.3g} (tolerance {atol:.3g})")
    err = _max_error(a[1], b[1])
    if not err <= atol:
        found.append(f"{a[0]} and {b[0]} differ in {what} by {err:.3g} (tolerance {atol:.3g})")
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


# -- the fused MoE's unfinalized triple ------------------------------------------------------
FUSED_FORMATS = ("bf16", "nvfp4")  # those whose kernels stop after GEMM2


@dataclass(frozen=True)
class FusedCase:
    """One TRT-LLM fused-MoE call: ``tokens`` routed over ``experts``, of which ``local``
    (a range) are this call's."""

    fmt: str = "bf16"
    tokens: int = 16
    experts: int = 8
    local: range = range(2, 6)
    top_k: int = 4
    hidden: int = 256
    intermediate: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        if self.fmt not in FUSED_FORMATS:
            raise ValueError(f"fmt: the deferred fused MoE runs {', '.join(FUSED_FORMATS)}, got {self.fmt!r}")
        if not (0 <= self.local.start < self.local.stop <= self.experts):
            raise ValueError(f"local: a non-empty range of the {self.experts} experts, got {self.local}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k: 1..experts ({self.experts}) distinct experts per token, got {self.top_k}")

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_TH bf16 exact in fmt, ids_TK int32 distinct per token, w_TK fp32)``."""
        g = torch.Generator().manual_seed(self.seed * 7919 + 17)
        x_TH = representable(self.fmt, self.tokens, self.hidden, g)
        ids_TK = torch.argsort(torch.rand(self.tokens, self.experts, generator=g), dim=1)[:, :self.top_k]
        return x_TH, ids_TK.to(torch.int32), torch.softmax(torch.randn(self.tokens, self.top_k, generator=g), dim=1)

    def weights(self, expert: int):
        return swiglu_weights(self.seed, 0, 0, expert, self.fmt, self.hidden, self.intermediate)


@dataclass
class FusedSide:
    """What one backend's fused MoE returned, per lane."""

    backend: str
    local_TK: torch.Tensor  # bool: the lane has a permuted row
    weights_TK: torch.Tensor  # fp32: expert_weights as returned
    rows_TKH: torch.Tensor  # fp32: each local lane's GEMM2 row (0 elsewhere)
    distinct: bool  # the local lanes' permuted rows are distinct and inside gemm2_output
    contract: str  # what UnfinalizedMoEOutput.validate (the consumer's contract) refused, or ""
    raw_digest: str  # the triple as laid out

    def describe(self) -> str:
        return (f"{self.backend}: local lanes {int(self.local_TK.sum())}, distinct rows {self.distinct}, "
                f"rows {self.rows_TKH.shape}")


def fused_side(case: FusedCase, backend: str, *, profile: str = "0.7.2", slot_order: str = "shuffled") -> FusedSide:
    """``case`` through ``backend``'s TRT-LLM experts (``impl``'s), deferred, in this process
    (the fake's ``profile`` and ``slot_order`` for the call; the real one on the current GPU)."""
    if backend == "fake":
        release, device = fake_release(profile, slot_order, case.seed), torch.device("cpu")
    else:
        release, device = contextlib.nullcontext(resolve_backend(backend)), torch.device("cuda", torch.cuda.current_device())
    with release as api:
        triple = _fused_call(api, case, device)
        try:
            triple.validate(torch.bfloat16, case.tokens, case.top_k, case.hidden)
            contract = ""
        except ValueError as e:
            contract = str(e)
    gemm2_PH, weights_TK, perm_TK = (t.cpu() for t in (triple.gemm2_permuted, triple.expert_weights,
                                                      triple.expanded_idx_to_permuted_idx))
    local_TK = perm_TK >= 0
    at = perm_TK[local_TK].long()
    rows_TKH = torch.zeros(*perm_TK.shape, case.hidden)
    distinct = bool(at.unique().numel() == at.numel() and (at.numel() == 0 or int(at.max()) < gemm2_PH.size(0)))
    if distinct:
        rows_TKH[local_TK] = gemm2_PH[at].float()
    return FusedSide(backend=backend if backend != "fake" else f"fake {profile} {slot_order}", local_TK=local_TK,
                     weights_TK=weights_TK.float(), rows_TKH=rows_TKH, distinct=distinct, contract=contract,
                     raw_digest=_digest(gemm2_PH, weights_TK, perm_TK))


def _fused_call(api, case: FusedCase, device: torch.device):
    x_TH, ids_TK, w_TK = case.inputs()
    own = [case.weights(e) for e in case.local]
    if case.fmt == "bf16":
        w1 = torch.stack([w.q1[0] for w in own]).to(device)
        w2 = torch.stack([w.q2[0] for w in own]).to(device)
    else:
        gs1 = torch.tensor([w.gs1 for w in own], device=device)
        gs2 = torch.tensor([w.gs2 for w in own], device=device)
        w1 = QuantizedWeights(*(torch.stack([w.q1[j] for w in own]).to(device) for j in (0, 1)), gs1)
        w2 = QuantizedWeights(*(torch.stack([w.q2[j] for w in own]).to(device) for j in (0, 1)), gs2)
    qc = quant_config(case.fmt)
    # The (ids, weights) pair where the release declares it; packed routing before (0.6.8 takes no pair).
    experts = TrtLlmExperts(api, case.fmt, w1, w2, num_experts=case.experts, top_k=case.top_k,
                            local_expert_offset=case.local.start,
                            a1_gscale=None if qc.a1_gscale is None else qc.a1_gscale.to(device),
                            packed_routing=not pair_routing(api.version))
    a1q, a1q_scale = quantize_input(x_TH.to(device), qc)
    return experts(PrepareResult(a1q, a1q_scale, None, ids_TK.to(device), w_TK.to(device)), defer=True)


def fused_reference_TKH(case: FusedCase) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense fp32, per lane: whether its expert is local, and its SwiGLU expert's output
    ``(silu(x W_gate^T) * x W_lin^T) W2^T`` (0 for other lanes)."""
    x_TH, ids_TK, _ = case.inputs()
    local_TK = (ids_TK >= case.local.start) & (ids_TK < case.local.stop)
    rows_TKH = torch.zeros(*ids_TK.shape, case.hidden)
    for t, k in local_TK.nonzero().tolist():
        w = case.weights(int(ids_TK[t, k]))
        h = x_TH[t].float() @ w.w1.T
        rows_TKH[t, k] = (torch.nn.functional.silu(h[case.intermediate:]) * h[:case.intermediate]) @ w.w2.T
    return local_TK, rows_TKH


def fused_differences(a: FusedSide, b: FusedSide, case: FusedCase) -> list[str]:
    """What ``b`` returned differently from ``a``, and where either strayed from the routing,
    the router's weights or the dense reference."""
    found = []
    local_TK, ref_TKH = fused_reference_TKH(case)
    _, _, w_TK = case.inputs()
    for side in (a, b):
        if not torch.equal(side.local_TK, local_TK):
            found.append(f"{side.backend}: {int((side.local_TK != local_TK).sum())} lane(s) local where the routing "
                         "says otherwise (expanded_idx_to_permuted_idx)")
        if not side.distinct:
            found.append(f"{side.backend}: local lanes share permuted rows or point past gemm2_output")
        if side.contract:
            found.append(f"{side.backend}: the unfinalized output breaks its contract: {side.contract}")
        if not torch.allclose(side.weights_TK, w_TK, rtol=1e-2, atol=1e-3):
            found.append(f"{side.backend}: expert_weights differ from the router's by "
                         f"{_max_error(side.weights_TK, w_TK):.3g}")
    if not torch.equal(a.local_TK, b.local_TK):
        found.append(f"local lanes differ: {int(a.local_TK.sum())} ({a.backend}) vs {int(b.local_TK.sum())} ({b.backend})")
    return found + _far_apart("the GEMM2 rows", (a.backend, a.rows_TKH), (b.backend, b.rows_TKH), ref_TKH,
                              REAL_TRTLLM_TOLERANCE[case.fmt])


def fused_differential(case: FusedCase, sides: tuple[dict, dict]) -> tuple[list[str], tuple[FusedSide, FusedSide]]:
    """``case`` through both ``sides`` (keyword arguments of :func:`fused_side`); returns the
    differences and both sides."""
    a, b = (fused_side(case, **side) for side in sides)
    return fused_differences(a, b, case), (a, b)
