"""FlashInfer one-sided NVLink all-to-all (``MoeAlltoAll``): the manager and prepare/finalize.

Legend: T local tokens, K top_k, H hidden, R EP ranks, S = runtime max tokens per rank.
The manager owns one ``MoeAlltoAll`` per EP group, shared by every MoE layer of the group;
each layer's prepare/finalize grows it to that layer's payload when constructed.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from impl.backend import FlashInferAPI
from impl.communicator import EPGroupManager, make_communicator
from impl.compat import supports_kw
from impl.formats import DispatchLayout, QuantConfig
from impl.forward_context import runtime_max_tokens_per_rank
from impl.moe_layer import PrepareResult, scale_input_by_router_weight
from impl.quant import quantize_input

ID_BYTES = 4  # int32 expert ids
WEIGHT_BYTES = 4  # fp32 router weights
COMBINE_DTYPES = (torch.bfloat16, torch.float16)  # what the combine region is sized for
INVALID_EXPERT_ID = -1


def dispatch_bytes_per_token(x_bytes_per_token: int, x_sf_bytes_per_token: int, top_k: int) -> int:
    """The dispatch payload ``[x, (x_sf), ids, weights]`` of one token."""
    return x_bytes_per_token + x_sf_bytes_per_token + top_k * ID_BYTES + top_k * WEIGHT_BYTES


def combine_bytes_per_token(hidden_size: int) -> int:
    """The combine payload of one token: 16-bit hidden states."""
    return hidden_size * 2


def _positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


class OneSidedManager(EPGroupManager):
    """One ``MoeAlltoAll`` per EP group, grown (never shrunk) to cover every layer's need.

    Constructed as :class:`impl.communicator.EPGroupManager`; the rebuild barrier runs on the
    EP group only. Attributes a test can read: ``builds`` (``MoeAlltoAll`` objects
    constructed), ``combine_supports_output`` (the capability probe's answer for the current
    object).
    """

    def __init__(self, api: FlashInferAPI, cpu_group: dist.ProcessGroup, gpus_per_node: Optional[int] = None):
        super().__init__(api, cpu_group, gpus_per_node)
        self.moe_alltoall: Any = None
        self.workspace_size = 0
        self.payload_size = 0  # the largest dispatch + combine regions of any layer
        self.max_num_tokens = 0
        self.top_k = 0
        self.num_experts = 0
        self.builds = 0
        self.combine_supports_output: Optional[bool] = None

    def workspace_size_for(self, max_num_tokens: int, top_k: int, hidden_size: int,
                           x_bytes_per_token: int, x_sf_bytes_per_token: int) -> int:
        """FlashInfer's workspace size per rank for one layer's payloads on this EP group."""
        return self.api.workspace_size_per_rank(
            self.world_size, max_num_tokens,
            dispatch_bytes_per_token(x_bytes_per_token, x_sf_bytes_per_token, top_k),
            combine_bytes_per_token(hidden_size),
        )

    def aux_size_for(self, max_num_tokens: int) -> int:
        """The auxiliary region in front of the payloads (counters, flags, top-k indices):
        FlashInfer sizes it by the ``MoeAlltoAll``'s ``max_num_tokens``, not by a layer's."""
        return self.api.workspace_size_per_rank(self.world_size, max_num_tokens, 0, 0)

    def initialize(self, max_num_tokens: int, top_k: int, num_experts: int, hidden_size: int,
                   x_bytes_per_token: int, x_sf_bytes_per_token: int) -> None:
        """Make the workspace cover this layer; rebuild only when it does not already.

        Every rank of the EP group must call it with the same arguments in the same order
        (the rebuild is collective). ``top_k`` and ``num_experts`` must equal earlier calls':
        the kernels are built for one value of each.
        """
        _positive(max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                  hidden_size=hidden_size, x_bytes_per_token=x_bytes_per_token)
        if x_sf_bytes_per_token < 0:
            raise ValueError(f"x_sf_bytes_per_token must be >= 0, got {x_sf_bytes_per_token}")
        if self.initialized:
            assert top_k == self.top_k, (
                "FlashInfer one-sided MoeAlltoAll does not support heterogeneous top_k across MoE "
                f"layers (got {top_k}, was built with {self.top_k})"
            )
            assert num_experts == self.num_experts, (
                "FlashInfer one-sided MoeAlltoAll does not support heterogeneous num_experts across "
                f"MoE layers (got {num_experts}, was built with {self.num_experts})"
            )
        # A larger budget grows the auxiliary region and so moves every layer's payloads:
        # each layer's need is its payload regions behind the auxiliary region of the
        # largest budget (sized at its own budget, a smaller layer overflows after a larger
        # budget arrives).
        payload = self.workspace_size_for(max_num_tokens, top_k, hidden_size, x_bytes_per_token,
                                          x_sf_bytes_per_token) - self.aux_size_for(max_num_tokens)
        self.payload_size = max(self.payload_size, payload)
        max_tokens = max(self.max_num_tokens, max_num_tokens)
        needed = self.aux_size_for(max_tokens) + self.payload_size
        if self.initialized and needed <= self.workspace_size and max_num_tokens <= self.max_num_tokens:
            return
        self.workspace_size = max(self.workspace_size, needed)
        self.max_num_tokens = max_tokens
        self.top_k = top_k
        self.num_experts = num_experts
        self.cleanup()
        self._build()
        self._barrier_after_build()

    def _build(self) -> None:
        W = self.world_size
        self.mapping = self.api.Mapping(world_size=W, rank=self.rank, gpus_per_node=self.gpus_per_node,
                                        tp_size=W, moe_ep_size=W)
        config = self.mnnvl_config()
        self.moe_alltoall = self.api.MoeAlltoAll(
            mapping=self.mapping, max_num_tokens=self.max_num_tokens, top_k=self.top_k,
            num_experts=self.num_experts, workspace_size_per_rank=self.workspace_size,
            mnnvl_config=config,
        )
        self.builds += 1
        self.initialized = True
        try:
            self.combine_supports_output = supports_kw(self.moe_alltoall.combine, "output",
                                                       allow_var_kwargs=False)
        except (TypeError, ValueError):
            self.combine_supports_output = False

    def _barrier_after_build(self) -> None:
        # The EP group only: with pipeline parallelism each stage has its own EP group and
        # its own layers, so stages rebuild a different number of times (seed 001).
        dist.barrier(group=self.cpu_group)

    def combine_into(self, payload_RSH: torch.Tensor, runtime_max_tokens_per_rank: int,
                     output_TH: torch.Tensor, payload_in_workspace: bool = False) -> None:
        """Combine into ``output_TH``: in place when this FlashInfer's combine takes
        ``output=``, else combine then copy (seed 000). ``payload_in_workspace``: the payload
        is the combine region itself (no staging copy)."""
        if self.moe_alltoall is None:
            raise RuntimeError("combine_into before initialize (or after cleanup)")
        # Passed only when set: the flag is in every release's signature, but a combine the
        # probe cannot read may lack it.
        flags = {"payload_in_workspace": True} if payload_in_workspace else {}
        if self.combine_supports_output:
            self.moe_alltoall.combine(payload=payload_RSH, runtime_max_tokens_per_rank=runtime_max_tokens_per_rank,
                                      output=output_TH, **flags)
        else:
            output_TH.copy_(self.moe_alltoall.combine(payload=payload_RSH,
                                                      runtime_max_tokens_per_rank=runtime_max_tokens_per_rank,
                                                      **flags))

    def cleanup(self) -> None:
        """Drop the ``MoeAlltoAll``; the recorded sizes stay, so the next initialize grows
        from them. FlashInfer keeps its workspace cached by size."""
        self.moe_alltoall = None
        self.mapping = None
        self.initialized = False
        self.combine_supports_output = None

    def checkpoint_prepare(self) -> None:
        """Release the workspace's memory for a process checkpoint (collective on the EP group)."""
        self._checkpoint_method("checkpoint_prepare")()

    def checkpoint_restore(self) -> None:
        """Map the workspace again after :meth:`checkpoint_prepare` (collective on the EP group)."""
        self._checkpoint_method("checkpoint_restore")(make_communicator(self.api, self.cpu_group))

    def _checkpoint_method(self, name: str):
        if self.moe_alltoall is None:
            raise RuntimeError(f"{name} before initialize (or after cleanup)")
        method = getattr(self.moe_alltoall, name, None)
        if method is None:
            raise NotImplementedError(
                f"FlashInfer {self.api.version} MoeAlltoAll has no {name} (added in 0.6.16)"
            )
        return method


class OneSidedLayer:
    """What the one-sided prepare/finalizes (``MoeAlltoAll``'s and ``moe_ep``'s) share: one
    layer's facts, the contract's answers (an output already reduced over the experts, int32
    ids) and the input side of ``prepare``.

    ``num_dispatchers`` is the EP size: every EP rank dispatches its own tokens.
    ``invalid_expert_id`` marks received lanes without a token: -1 (what vLLM passes) or
    ``num_experts`` (the two-sided path's sentinel); the expert kernels skip both.
    ``packed_payloads``: the payloads lie back to back in the workspace (``MoeAlltoAll``), so
    at an odd EP size the int32 ids after the activations need those to be a multiple of 4 bytes.
    """

    def __init__(self, manager: EPGroupManager, *, max_num_tokens: int, top_k: int, num_experts: int,
                 hidden_size: int, layout: DispatchLayout, num_dispatchers: Optional[int],
                 invalid_expert_id: int, packed_payloads: bool):
        check_invalid_expert_id(invalid_expert_id, num_experts)
        if packed_payloads:
            check_activation_alignment(layout, hidden_size, manager.world_size)
        self.manager = manager
        self.max_num_tokens = max_num_tokens
        self.top_k = top_k
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.layout = layout
        self.invalid_expert_id = invalid_expert_id
        self.num_dispatchers_ = num_dispatchers or manager.world_size
        self.runtime_max_tokens_per_rank: Optional[int] = None
        self._workspace_output: Optional[torch.Tensor] = None

    def output_is_reduced(self) -> bool:
        return True

    def topk_indices_dtype(self) -> Optional[torch.dtype]:
        return torch.int32

    def num_dispatchers(self) -> int:
        return self.num_dispatchers_

    def _quantized_input(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                         num_experts: int, apply_router_weight_on_input: bool, quant_config: QuantConfig,
                         defer_input_quant: bool, capacity: int, capacity_name: str):
        """Check ``prepare``'s inputs, take this round's S (at most ``capacity``) and quantize:
        ``(S, a1q, a1q_scale)``."""
        a1 = check_prepare_inputs(a1, topk_weights, topk_ids, num_experts, apply_router_weight_on_input,
                                  hidden_size=self.hidden_size, top_k=self.top_k, layer_experts=self.num_experts)
        S = runtime_max_tokens_per_rank(a1.size(0))
        if S > capacity:
            raise ValueError(f"runtime max tokens per rank {S} exceeds {capacity_name} {capacity}")
        self.runtime_max_tokens_per_rank = S
        a1q, a1q_scale = (a1, None) if defer_input_quant else quantize_input(a1, quant_config)
        check_layout(self.layout, a1q, a1q_scale)
        return S, a1q, a1q_scale


class OneSidedPrepareFinalize(OneSidedLayer):
    """One MoE layer's dispatch and combine through the shared :class:`OneSidedManager`; the
    constructor grows the manager to this layer's payload (``layout``, ``top_k``, ...). The
    arguments are :class:`OneSidedLayer`'s."""

    def __init__(self, manager: OneSidedManager, *, max_num_tokens: int, top_k: int, num_experts: int,
                 hidden_size: int, layout: DispatchLayout, num_dispatchers: Optional[int] = None,
                 invalid_expert_id: int = INVALID_EXPERT_ID):
        super().__init__(manager, max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                         hidden_size=hidden_size, layout=layout, num_dispatchers=num_dispatchers,
                         invalid_expert_id=invalid_expert_id, packed_payloads=True)
        manager.initialize(max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                           hidden_size=hidden_size, x_bytes_per_token=layout.x_bytes_per_token,
                           x_sf_bytes_per_token=layout.x_sf_bytes_per_token)

    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                expert_map: Optional[torch.Tensor], apply_router_weight_on_input: bool,
                quant_config: QuantConfig, defer_input_quant: bool = False) -> PrepareResult:
        """Quantize and dispatch ``[x, (x_sf), ids, weights]``; return what this rank received,
        flattened to ``[R * S, ...]`` (rows past a source's count carry ``invalid_expert_id``).

        ``expert_map`` is unused: ids travel global and the experts select their own.
        """
        S, a1q, a1q_scale = self._quantized_input(a1, topk_weights, topk_ids, num_experts, apply_router_weight_on_input,
                                                  quant_config, defer_input_quant, self.manager.max_num_tokens,
                                                  "the workspace's max_num_tokens")
        payloads = [a1q] + ([a1q_scale] if a1q_scale is not None else []) + [topk_ids, topk_weights]
        ids_index = len(payloads) - 2
        recv = self.manager.moe_alltoall.dispatch(
            token_selected_experts=topk_ids, input_payloads=payloads, runtime_max_tokens_per_rank=S,
            invalid_token_expert_id=self.invalid_expert_id, expert_id_payload_index=ids_index,
        )
        flat = [t.reshape(-1, t.shape[-1]) for t in recv]
        a1q_recv, scale_recv = flat[0], (flat[1] if a1q_scale is not None else None)
        return PrepareResult(a1q_recv, scale_recv, None, flat[ids_index], flat[ids_index + 1])

    def expert_output_buffer(self, dtype: torch.dtype) -> torch.Tensor:
        """``[R * S, H]`` view of this round's combine region for the experts to write into
        (no staging copy; :meth:`finalize` then combines with ``payload_in_workspace``)."""
        S = self.runtime_max_tokens_per_rank
        if S is None:
            raise RuntimeError("expert_output_buffer called before prepare")
        check_combine_dtype(dtype, "dtype")
        buf_RSH = self.manager.moe_alltoall.get_combine_payload_tensor_in_workspace(S, self.hidden_size, dtype)
        self._workspace_output = buf_RSH
        return buf_RSH.view(-1, self.hidden_size)

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool, weight_and_reduce_impl: Any) -> None:
        """Combine the experts' ``[R * S, H]`` rows (already router-weighted) into ``output``;
        straight from the workspace when they are the :meth:`expert_output_buffer`."""
        S = self.runtime_max_tokens_per_rank
        if S is None:
            raise RuntimeError("finalize called before prepare")
        R, H = self.manager.world_size, fused_expert_output.size(-1)
        check_expert_output(fused_expert_output, R * S)
        in_workspace = self._workspace_output
        self._workspace_output = None
        if in_workspace is not None:
            check_workspace_resident(fused_expert_output, in_workspace)
            payload_RSH = in_workspace
        else:
            payload_RSH = fused_expert_output.view(R, S, H)
        self.manager.combine_into(payload_RSH, S, output, payload_in_workspace=in_workspace is not None)
        self.runtime_max_tokens_per_rank = None


def check_invalid_expert_id(invalid_expert_id: int, num_experts: int) -> None:
    if isinstance(invalid_expert_id, bool) or invalid_expert_id not in (-1, num_experts):
        raise ValueError(f"invalid_expert_id must be -1 or num_experts={num_experts} (outside the experts, "
                         f"and skipped by the expert kernels), got {invalid_expert_id!r}")


def check_activation_alignment(layout: DispatchLayout, hidden_size: int, ep_size: int) -> None:
    activation = layout.x_bytes_per_token + layout.x_sf_bytes_per_token
    if activation % ID_BYTES and ep_size % 2:
        # FlashInfer packs each payload right behind the previous one and requires every
        # payload to end aligned to its element size (ep_size * S rows of it); the int32 ids
        # follow [x, x_sf], so an activation row of 2 mod 4 bytes fails whenever
        # ep_size * runtime_max_tokens_per_rank is odd: at an odd EP size, every odd step.
        raise ValueError(
            f"hidden_size={hidden_size}: the one-sided dispatch at an odd EP size ({ep_size}) needs the "
            f"activation payload (values + scales = {layout.x_bytes_per_token} + {layout.x_sf_bytes_per_token} "
            f"bytes per token) to be a multiple of {ID_BYTES} bytes, the int32 ids come right after it; "
            "choose a hidden size that gives one (or pad the scales, e.g. mx_alignment)")


def check_prepare_inputs(a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                         apply_router_weight_on_input: bool, *, hidden_size: int, top_k: int,
                         layer_experts: int) -> torch.Tensor:
    """The one-sided prepare's input contract; returns ``a1`` (router-weighted when asked)."""
    if a1.dim() != 2 or a1.size(1) != hidden_size:
        raise ValueError(f"a1 must be [tokens, {hidden_size}], got {tuple(a1.shape)}")
    if num_experts != layer_experts:
        raise ValueError(f"num_experts={num_experts} but this layer was built for {layer_experts}")
    if tuple(topk_ids.shape) != (a1.size(0), top_k) or topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids must be int32 [{a1.size(0)}, {top_k}], got "
                         f"{topk_ids.dtype} {tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights must be fp32 {tuple(topk_ids.shape)} (the workspace is sized "
                         f"for 4-byte weights), got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if apply_router_weight_on_input:
        a1 = scale_input_by_router_weight(a1, topk_weights, topk_ids)
    return a1


def check_layout(layout: DispatchLayout, a1q: torch.Tensor, a1q_scale: Optional[torch.Tensor]) -> None:
    """The quantizer's output has the bytes per token the workspace was sized for."""
    got = DispatchLayout(a1q.size(1) * a1q.element_size(),
                         0 if a1q_scale is None else a1q_scale.size(1) * a1q_scale.element_size())
    if got != layout:
        raise RuntimeError(
            f"quantized activations carry {got.x_bytes_per_token} + {got.x_sf_bytes_per_token} bytes "
            f"per token but the workspace was sized for {layout.x_bytes_per_token} + "
            f"{layout.x_sf_bytes_per_token} (dispatch_layout disagrees with the quantizer)"
        )


def check_combine_dtype(dtype: torch.dtype, name: str) -> None:
    if dtype not in COMBINE_DTYPES:
        raise ValueError(f"{name} must be one of {COMBINE_DTYPES} (the combine region is sized for 16-bit "
                         f"rows), got {dtype}")


def check_expert_output(fused_expert_output: torch.Tensor, rows: int) -> None:
    """One 16-bit row per received row: ``[ep_size * runtime_max_tokens_per_rank, hidden]``."""
    check_combine_dtype(fused_expert_output.dtype, "fused_expert_output")
    if fused_expert_output.dim() != 2 or fused_expert_output.size(0) != rows:
        raise ValueError(f"fused_expert_output must be [ep_size * runtime_max_tokens_per_rank, hidden] = "
                         f"[{rows}, {fused_expert_output.size(-1)}] (one row per received row), got "
                         f"{tuple(fused_expert_output.shape)}")


def check_workspace_resident(out_NH: torch.Tensor, buf_RSH: torch.Tensor) -> None:
    """The experts were handed the combine region: what they return must be that region."""
    want = (buf_RSH.size(0) * buf_RSH.size(1), buf_RSH.size(2))
    for ok, rule in ((out_NH.device == buf_RSH.device, f"on {buf_RSH.device}, got {out_NH.device}"),
                     (out_NH.dtype == buf_RSH.dtype, f"of dtype {buf_RSH.dtype}, got {out_NH.dtype}"),
                     (tuple(out_NH.shape) == want, f"of shape {list(want)}, got {list(out_NH.shape)}"),
                     (out_NH.is_contiguous(), f"contiguous, got strides {out_NH.stride()}"),
                     (out_NH.data_ptr() == buf_RSH.data_ptr(),
                      "the combine region itself (the experts wrote elsewhere: that would need a staging copy)")):
        if not ok:
            raise ValueError("fused_expert_output: the experts were handed the workspace's combine region "
                             f"(expert_output_buffer), so their output must be {rule}")
