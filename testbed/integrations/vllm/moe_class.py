"""vLLM's MoE layer where it is a module class (0.18 .. 0.23): ``FusedMoE`` (``SharedFusedMoE``
with shared experts where the release has it), built and called as those releases' models
build and call it.

Legend: T tokens of this DP rank, K top_k, H hidden.

What vLLM does in these releases, and the layer level with it:

- the model builds ``FusedMoE(..., reduce_results=False)`` under the current ``VllmConfig``;
  the layer owns its quant method, weights and runner (``DefaultMoERunner`` in 0.18/0.19,
  ``MoERunner`` from 0.20);
- after the weights load, each quant method's ``process_weights_after_loading``, then vLLM's
  ``prepare_communication_buffer_for_model`` (the GPU model runner's call after loading), which
  has every EP communicator call the layer's ``maybe_init_modular_kernel``: the quant method's
  ``maybe_make_prepare_finalize`` builds the all-to-all's prepare/finalize and
  ``FusedMoEModularMethod.make`` asks the quant method's ``select_gemm_impl`` for the experts,
  where the testbed's experts stand in for the Triton ones it picks;
- the final reduce: from 0.20 the runner's own ``_maybe_reduce_final_output``; in 0.18/0.19
  the model's (Qwen3-MoE's, DeepSeek-V2's): ``layer.maybe_all_reduce_tensor_model_parallel``
  of the shared plus routed output where TP > 1 and not sequence parallel.
"""

from __future__ import annotations

import importlib
import inspect
import sys

import torch

from testbed import patch
from testbed.integrations import engine as support
from testbed.integrations.vllm.environment import moe_class
from testbed.integrations.vllm.experts import experts_class
from testbed.integrations.vllm.layer import (
    RunnerLayer,
    building,
    enter_as_on_cuda,
    load_weights,
    placed_as_the_testbed,
)


def build_layer(session, index: int, fmt: str, experts):
    """vLLM's ``FusedMoE`` module of one scenario layer, loaded, processed and with its modular
    kernel, as the release's model runner leaves it."""
    from vllm.distributed.parallel_state import prepare_communication_buffer_for_model

    _chunk_buffers_on_this_device(session.ctx)
    with building(session, index, fmt, experts) as arguments:
        cls = _layer_class(arguments["shared_experts"] is not None)
        # The scenario's routing rides in fp32 logits, as from a model whose gate computes in fp32
        # (0.18/0.19's DP-chunked path checks that the layer was told so).
        layer = cls(**arguments, **_where_taken(inspect.signature(cls).parameters, reduce_results=False,
                                                 apply_routed_scale_to_output=True,
                                                 router_logits_dtype=torch.float32))
        load_weights(layer)
        method = layer.quant_method
        # What FusedMoEModularMethod.make asks the quant method for: the experts of its kernel.
        undo = patch.attribute(method, "select_gemm_impl", lambda prepare_finalize, moe_layer: experts_class(
            experts)(moe_config=method.moe, quant_config=method.moe_quant_config))
        try:
            prepare_communication_buffer_for_model(layer)
        finally:
            undo()
    placed_as_the_testbed(layer, experts)
    # 0.20 on: the runner's _forward_entry; 0.18/0.19: DefaultMoERunner's moe_forward.
    enter_as_on_cuda(layer.runner, "_forward_entry" if hasattr(layer.runner, "_forward_entry") else "moe_forward")
    return ClassLayer(layer, session.sc, arguments["is_sequence_parallel"])


def _chunk_buffers_on_this_device(ctx) -> None:
    """0.18/0.19's ``DefaultMoERunner`` allocates its DP-chunking buffers (the two-sided path
    chunks) on ``torch.accelerator.current_device_index()``, the rank's GPU (0.19: when the
    runner is built); its module's ``torch`` answers this rank's device, the CPU, there, and is
    torch itself otherwise."""
    module = sys.modules.get("vllm.model_executor.layers.fused_moe.runner.default_moe_runner")
    if getattr(module, "torch", None) is not torch or \
            "torch.accelerator.current_device_index()" not in inspect.getsource(module):
        return
    ctx.add_cleanup(patch.attribute(module, "torch", support.TorchOnThisDevice()))


def _where_taken(params, **arguments) -> dict:
    """The arguments the release's models hand where its layer takes them: ``reduce_results=False``
    (0.18/0.19; the model reduces), ``apply_routed_scale_to_output`` (0.20 on),
    ``router_logits_dtype``."""
    return {name: value for name, value in arguments.items() if name in params}


def _layer_class(shared: bool):
    """The class a release's models build: ``SharedFusedMoE`` for a block with shared experts
    where the release has it as a class of its own (0.18/0.19), else ``FusedMoE``."""
    cls = moe_class()
    if shared:
        try:
            module = importlib.import_module("vllm.model_executor.layers.fused_moe.shared_fused_moe")
        except ModuleNotFoundError:
            return cls
        found = getattr(module, "SharedFusedMoE", cls)
        return found if inspect.isclass(found) and issubclass(found, cls) else cls
    return cls


class ClassLayer(RunnerLayer):
    """One scenario layer as a model of these releases calls its ``FusedMoE``: the layer's
    output, then the model's own TP reduce where the release leaves it to the model."""

    def __init__(self, layer, sc, sequence_parallel: bool):
        self.layer = layer
        super().__init__(layer.runner, sc, sequence_parallel)
        # 0.18/0.19: the model reduces (DefaultMoERunner has no final-reduce decision of its own).
        self.model_reduces = hasattr(layer, "maybe_all_reduce_tensor_model_parallel")

    def output_is_reduced(self) -> bool:
        kernel = self.layer.quant_method.moe_kernel
        return kernel is not None and kernel.output_is_reduced()

    def topk_indices_dtype(self):
        return self.layer.quant_method.topk_indices_dtype

    def moe(self, x_th, logits_tk):
        # The routing's [t, 2K] logits widened with zero columns to the experts' count, the
        # width 0.18/0.19's DP-chunked path copies router logits into (handed_routing reads
        # the first 2K).
        logits_tk = torch.nn.functional.pad(logits_tk, (0, max(0, self.sc.experts - logits_tk.size(1))))
        out = self.layer(x_th, logits_tk)
        if isinstance(out, tuple):  # SharedFusedMoE: (shared, routed)
            shared, out = out
            out = out if shared is None else shared + out
        if self.model_reduces and not self.sequence_parallel and self.sc.layout.tp > 1:
            out = self.layer.maybe_all_reduce_tensor_model_parallel(out)
        return out
