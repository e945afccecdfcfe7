"""The testbed's experts behind vLLM's modular experts interface (``FusedMoEExpertsModular``):
what vLLM's kernel hands its experts after the prepare, computed by the testbed's experts
(vLLM's CPU experts need compiled ops its CUDA wheel lacks, and ignore ``expert_map`` under
expert parallel), so finalize has nothing left to weight or reduce.

Legend: N rows this rank received, K top_k, H hidden.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from fakes.flashinfer.fused_moe.layouts import deinterleave_128x4


def experts_class(experts) -> type:
    """A ``FusedMoEExpertsModular`` subclass bound to one layer's testbed ``experts``: vLLM's
    oracles instantiate the class they select themselves (``experts_cls(moe_config=...,
    quant_config=...)``), so the instance is found through the class."""
    return type("TestbedExperts", (_classes()[0],), {"testbed": experts})


def weight_experts_class() -> type:
    """A ``FusedMoEExpertsModular`` that computes with the layer's own loaded weights (vLLM's
    ``w13`` ``[E, 2I, H]``, gate rows then up rows, and ``w2`` ``[E, H, I]``), SiLU-gated, in
    fp32, honouring ``expert_map`` (global id -> this rank's expert, -1 elsewhere): what
    vLLM's CPU experts compute, which need compiled ops and ignore ``expert_map``."""
    return _classes()[1]


@functools.cache
def _classes() -> tuple[type, type]:
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP

    class StandInExperts(mk.FusedMoEExpertsModular):
        """What vLLM's experts oracle may pick: any device, scheme, activation and parallel
        config; each received row ``[N, H]`` leaves weighted and summed over its lanes, so
        finalize has nothing left to weight or reduce."""

        @staticmethod
        def activation_format():
            return mk.FusedMoEActivationFormat.Standard

        @staticmethod
        def _supports_current_device() -> bool:
            return True

        @staticmethod
        def _supports_no_act_and_mul() -> bool:
            return False

        @staticmethod
        def _supports_quant_scheme(weight_key, activation_key) -> bool:
            return True

        @staticmethod
        def _supports_activation(activation) -> bool:
            return True

        @staticmethod
        def _supports_parallel_config(moe_parallel_config) -> bool:
            return True

        @property
        def expects_unquantized_inputs(self) -> bool:
            return False

        def supports_expert_map(self) -> bool:  # abstract before 0.23
            return True

        def finalize_weight_and_reduce_impl(self):
            return TopKWeightAndReduceNoOP()

    class TestbedExperts(StandInExperts):
        """Per received row ``[N, H]``, the router-weighted sum of this rank's experts over
        the row's ``[N, K]`` lanes (rows of other ranks' experts or the sentinel contribute
        nothing), read in the format the prepare dispatched."""

        testbed = None

        def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                             activation):
            # K is the dispatched row's width: nvfp4 packs two values a byte.
            return (0,), (0,), (M, K * 2 if self.quant_config.quant_dtype == "nvfp4" else K)

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            # is_scale_swizzled from 0.20.1; is_nvfp4_scale_swizzled before.
            swizzled = getattr(self.quant_config, "is_scale_swizzled", None)
            if swizzled is None:
                swizzled = self.quant_config.is_nvfp4_scale_swizzled
            if self.quant_config.quant_dtype == "nvfp4" and swizzled:
                # The prepare interleaved the received scales 128x4 for experts that read them so.
                rows, cols = hidden_states.size(0), 2 * hidden_states.size(1) // 16
                a1q_scale = deinterleave_128x4(a1q_scale.view(torch.uint8).reshape(-1), rows, cols)
            received = SimpleNamespace(a1q=hidden_states, a1q_scale=a1q_scale, topk_ids=topk_ids.long(),
                                       topk_weights=topk_weights)
            output.copy_(self.testbed(received))
            return None

    class WeightExperts(StandInExperts):
        def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                             activation):
            return (0,), (0,), (M, K)

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            if self.quant_config.quant_dtype is not None:
                raise NotImplementedError(f"the testbed's weight experts compute bf16 layers only, got "
                                          f"{self.quant_config.quant_dtype}")
            x_NH, ids_NK = hidden_states.float(), topk_ids.long()
            local_NK = ids_NK.clamp(0, global_num_experts - 1)
            valid_NK = (ids_NK >= 0) & (ids_NK < global_num_experts)
            if expert_map is not None:
                local_NK = expert_map.long()[local_NK]
                valid_NK &= local_NK >= 0
            weight_NK = torch.ones_like(topk_weights, dtype=torch.float32) if apply_router_weight_on_input \
                else topk_weights.float()
            out_NH = torch.zeros(x_NH.size(0), w2.size(1), dtype=torch.float32)
            for e in local_NK[valid_NK].unique().tolist():
                rows, lanes = ((local_NK == e) & valid_NK).nonzero(as_tuple=True)
                gate_up = x_NH[rows] @ w1[e].float().t()
                half = gate_up.size(1) // 2
                y = (torch.nn.functional.silu(gate_up[:, :half]) * gate_up[:, half:]) @ w2[e].float().t()
                out_NH.index_add_(0, rows, y * weight_NK[rows, lanes].unsqueeze(1))
            output.copy_(out_NH.to(output.dtype))
            return None

    return TestbedExperts, WeightExperts
