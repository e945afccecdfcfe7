"""The independent side of a scenario: its inputs, the formats as defined, the dense reference.

Legend: T tokens of a DP rank, K top_k, H hidden, E experts, B value blocks per token.
Nothing here calls ``impl``. Every rank rebuilds every DP rank's inputs from the scenario's
seed, so the reference needs no communication. Activations are chosen exactly representable
in the layer's format (values on the format's grid, one block maximum per scale block, the
block scale a power of two), so quantizing them loses nothing and the reference is the plain
fp32 MoE of the inputs as given: ``out[t] = s * sum_k w[t,k] * f_e(x[t]) + x[t] @ W_shared``
with ``e = ids[t,k]``, ``s`` the routed scaling factor and the shared term only with shared
experts. ``f_e`` is the linear map ``x @ W_e`` for the reference expert kernel (and the shared expert
too), a :class:`LinearMap` whose cost is linear in H, and a SwiGLU MLP for the TRT-LLM kernels
(intermediate size fixed per rank, so linear in H too), whose weights are built directly on their format's grid (block
values times power-of-two scales), so the kernel's weights and the reference's are the same
numbers. With the router weight on the input the expert sees ``w * x`` instead.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from testbed.scenario.model import INTERMEDIATE_PER_RANK, Layer, Scenario, row_bytes

ACT_DTYPE = torch.bfloat16
E4M3 = torch.float8_e4m3fn
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E4M3_ALL = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3).float()
E4M3_GRID = _E4M3_ALL[torch.isfinite(_E4M3_ALL) & (_E4M3_ALL >= 0)].unique()  # 0 .. 448
NVFP4_GLOBAL_AMAX = 6.0  # the calibrated amax: no input exceeds the e2m1 maximum
NVFP4_GLOBAL_SCALE = 448.0 * 6.0 / NVFP4_GLOBAL_AMAX  # vLLM's a1_gscale for that amax
# format -> (values grid, scale block, grid maximum, block exponents): a block's values are
# grid * 2^j with its maximum present, so every quantizer's scale is exact.
_FORMAT_GRID = {
    "bf16": (E2M1_GRID, 16, 6.0, (-3, 0)),
    "nvfp4": (E2M1_GRID, 16, 6.0, (-3, 0)),
    "mxfp8": (E2M1_GRID, 32, 6.0, (-3, 0)),
    "fp8_block": (E4M3_GRID, 128, 448.0, (-9, -6)),
}
# |output - reference| <= TOLERANCE[fmt] * max(1, max |reference|): the inputs are exact, so
# what is left is the bf16 rounding of the expert outputs and of the combined sum.
TOLERANCE = {"bf16": 2e-2, "nvfp4": 2e-2, "mxfp8": 2e-2, "fp8_block": 2e-2}
# The real TRT-LLM kernels requantize GEMM1's output (the SwiGLU activations) to the layer's
# format before GEMM2, where the fake and this reference keep fp32: at the matrix's shapes that
# costs nvfp4 7-10% and fp8 blocks 2-4% of the largest output (estimated on CPU).
REAL_TRTLLM_TOLERANCE = {"bf16": 2e-2, "nvfp4": 0.15, "fp8_block": 6e-2}


def tolerance(sc: Scenario, fmt: str) -> float:
    """The output tolerance of a ``fmt`` layer of ``sc`` (see :data:`TOLERANCE`)."""
    real_kernels = sc.flashinfer_backend != "fake" and sc.expert_kernel != "reference"
    return REAL_TRTLLM_TOLERANCE[fmt] if real_kernels else TOLERANCE[fmt]


def _seed(*parts: int) -> int:
    return zlib.crc32(repr(parts).encode())


def layer_inputs(sc: Scenario, pass_idx: int, stage: int, layer_idx: int, dp_rank: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_TH bf16, topk_ids_TK int32, topk_weights_TK fp32)`` of one DP rank for one layer
    in one forward pass."""
    layer = sc.stages[stage][layer_idx]
    T, K, H = sc.tokens(pass_idx, layer, dp_rank), sc.top_k, sc.hidden
    g = torch.Generator().manual_seed(_seed(sc.seed, pass_idx, stage, layer_idx, dp_rank))
    x_TH = representable(layer.fmt, T, H, g)
    ids_TK = routing(sc, T, dp_rank, g)
    if sc.router_weight_on_input:  # a gate, not a softmax; powers of two keep w * x exact
        w_TK = torch.exp2(-torch.randint(0, 3, (T, K), generator=g).float())
    else:
        w_TK = torch.softmax(torch.randn(T, K, generator=g), dim=1)
    return x_TH, ids_TK, w_TK


def representable(fmt: str, T: int, H: int, g: torch.Generator) -> torch.Tensor:
    """bf16 ``[T, H]`` that ``fmt`` represents exactly (see the module docstring)."""
    grid, block, top, (lo, hi) = _FORMAT_GRID[fmt]
    nb = -(-H // block)  # bf16 has no blocks: any H, the last one cut short
    mag = grid[torch.randint(len(grid), (T, nb, block), generator=g)]
    peak = torch.randint(block, (T, nb, 1), generator=g)
    mag.scatter_(2, peak, top)
    sign = torch.where(torch.rand(T, nb, block, generator=g) < 0.5, -1.0, 1.0)
    exp = torch.randint(lo, hi + 1, (T, nb, 1), generator=g).float()
    return (sign * mag * torch.exp2(exp)).reshape(T, nb * block)[:, :H].contiguous().to(ACT_DTYPE)


def routing(sc: Scenario, T: int, dp_rank: int, g: torch.Generator) -> torch.Tensor:
    """``topk_ids_TK`` int32 of one DP rank's tokens under the scenario's routing pattern."""
    E, K = sc.experts, sc.top_k
    lanes = torch.arange(K)
    if sc.routing == "random":
        ids = torch.argsort(torch.rand(T, E, generator=g), dim=1)[:, :K]
    elif sc.routing == "spread":  # the K lanes a stride apart: every token reaches many ranks
        ids = (torch.randint(E, (T, 1), generator=g) + lanes * (E // K)) % E
    elif sc.routing == "local":  # the experts of the EP rank that sends the token, then the next
        own = local_experts(E, sc.ep_size, dp_rank * sc.layout.tp)
        ids = (own.start + torch.randint(len(own), (T, 1), generator=g) + lanes) % E
    elif sc.routing == "hotspot":  # every token on the same K experts (repeating if K > E)
        ids = (lanes % E).expand(T, K)
    else:  # one-expert: every lane of every token on one expert (duplicate ids per token)
        ids = torch.full((T, K), sc.seed % E)
    return ids.to(torch.int32).contiguous()


# Rank of a linear map's low-rank part: enough that every output column mixes many input
# columns (a wrong scale block or a shifted row spreads), small enough that a map costs O(H).
MAP_RANK = 8


@dataclass(frozen=True)
class LinearMap:
    """The linear map ``x @ W`` with ``W = S P + U V`` stored in O(H): input column ``j``
    goes to output column ``perm[j]`` times ``sign[j]`` (a signed permutation, distinct per
    expert, so a swapped expert, a dropped router weight or a lost row each move every output
    entry by about the entry's size), plus a rank-:data:`MAP_RANK` mixing ``U [H, R] V [R, H]``
    (each output column depends on every input column). fp32; entries of ``x @ W`` are of the
    size of the entries of ``x``, at any H.

    ``map(x_nC, cols)`` is the partial map over input columns ``cols`` (``x_nC`` holds only
    those columns): summed over a partition of the columns (TP ranks' shards of the contraction
    dimension) it is the whole map.
    """

    perm: torch.Tensor  # [H] int64
    sign: torch.Tensor  # [H] fp32, +-1 scaled so the two parts have equal weight
    u: torch.Tensor  # [H, R] fp32
    v: torch.Tensor  # [R, H] fp32

    @classmethod
    def draw(cls, hidden: int, g: torch.Generator) -> "LinearMap":
        perm = torch.randperm(hidden, generator=g)
        sign = torch.where(torch.rand(hidden, generator=g) < 0.5, -1.0, 1.0) * 0.5 ** 0.5
        u = torch.randn(hidden, MAP_RANK, generator=g) / hidden ** 0.5
        v = torch.randn(MAP_RANK, hidden, generator=g) / (2 * MAP_RANK) ** 0.5
        return cls(perm, sign, u, v)

    @property
    def hidden(self) -> int:
        return self.perm.numel()

    def __call__(self, x_nC: torch.Tensor, cols: slice = slice(None)) -> torch.Tensor:
        x_nC = x_nC.float()
        device = x_nC.device
        y_nH = (x_nC @ self.u[cols].to(device)) @ self.v.to(device)
        # The permutation's columns are distinct: index_add_ adds each once, as indexing would, but 3x faster.
        return y_nH.index_add_(1, self.perm[cols].to(device), x_nC * self.sign[cols].to(device))

    def dense(self) -> torch.Tensor:
        """``W`` as a dense fp32 ``[H, H]`` (for checks of the map itself; O(H^2))."""
        return self(torch.eye(self.hidden))


@functools.lru_cache(maxsize=1024)
def expert_weight(seed: int, stage: int, layer_idx: int, expert: int, hidden: int) -> LinearMap:
    """Expert ``e`` of a layer is the linear map ``x @ W_e`` (:class:`LinearMap`)."""
    g = torch.Generator().manual_seed(_seed(seed, stage, layer_idx, expert, 7))
    return LinearMap.draw(hidden, g)


Expert = Callable[[int, torch.Tensor], torch.Tensor]  # (e, x_nH fp32) -> y_nH fp32


def linear_expert(weight: Callable[[int], LinearMap]) -> Expert:
    return lambda e, x_nH: weight(e)(x_nH)


def dense_moe(x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor, expert: Expert,
              weight_on_input: bool = False) -> torch.Tensor:
    """The dense fp32 MoE ``[T, H]``: ``sum_k w[t,k] * expert(ids[t,k], x[t])`` (or
    ``expert(ids[t,k], w[t,k] * x[t])`` with the router weight on the input)."""
    x = x_TH.float()
    out_TH = torch.zeros(x.shape)
    for e in ids_TK.unique().tolist():
        t, k = (ids_TK == e).nonzero(as_tuple=True)
        w = w_TK[t, k, None].float()
        y = expert(e, x[t] * w) if weight_on_input else w * expert(e, x[t])
        out_TH.index_add_(0, t, y)
    return out_TH


def layer_expert(sc: Scenario, stage: int, layer_idx: int) -> Expert:
    """Expert ``e`` of a layer as the reference computes it (full, unsharded, fp32)."""
    if sc.expert_kernel == "reference":
        return linear_expert(lambda e: expert_weight(sc.seed, stage, layer_idx, e, sc.hidden))
    fmt = sc.stages[stage][layer_idx].fmt

    def swiglu(e: int, x_nH: torch.Tensor) -> torch.Tensor:
        w = swiglu_weights(sc.seed, stage, layer_idx, e, fmt, sc.hidden, intermediate_size(sc))
        h = x_nH @ w.w1.T
        I = w.w2.size(1)
        return (torch.nn.functional.silu(h[:, I:]) * h[:, :I]) @ w.w2.T
    return swiglu


@dataclass(frozen=True)
class SwigluWeights:
    """One SwiGLU expert: logical fp32 ``w1 [2I, H]`` (linear rows, then gate rows) and
    ``w2 [H, I]``, and the same numbers in the kernel's format: ``(values, scales)`` per
    matrix (bf16: scales None; fp8_block: e4m3 + fp32 per 128x128 block; nvfp4: e2m1
    packed low nibble first + e4m3 per 16 read with the matrix's global scale ``gs1`` /
    ``gs2``, ``w = e2m1 * sf / gs``, drawn per expert and matrix so a scale dropped, inverted
    or swapped shows; 1 for the other formats)."""

    w1: torch.Tensor
    w2: torch.Tensor
    q1: tuple
    q2: tuple
    gs1: float = 1.0
    gs2: float = 1.0


@functools.lru_cache(maxsize=512)
def swiglu_weights(seed: int, stage: int, layer_idx: int, expert: int, fmt: str, hidden: int,
                   inter: int) -> SwigluWeights:
    g = torch.Generator().manual_seed(_seed(seed, stage, layer_idx, expert, 13))
    w1, q1 = _grid_matrix(fmt, 2 * inter, hidden, g)
    w2, q2 = _grid_matrix(fmt, hidden, inter, g)
    if fmt != "nvfp4":
        return SwigluWeights(w1, w2, q1, q2)
    # Powers of two from 1 to 16, so sf * gs stays exact in e4m3 and w (fp32) is unchanged.
    gs1, gs2 = (float(2 ** int(torch.randint(0, 5, (), generator=g))) for _ in range(2))
    return SwigluWeights(w1, w2, _with_global_scale(q1, gs1), _with_global_scale(q2, gs2), gs1, gs2)


def _with_global_scale(q: tuple, gs: float) -> tuple:
    packed, sf = q
    return packed, (sf.float() * gs).to(E4M3)


def _grid_matrix(fmt: str, M: int, K: int, g: torch.Generator) -> tuple[torch.Tensor, tuple]:
    """``[M, K]`` weights of typical size ``1/sqrt(K)`` on ``fmt``'s grid: (fp32, kernel form)."""
    if fmt == "bf16":
        v = (torch.randn(M, K, generator=g) / K ** 0.5).to(ACT_DTYPE)
        return v.float(), (v, None)
    sign = torch.where(torch.rand(M, K, generator=g) < 0.5, -1.0, 1.0)
    if fmt == "fp8_block":
        grid = E4M3_GRID[E4M3_GRID <= 2]
        v = (sign * grid[torch.randint(len(grid), (M, K), generator=g)]).to(E4M3)
        exp = torch.randint(0, 2, (M // 128, K // 128), generator=g).float() - round(math.log2(K ** 0.5))
        scale = torch.exp2(exp)
        return v.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1), (v, scale)
    codes = torch.randint(16, (M, K), generator=g)
    vals = E2M1_GRID[codes & 7] * (1 - 2 * ((codes >> 3) & 1)).float()
    sf = torch.exp2(torch.randint(0, 2, (M, K // 16), generator=g).float() - 2 - round(math.log2(K ** 0.5)))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return vals * sf.repeat_interleave(16, 1), (packed, sf.to(E4M3))


def intermediate_size(sc: Scenario) -> int:
    """A SwiGLU expert's intermediate size: each TP rank's share times the experts' TP."""
    return INTERMEDIATE_PER_RANK * sc.moe_tp


@functools.lru_cache(maxsize=64)
def shared_weight(seed: int, stage: int, layer_idx: int, hidden: int) -> LinearMap:
    """The layer's shared expert: the linear map ``x @ W`` (:class:`LinearMap`)."""
    g = torch.Generator().manual_seed(_seed(seed, stage, layer_idx, 11))
    return LinearMap.draw(hidden, g)


@functools.lru_cache(maxsize=16)
def _layer_batch(sc: Scenario, pass_idx: int, stage: int, layer_idx: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Every DP rank's inputs of one layer in one pass, concatenated, and each rank's count
    (the parent checks all ranks; one batch touches each expert's weights once)."""
    parts = [layer_inputs(sc, pass_idx, stage, layer_idx, d) for d in range(sc.layout.dp)]
    return (torch.cat([x for x, _, _ in parts]), torch.cat([i for _, i, _ in parts]),
            torch.cat([w for _, _, w in parts]), tuple(x.size(0) for x, _, _ in parts))


def reference_outputs(sc: Scenario, pass_idx: int, stage: int, layer_idx: int) -> list[torch.Tensor]:
    """Dense fp32 ``[T_d, H]`` of every DP rank ``d`` for one layer in one pass."""
    x_TH, ids_TK, w_TK, counts = _layer_batch(sc, pass_idx, stage, layer_idx)
    out = sc.routed_scaling * dense_moe(x_TH, ids_TK, w_TK, layer_expert(sc, stage, layer_idx),
                                        sc.router_weight_on_input)
    if sc.shared_experts:
        out += shared_weight(sc.seed, stage, layer_idx, sc.hidden)(x_TH)
    return list(out.split(counts))


def expected_expert_rows(sc: Scenario, pass_idx: int, stage: int, layer_idx: int, ep_rank: int,
                         pads_routed: bool = False, weights_scale: float = 1.0) -> Counter:
    """The ``(expert, weight bits)`` lanes EP rank ``ep_rank``'s experts must compute in one
    layer's forward: every lane routed to one of its experts. The all-to-alls deliver each
    once per TP rank that sends it (the TP ranks of a DP rank dispatch the same tokens),
    unless sequence parallel splits the tokens across them; the all-gather gathers over
    the DP group only (or with sequence parallel over the EP group); expert parallel off
    computes the rank's own DP tokens. With ``pads_routed`` (a sequence-parallel model that pads
    each DP rank's tokens to a multiple of TP before its gate) the padding rows are routed too
    (:func:`padding_routing`). A router that folds a routed scaling factor into the weights
    hands the experts the weights times ``weights_scale``."""
    _, ids_TK, w_TK, counts = _layer_batch(sc, pass_idx, stage, layer_idx)
    if weights_scale != 1.0:
        w_TK = w_TK * weights_scale
    own = local_experts(sc.experts, sc.ep_size, ep_rank)
    lanes = Counter(lane_keys(ids_TK, w_TK, own))
    copies = sc.layout.tp if sc.path in ("one_sided", "two_sided") and not sc.splits_tokens else 1
    lanes = Counter({k: n * copies for k, n in lanes.items()})
    if pads_routed:
        tp = sc.layout.tp
        rows = sum(-n % tp for n in counts)
        ids_K, w_K = padding_routing(sc.top_k)
        for key in lane_keys(ids_K[None].expand(rows, -1), w_K[None].expand(rows, -1), own):
            lanes[key] += 1
    return lanes


def padding_routing(top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How a model's gate routes a padding row (all zeros: equal logits): ``(ids [K] int32,
    weights [K] fp32)``, experts ``0 .. K-1`` at ``1 / K`` each."""
    return torch.arange(top_k, dtype=torch.int32), torch.full((top_k,), 1.0 / top_k)


def lane_keys(ids_NK: torch.Tensor, w_NK: torch.Tensor, own: range) -> list[tuple[int, int]]:
    """``(expert, fp32 weight bits)`` of every lane whose expert is in ``own``."""
    mask = (ids_NK >= own.start) & (ids_NK < own.stop)
    ids = ids_NK[mask].tolist()
    bits = w_NK.float().contiguous()[mask].view(torch.int32).tolist()
    return list(zip(ids, bits))


def local_experts(num_experts: int, ep_size: int, ep_rank: int) -> range:
    """The contiguous block of experts ``ep_rank`` owns (ranks below ``E % ep`` own one more;
    the two-sided path needs ``E % ep == 0``, where this is its ``e // (E / ep)`` map too)."""
    base, rem = divmod(num_experts, ep_size)
    start = ep_rank * base + min(ep_rank, rem)
    return range(start, start + base + (1 if ep_rank < rem else 0))


def dispatch_bytes(layer: Layer, sc: Scenario) -> int:
    """Bytes per token of the one-sided dispatch payload ``[x, (x_sf), ids, weights]``."""
    return sum(row_bytes(layer.fmt, sc.hidden, sc.mx_alignment).values()) + 8 * sc.top_k


def dequantize(fmt: str, x_q: torch.Tensor, x_sf, hidden: int) -> torch.Tensor:
    """fp32 ``[N, H]`` of received activations, read as each format is defined (the expert
    kernel's view; ``impl.quant`` is what produced them and is under test)."""
    if fmt == "bf16":
        return x_q.float()
    N, device = x_q.size(0), x_q.device
    if fmt == "nvfp4":
        b = x_q.view(torch.uint8).long()
        codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(N, hidden)
        vals = E2M1_GRID.to(device)[codes & 7] * (1 - 2 * ((codes >> 3) & 1)).float()
        scale = x_sf.view(E4M3).float().repeat_interleave(16, dim=1)
        return vals * scale / NVFP4_GLOBAL_SCALE
    if fmt == "mxfp8":
        exp = x_sf.view(torch.uint8)[:, : hidden // 32].float() - 127
        return x_q.view(E4M3).float() * torch.exp2(exp).repeat_interleave(32, dim=1)
    return x_q.view(E4M3).float() * x_sf.view(torch.float32).repeat_interleave(128, dim=1)
