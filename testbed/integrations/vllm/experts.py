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
    return type("TestbedExperts", (_base(),), {"testbed": experts})


@functools.cache
def _base() -> type:
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import TopKWeightAndReduceNoOP

    class TestbedExperts(mk.FusedMoEExpertsModular):
        """Per received row ``[N, H]``, the router-weighted sum of this rank's experts over
        the row's ``[N, K]`` lanes (rows of other ranks' experts or the sentinel contribute
        nothing), read in the format the prepare dispatched."""

        testbed = None

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

        def workspace_shapes(self, M, N, K, topk, global_num_experts, local_num_experts, expert_tokens_meta,
                             activation):
            # K is the dispatched row's width: nvfp4 packs two values a byte.
            return (0,), (0,), (M, K * 2 if self.quant_config.quant_dtype == "nvfp4" else K)

        def finalize_weight_and_reduce_impl(self):
            return TopKWeightAndReduceNoOP()

        def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                  expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                  apply_router_weight_on_input):
            if self.quant_config.quant_dtype == "nvfp4" and self.quant_config.is_scale_swizzled:
                # The prepare interleaved the received scales 128x4 for experts that read them so.
                rows, cols = hidden_states.size(0), 2 * hidden_states.size(1) // 16
                a1q_scale = deinterleave_128x4(a1q_scale.view(torch.uint8).reshape(-1), rows, cols)
            received = SimpleNamespace(a1q=hidden_states, a1q_scale=a1q_scale, topk_ids=topk_ids.long(),
                                       topk_weights=topk_weights)
            output.copy_(self.testbed(received))
            return None

    return TestbedExperts
