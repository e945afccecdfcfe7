"""FlashInfer ``moe_ep`` NVLink backends (``NVLinkOneSidedAlltoAll``, ``NVLinkTwoSidedAlltoAll``):
the manager and prepare/finalize, with the contract of :mod:`impl.one_sided`.

FlashInfer 0.7.4 ships only these (``MoeAlltoAll`` and ``MnnvlMoe`` are gone); 0.7.2 ships
both. A ``moe_ep`` communication sizes its workspace itself from ``MoEEpCommParams``, so each
distinct layer sizing gets its own (FlashInfer shares one workspace between instances of the
same layout); a layer never runs on a communication sized for another.

Legend: T local tokens, K top_k, H hidden, R EP ranks, S runtime max tokens per rank.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from impl.backend import FlashInferAPI
from impl.communicator import EPGroupManager, make_communicator
from impl.compat import supports_kw
from impl.formats import DispatchLayout, QuantConfig
from impl.moe_layer import PrepareResult
from impl.one_sided import (
    INVALID_EXPERT_ID,
    OneSidedLayer,
    check_combine_dtype,
    check_expert_output,
    check_workspace_resident,
)

KINDS = ("one_sided", "two_sided")
ROW_DTYPE = torch.bfloat16  # the unquantized row moe_ep sizes from: what combine takes back
PAYLOAD_ALIGNMENT = 16  # 0.7.4's dispatch refuses a payload whose start is not 16-byte aligned


def aligned(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t``, copied when its start is not :data:`PAYLOAD_ALIGNMENT`-aligned: a sequence-parallel
    chunk of the ids (``[T, K]`` int32) starts ``start * K * 4`` bytes into the tensor."""
    return t if t is None or t.data_ptr() % PAYLOAD_ALIGNMENT == 0 else t.clone()


def check_fits_a_row(layout: DispatchLayout, hidden_size: int) -> None:
    """``moe_ep`` sizes the dispatch region for a ``ROW_DTYPE`` row (plus ids and weights)
    per token: every activation format here is at most that (16-bit values, or fewer bytes
    with their scales)."""
    row = hidden_size * ROW_DTYPE.itemsize
    if layout.x_bytes_per_token + layout.x_sf_bytes_per_token > row:
        raise ValueError(f"the activations take {layout.x_bytes_per_token} + {layout.x_sf_bytes_per_token} bytes per "
                         f"token, more than the {row}-byte {ROW_DTYPE} row moe_ep sizes its dispatch region for")


class MoeEpManager(EPGroupManager):
    """The ``moe_ep`` communications of one EP group, one per layer sizing, built on first use
    (collective: every EP rank builds the same ones in the same order); constructed as
    :class:`impl.communicator.EPGroupManager` plus ``kind`` (``"one_sided"`` or
    ``"two_sided"``). ``builds`` counts the communications created."""

    def __init__(self, api: FlashInferAPI, cpu_group: dist.ProcessGroup, kind: str,
                 gpus_per_node: Optional[int] = None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        super().__init__(api, cpu_group, gpus_per_node)
        self.kind = kind
        self.communications: dict[tuple, Any] = {}
        self.builds = 0

    def communication(self, *, max_num_tokens: int, top_k: int, num_experts: int, hidden_size: int,
                      layout: DispatchLayout, invalid_expert_id: int) -> Any:
        """The communication that carries a layer of this sizing (built if new)."""
        check_fits_a_row(layout, hidden_size)
        key = (max_num_tokens, top_k, num_experts, hidden_size, invalid_expert_id)
        if key not in self.communications:
            ep = self.api.moe_ep
            params = ep.MoEEpCommParams(num_experts=num_experts, top_k=top_k, max_tokens_per_rank=max_num_tokens,
                                        hidden_size=hidden_size, dtype=ROW_DTYPE, invalid_expert_id=invalid_expert_id)
            bootstrap = ep.BootstrapConfig(world_size=self.world_size, rank=self.rank, process_group=self.cpu_group)
            comm_backend = make_communicator(self.api, self.cpu_group)
            config = (ep.NVLinkOneSidedConfig(comm_backend=comm_backend) if self.kind == "one_sided"
                      else ep.NVLinkTwoSidedConfig(comm_backend=comm_backend))
            self.communications[key] = ep.create_communication(bootstrap, params, config)
            self.builds += 1
            self.initialized = True
        return self.communications[key]

    def cleanup(self) -> None:
        """Destroy every communication (collective on the EP group); the manager is empty
        afterwards even when a destroy raises (the first error is raised after the rest)."""
        comms, self.communications = list(self.communications.values()), {}
        self.initialized = False
        error = None
        for comm in comms:
            try:
                comm.destroy()
            except Exception as e:  # every communication gets its destroy
                error = error or e
        if error is not None:
            raise error


class MoeEpPrepareFinalize(OneSidedLayer):
    """One MoE layer's dispatch and combine through a ``moe_ep`` communication of
    :class:`MoeEpManager`; the arguments are :class:`impl.one_sided.OneSidedLayer`'s.

    Received rows are ``[R * S, ...]`` rank-major; rows without a token carry
    ``invalid_expert_id`` in every slot. The one-sided combine region can take the experts'
    output (:meth:`expert_output_buffer`).
    """

    def __init__(self, manager: MoeEpManager, *, max_num_tokens: int, top_k: int, num_experts: int,
                 hidden_size: int, layout: DispatchLayout, num_dispatchers: Optional[int] = None,
                 invalid_expert_id: int = INVALID_EXPERT_ID):
        # 0.7.2's one-sided backend packs payloads back to back (MoeAlltoAll); 0.7.4 aligns
        # each, so there the rule is stricter than needed, never too lenient.
        super().__init__(manager, max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                         hidden_size=hidden_size, layout=layout, num_dispatchers=num_dispatchers,
                         invalid_expert_id=invalid_expert_id, packed_payloads=manager.kind == "one_sided")
        self.comm = manager.communication(max_num_tokens=max_num_tokens, top_k=top_k, num_experts=num_experts,
                                          hidden_size=hidden_size, layout=layout,
                                          invalid_expert_id=invalid_expert_id)
        # 0.7.4 renamed dispatch's max_tokens_per_rank to runtime_max_tokens_per_rank.
        self._step_kw = ("runtime_max_tokens_per_rank"
                         if supports_kw(self.comm.dispatch, "runtime_max_tokens_per_rank", allow_var_kwargs=False)
                         else "max_tokens_per_rank")

    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                expert_map: Optional[torch.Tensor], apply_router_weight_on_input: bool,
                quant_config: QuantConfig, defer_input_quant: bool = False) -> PrepareResult:
        """Quantize and dispatch; return what this rank received, ``[R * S, ...]``.

        ``expert_map`` is unused: ids travel global and the experts select their own.
        """
        S, a1q, a1q_scale = self._quantized_input(a1, topk_weights, topk_ids, num_experts, apply_router_weight_on_input,
                                                  quant_config, defer_input_quant, self.max_num_tokens,
                                                  "the layer's max_num_tokens")
        recv = self.comm.dispatch(aligned(a1q), aligned(topk_ids), aligned(topk_weights),
                                  hidden_states_scale=aligned(a1q_scale), **{self._step_kw: S})
        return PrepareResult(recv.hidden_states, recv.hidden_states_scale, None, recv.topk_ids, recv.topk_weights)

    def expert_output_buffer(self, dtype: torch.dtype) -> torch.Tensor:
        """``[R * S, H]`` view of this round's combine region (one-sided only) for the experts
        to write into; :meth:`finalize` then combines it in place."""
        if self.runtime_max_tokens_per_rank is None:
            raise RuntimeError("expert_output_buffer called before prepare")
        if self.manager.kind != "one_sided":
            raise NotImplementedError("the two-sided all-to-all has no combine region the experts can write into")
        check_combine_dtype(dtype, "dtype")
        self._workspace_output = self.comm.get_combine_input_buffer(dtype)
        return self._workspace_output

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool, weight_and_reduce_impl: Any) -> None:
        """Combine the experts' ``[R * S, H]`` rows (already router-weighted) into ``output``."""
        S = self.runtime_max_tokens_per_rank
        if S is None:
            raise RuntimeError("finalize called before prepare")
        check_expert_output(fused_expert_output, self.manager.world_size * S)
        in_workspace, self._workspace_output = self._workspace_output, None
        if in_workspace is not None:
            check_workspace_resident(fused_expert_output, in_workspace.view(self.manager.world_size, S, -1))
        self.comm.combine(fused_expert_output, output=output)
        self.runtime_max_tokens_per_rank = None
