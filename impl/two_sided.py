"""FlashInfer two-sided NVLink all-to-all-v (``MnnvlMoe``): the manager and prepare/finalize.

Legend: T local tokens, K top_k, H hidden, R EP ranks, M max tokens per rank.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from impl.backend import FlashInferAPI
from impl.communicator import EPGroupManager
from impl.formats import QuantConfig
from impl.forward_context import runtime_max_tokens_per_rank
from impl.moe_layer import PrepareResult, scale_input_by_router_weight
from impl.quant import quantize_input

FABRIC_PAGE_SIZE = 1 << 29  # 512 MiB, as vLLM asks


class TwoSidedManager(EPGroupManager):
    """The ``MnnvlMoe`` workspaces of one EP group (FlashInfer sizes them from the EP size);
    constructed as :class:`impl.communicator.EPGroupManager`."""

    def __init__(self, api: FlashInferAPI, cpu_group: dist.ProcessGroup, gpus_per_node: Optional[int] = None):
        super().__init__(api, cpu_group, gpus_per_node)
        self.workspace_tensor: Optional[torch.Tensor] = None
        self.prepare_workspace_tensor: Optional[torch.Tensor] = None

    def initialize(self) -> None:
        """Allocate both workspaces (collective on the EP group); a no-op once done."""
        if self.initialized:
            return
        self.cleanup()
        W = self.world_size
        self.mapping = self.api.Mapping(world_size=W, rank=self.rank, gpus_per_node=self.gpus_per_node, tp_size=W)
        config = self.mnnvl_config(fabric_page_size=FABRIC_PAGE_SIZE, allocation_granularity=0)
        self.workspace_tensor = self.api.MnnvlMoe.get_moe_workspaces(self.mapping, config)
        self.prepare_workspace_tensor = self.api.MnnvlMoe.get_moe_prepare_workspace(self.mapping, config)
        self.initialized = True

    def ensure_alltoall_workspace_initialized(self) -> bool:
        """True once the workspaces exist; False when there is nothing to exchange (one rank)."""
        if self.world_size <= 1:
            return False
        self.initialize()
        return self.initialized

    def cleanup(self) -> None:
        self.workspace_tensor = None
        self.prepare_workspace_tensor = None
        self.mapping = None
        self.initialized = False


class TwoSidedPrepareFinalize:
    """One MoE layer's all-to-all-v through :class:`TwoSidedManager`.

    The combine sums each token's top_k rows, so the output is reduced like the one-sided one.
    """

    def __init__(self, manager: TwoSidedManager, *, num_dispatchers: Optional[int] = None):
        self.manager = manager
        self.num_dispatchers_ = num_dispatchers or manager.world_size
        self.alltoall_info: Any = None

    def output_is_reduced(self) -> bool:
        return True

    def topk_indices_dtype(self) -> Optional[torch.dtype]:
        return None

    def num_dispatchers(self) -> int:
        return self.num_dispatchers_

    def prepare(self, a1: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
                expert_map: Optional[torch.Tensor], apply_router_weight_on_input: bool,
                quant_config: QuantConfig, defer_input_quant: bool = False) -> PrepareResult:
        """Exchange routing, then the activations (and scales). Received rows are
        ``[R * M, ...]``; ids of experts not on this rank read ``num_experts``."""
        m = self.manager
        if not m.ensure_alltoall_workspace_initialized():
            raise RuntimeError("FlashInfer two-sided all-to-all needs an EP group of 2 or more ranks")
        if topk_weights.shape != topk_ids.shape:
            raise ValueError(f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} differ")
        if apply_router_weight_on_input:
            a1 = scale_input_by_router_weight(a1, topk_weights, topk_ids)
        M = runtime_max_tokens_per_rank(a1.size(0))
        top_k = topk_ids.size(1)
        weights_dtype = topk_weights.dtype
        info, ids_recv, weights_recv, _ = self.manager.api.MnnvlMoe.mnnvl_moe_alltoallv_prepare_without_allgather(
            topk_ids.to(torch.int32), topk_weights.float(), None, m.prepare_workspace_tensor, M,
            m.rank, m.world_size, num_experts, num_experts, top_k,
        )
        self.alltoall_info = info
        a1q, a1q_scale = (a1, None) if defer_input_quant else quantize_input(a1, quant_config)
        exchange = lambda t: m.api.MnnvlMoe.mnnvl_moe_alltoallv(  # noqa: E731
            t, info, m.workspace_tensor, m.rank, m.world_size)
        x_recv = exchange(a1q)
        sf_recv = None if a1q_scale is None else exchange(a1q_scale)
        return PrepareResult(x_recv, sf_recv, None, ids_recv, weights_recv.to(weights_dtype))

    def finalize(self, output: torch.Tensor, fused_expert_output: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, apply_router_weight_on_input: bool, weight_and_reduce_impl: Any) -> None:
        """Send each received row's result back and sum a token's top_k rows into ``output``."""
        if self.alltoall_info is None:
            raise RuntimeError("finalize called before prepare")
        m = self.manager
        combined = m.api.MnnvlMoe.mnnvl_moe_alltoallv_combine(
            fused_expert_output, self.alltoall_info, m.workspace_tensor, ep_rank=m.rank,
            ep_size=m.world_size, top_k=topk_ids.size(1), token_count=output.size(0),
        )
        output.copy_(combined)
        self.alltoall_info = None
