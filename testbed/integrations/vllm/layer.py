"""vLLM's own MoE layer on a rank: ``FusedMoEFactory`` -> ``MoERunner``, called as vLLM's
models call it.

Legend: T tokens of this DP rank, t this TP rank's sequence-parallel chunk of them, K top_k,
H hidden.

Per layer, vLLM builds everything from the scenario's deployment: its router (``CPURouter``
on this platform, with a ``custom_routing_function`` that hands in the scenario's routing),
its quant method for the layer's format and that method's ``process_weights_after_loading``,
its experts oracle's choice of kernel (the testbed's experts stand in for the class it picks,
:mod:`.experts`), its prepare/finalize for the deployment's all-to-all, its shared experts
handling and every reduce decision. The layer is entered through the op vLLM's CUDA platform
enters it by (``torch.ops.vllm.moe_forward`` / ``moe_forward_shared``), inside vLLM's forward
context; sequence parallel is what vLLM's models do around it (``sequence_parallel_chunk``
of the hidden states and of the router's input, the TP all-gather of the output).

The scenario's routing rides in the router logits: ``[T, 2K]`` fp32, the ids then the
weights, so vLLM's own sequence-parallel chunking splits it with the hidden states.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
from typing import NamedTuple, Optional

import torch

from testbed import patch
from testbed.integrations.vllm.environment import NotACpu, moe_factory
from testbed.integrations.vllm.experts import experts_class
from testbed.scenario.experts import SharedLinear
from testbed.scenario.reference import (
    ACT_DTYPE,
    NVFP4_GLOBAL_SCALE,
    intermediate_size,
    padding_routing,
    shared_weight,
)

class Format(NamedTuple):
    """How a layer of one activation format is built: the checkpoint's vLLM quantization
    (``kind``, None: unquantized), the deployment's ``--moe-backend``, and where vLLM's experts
    oracle resolves that backend's experts (``oracle`` module under ``fused_moe.oracle``, its
    ``resolver`` function, the backend as ``enum.member``). vLLM's Triton and CPU experts need
    kernels this CPU lacks; the testbed's experts take the place of the class it resolves."""

    kind: Optional[str]
    moe_backend: str
    oracle: str
    resolver: str
    enum: str
    member: str


FORMATS = {
    "bf16": Format(None, "auto", "unquantized", "backend_to_kernel_cls", "UnquantizedMoeBackend", "CPU"),
    "fp8_block": Format("fp8", "triton", "fp8", "backend_to_kernel_cls", "Fp8MoeBackend", "TRITON"),
    "mxfp8": Format("mxfp8", "triton", "mxfp8", "_mxfp8_backend_to_kernel_cls", "Fp8MoeBackend", "TRITON_MXFP8"),
    # The CUTLASS backend's weight swizzle calls .cuda(); the emulation backend's runs on the CPU.
    "nvfp4": Format("nvfp4", "emulation", "nvfp4", "backend_to_kernel_cls", "NvFp4MoeBackend", "EMULATION"),
}


def checkpoint_quant_config(kind):
    """vLLM's quantization config of a checkpoint of ``kind`` (None: unquantized)."""
    if kind is None:
        return None
    if kind == "fp8":  # DeepSeek-V3's: e4m3 weights in 128 x 128 blocks, 1 x 128 dynamic activations
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                         weight_block_size=[128, 128])
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMxFp8Config, ModelOptNvFp4Config

    if kind == "nvfp4":
        # kv_cache_quant_algo: required before 0.21 (no KV-cache quantization here).
        kv = {"kv_cache_quant_algo": None} if "kv_cache_quant_algo" in inspect.signature(ModelOptNvFp4Config).parameters \
            else {}
        return ModelOptNvFp4Config(is_checkpoint_nvfp4_serialized=True, exclude_modules=[], **kv)
    return ModelOptMxFp8Config(is_checkpoint_mxfp8_serialized=True, kv_cache_quant_algo=None, exclude_modules=[])


def handed_routing(hidden_states, gating_output, topk, renormalize):
    """The scenario's routing out of the logits it rides in (``[t, 2K]``, or wider with zero
    columns) -> (weights, ids). A row of zeros is sequence-parallel padding, routed as a gate routes a zero row."""
    ids, w = gating_output[:, :topk].round().to(torch.int32) - 1, gating_output[:, topk:2 * topk].clone()
    pad = (ids < 0).all(1)
    if pad.any():
        pad_ids, pad_w = padding_routing(topk)
        ids[pad], w[pad] = pad_ids, pad_w
    return w, ids


def routing_logits(ids_TK: torch.Tensor, w_TK: torch.Tensor) -> torch.Tensor:
    """``[T, 2K]`` fp32: ids + 1 (so a padding row of zeros is told apart), then the weights."""
    return torch.cat([ids_TK.float() + 1, w_TK.float()], dim=1)


def format_on_this_release(fmt: str) -> tuple[Format, tuple]:
    """How a layer of ``fmt`` is built on this vLLM, and the modules whose platform must not be a
    CPU for it: where the release's unquantized oracle answers a CPU platform with its CPU
    backend and no experts class (before 0.28: "TODO: migrate to MK structure"; 0.18's assigns
    the CPU backend, whose kernel is monolithic; a probe of its source), that layer never gets a
    modular kernel on a CPU, so it is built as on a CUDA host (what those two modules ask of the
    platform answers so), on vLLM's Triton backend, the testbed's experts standing in for
    Triton's. Where the nvfp4 oracle has no emulation backend (0.18/0.19), an nvfp4 layer is
    built on FlashInfer's CUTLASS backend (what a B200 picks), the testbed's experts standing in
    for FlashInfer's and its block-scale swizzle's result left on the CPU."""
    form = FORMATS[fmt]
    if form.kind is None and _cpu_backend_without_kernel():
        return form._replace(moe_backend="triton", member="TRITON"), (
            "vllm.model_executor.layers.fused_moe.oracle.unquantized",
            "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method")
    if form.kind == "nvfp4" and not hasattr(_oracle(form).NvFp4MoeBackend, form.member):
        return form._replace(moe_backend="flashinfer_cutlass", member="FLASHINFER_CUTLASS"), ()
    return form, ()


def _oracle(form: Format):
    return importlib.import_module(f"vllm.model_executor.layers.fused_moe.oracle.{form.oracle}")


@functools.cache
def _cpu_backend_without_kernel() -> bool:
    oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.unquantized")
    source = inspect.getsource(oracle.select_unquantized_moe_backend)
    return re.search(r"if current_platform\.is_cpu\(\):\s*(#[^\n]*\s*)*"
                     r"(return UnquantizedMoeBackend\.CPU, None|backend = UnquantizedMoeBackend\.CPU\n)",
                     source) is not None


@contextlib.contextmanager
def building(session, index: int, fmt: str, experts):
    """What building one scenario layer holds on this release, whatever form its MoE layer has
    (a factory, :func:`build_runner`, or a class, :mod:`.moe_class`): the deployment's
    ``--moe-backend`` and the current ``VllmConfig`` set, the experts oracle's resolver answering
    the testbed's experts for the backend the format is built on (where the release's oracle
    has one; 0.18's quant method picks its experts in ``select_gemm_impl`` alone), the modules
    that must see a CUDA host seeing one. Yields the arguments every form takes, as the
    release's models hand them."""
    from vllm.config import set_current_vllm_config

    sc, ctx, config = session.sc, session.ctx, session.config
    form, gpu_modules = format_on_this_release(fmt)
    oracle = _oracle(form)
    undo = []
    resolve = getattr(oracle, form.resolver, None)
    if resolve is not None:
        chosen = getattr(getattr(oracle, form.enum), form.member)
        cls = experts_class(experts)
        # The release's resolver answers with a list of experts classes (0.26 on) or with one.
        mine = [cls] if str(inspect.signature(resolve).return_annotation).startswith("list") else cls
        undo.append(patch.attribute(oracle, form.resolver, lambda b: mine if b == chosen else resolve(b)))
    for name in gpu_modules:
        module = importlib.import_module(name)
        undo.append(patch.attribute(module, "current_platform", NotACpu(module.current_platform, cuda=True)))
    if form.member == "FLASHINFER_CUTLASS":
        undo.append(_swizzle_on_this_device())
    sp = config.parallel_config.use_sequence_parallel_moe
    shared = None
    if sc.shared_experts:
        tp = (ctx.coords.tp_rank, sc.layout.tp)
        shared = SharedLinear(shared_weight(sc.seed, ctx.coords.pp_rank, index, sc.hidden),
                              (0, 1) if sp else tp)
    try:
        config.kernel_config.moe_backend = form.moe_backend
        with set_current_vllm_config(config):
            yield dict(
                num_experts=sc.experts, top_k=sc.top_k, hidden_size=sc.hidden,
                # The weights are never read (the testbed's experts compute): the smallest
                # size every quant method takes, so a real hidden size costs O(H) per expert.
                intermediate_size=intermediate_size(sc),
                params_dtype=ACT_DTYPE, renormalize=False, quant_config=checkpoint_quant_config(form.kind),
                prefix=f"model.layers.{ctx.coords.pp_rank}.{index}.mlp.experts",
                custom_routing_function=handed_routing, routed_scaling_factor=sc.routed_scaling,
                apply_router_weight_on_input=sc.router_weight_on_input, is_sequence_parallel=sp,
                shared_experts=shared)
    finally:
        for restore in reversed(undo):
            restore()


def _swizzle_on_this_device():
    """vLLM's own block-scale swizzle for FlashInfer's CUTLASS kernels, its result moved to this
    rank's device, the CPU (``swizzle_blockscale`` ends in ``.cuda()``); returns what undoes it."""
    module = importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe")
    swizzle = module.swizzle_blockscale

    def on_this_device(scale):
        undo = patch.attribute(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
        try:
            return swizzle(scale)
        finally:
            undo()

    return patch.attribute(module, "swizzle_blockscale", on_this_device)


def placed_as_the_testbed(layer, experts) -> None:
    """vLLM put on this EP rank the experts the testbed's experts hold, in their order."""
    if layer.moe_config.num_local_experts != len(experts.own) or local_to_global(layer) != list(experts.own):
        raise RuntimeError(f"vLLM placed experts {local_to_global(layer)} on EP rank; the testbed's experts are "
                           f"{list(experts.own)}")


def enter_as_on_cuda(runner, entry: str) -> None:
    """The runner's ``entry`` attribute set to the op vLLM's CUDA platform enters the layer by
    (the CPU platform calls the function the op wraps)."""
    setattr(runner, entry, torch.ops.vllm.moe_forward if runner.shared_experts is None
            else torch.ops.vllm.moe_forward_shared)


def build_runner(session, index: int, fmt: str, experts):
    """vLLM's ``MoERunner`` of one scenario layer, its weights loaded and processed."""
    factory = moe_factory()
    with building(session, index, fmt, experts) as arguments:
        runner = factory(**arguments, apply_routed_scale_to_output=True,
                         # 0.24's factory takes none: its runner reduces as reduce_results=True does.
                         **({"reduce_results": True} if "reduce_results" in inspect.signature(factory).parameters
                            else {}))
        load_weights(runner.routed_experts)
    placed_as_the_testbed(runner, experts)
    enter_as_on_cuda(runner, "_forward_entry")
    return RunnerLayer(runner, session.sc, arguments["is_sequence_parallel"])


def load_weights(experts) -> None:
    """Deterministic weights of the shapes and dtypes the quant method created on the module
    holding ``experts``' parameters (the math is the testbed's experts'), then the method's own
    post-load processing (from 0.24 it builds the modular kernel)."""
    with torch.no_grad():
        for name, p in experts.named_parameters():
            if "input_scale" in name:  # the calibrated activation amax / (448 * 6) the testbed's inputs keep
                p.fill_(1.0 / NVFP4_GLOBAL_SCALE)
            elif "scale" not in name:
                p.zero_()
            elif p.dtype == torch.uint8:  # e8m0 exponents: 2^0
                p.fill_(127)
            else:
                p.fill_(1.0)
    experts.quant_method.process_weights_after_loading(experts)


def local_to_global(layer) -> list[int]:
    """The global ids of this EP rank's experts, in local order, by the layer's (a runner's or
    a ``FusedMoE`` module's) expert map."""
    emap = layer.expert_map
    if emap is None:
        return list(range(layer.moe_config.num_experts))
    mine = (emap >= 0).nonzero().flatten()
    return mine[emap[mine].argsort()].tolist()


class RunnerLayer:
    """One scenario layer as a vLLM model calls its MoE block: ``x_TH -> [T, H]``."""

    def __init__(self, runner, sc, sequence_parallel: bool):
        self.runner, self.sc, self.sequence_parallel = runner, sc, sequence_parallel
        # The pending reduce the runner itself will do (the harness logs it, never acts on it).
        self.reduce_pending = not self.output_is_reduced()

    def output_is_reduced(self) -> bool:
        return self.runner._fused_output_is_reduced

    def topk_indices_dtype(self):
        return self.runner.routed_experts.quant_method.topk_indices_dtype

    def moe(self, x_th, logits_tk):
        """The MoE layer on this rank's rows: ``[t, H]`` and their ``[t, 2K]`` logits -> ``[t, H]``."""
        return self.runner.forward(x_th, logits_tk)

    def __call__(self, x_TH, w_TK, ids_TK):
        from vllm.distributed import tensor_model_parallel_all_gather
        from vllm.model_executor.models.utils import sequence_parallel_chunk

        T = x_TH.size(0)
        x, logits = x_TH.clone(), routing_logits(ids_TK, w_TK)
        if self.sequence_parallel:
            x, logits = sequence_parallel_chunk(x), sequence_parallel_chunk(logits)
        out = self.moe(x, logits)
        if self.sequence_parallel:
            out = tensor_model_parallel_all_gather(out.contiguous(), 0)[:T]
        return out
