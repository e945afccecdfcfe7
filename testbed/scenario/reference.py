"""The independent side of a scenario: its inputs, the formats as defined, the dense reference.

Legend: T tokens of a DP rank, K top_k, H hidden, E experts, B value blocks per token.
Nothing here calls ``impl``. Every rank rebuilds every DP rank's inputs from the scenario's
seed, so the reference needs no communication. Activations are chosen exactly representable
in the layer's format (values on the format's grid, one block maximum per scale block, the
block scale a power of two), so quantizing them loses nothing and the reference is the plain
fp32 MoE of the inputs as given: ``out[t] = sum_k w[t,k] * x[t] @ W[ids[t,k]]``.
"""

from __future__ import annotations

import functools
import zlib
from collections import Counter
from typing import Callable

import torch

from testbed.scenario.model import Layer, Scenario, row_bytes

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


@functools.lru_cache(maxsize=256)
def expert_weight(seed: int, stage: int, layer_idx: int, expert: int, hidden: int) -> torch.Tensor:
    """Expert ``e`` of a layer is the linear map ``x @ W_e``, fp32 ``[H, H]``."""
    g = torch.Generator().manual_seed(_seed(seed, stage, layer_idx, expert, 7))
    return torch.randn(hidden, hidden, generator=g) / hidden ** 0.5


def dense_moe(x_TH: torch.Tensor, ids_TK: torch.Tensor, w_TK: torch.Tensor,
              weight: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """The dense fp32 MoE ``[T, H]``: ``sum_k w[t,k] * x[t] @ weight(ids[t,k])``."""
    x = x_TH.float()
    out_TH = torch.zeros(x.shape)
    for e in ids_TK.unique().tolist():
        w_T = (w_TK * (ids_TK == e)).sum(1, keepdim=True)
        out_TH += w_T * (x @ weight(e))
    return out_TH


def reference_output(sc: Scenario, pass_idx: int, stage: int, layer_idx: int, dp_rank: int) -> torch.Tensor:
    """Dense fp32 ``[T, H]`` of one DP rank for one layer in one pass."""
    return dense_moe(*layer_inputs(sc, pass_idx, stage, layer_idx, dp_rank),
                     lambda e: expert_weight(sc.seed, stage, layer_idx, e, sc.hidden))


def expected_expert_rows(sc: Scenario, pass_idx: int, stage: int, layer_idx: int, ep_rank: int) -> Counter:
    """The ``(expert, weight bits)`` lanes EP rank ``ep_rank``'s experts must compute in one
    layer's forward: every lane routed to one of its experts, once per TP rank that sends it
    (the TP ranks of a DP rank dispatch the same tokens)."""
    own = local_experts(sc.experts, sc.ep_size, ep_rank)
    lanes: Counter = Counter()
    for d in range(sc.layout.dp):
        _, ids_TK, w_TK = layer_inputs(sc, pass_idx, stage, layer_idx, d)
        lanes.update(lane_keys(ids_TK, w_TK, own))
    return Counter({k: n * sc.layout.tp for k, n in lanes.items()})


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
    return sum(row_bytes(layer.fmt, sc.hidden).values()) + 8 * sc.top_k


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
