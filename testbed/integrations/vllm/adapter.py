"""vLLM behind the integration seam: the installed vLLM's own FlashInfer all-to-all code,
driven as vLLM's layer drives it, on the pool's ranks and the fake (or real) FlashInfer.

Per rank and scenario:

- vLLM's parallel state on the pool's world (``init_distributed_environment`` finds
  ``torch.distributed`` up and keeps it; ``initialize_model_parallel`` builds vLLM's TP, PP,
  DP and EP groups, whose rank order is the layout's), under a ``VllmConfig`` of the
  scenario's layout and ``all2all_backend``;
- the EP group's ``all2all_manager`` is the FlashInfer manager vLLM's ``CudaCommunicator``
  builds for that backend (the CPU communicator always builds ``AgRsAll2AllManager``);
- each layer's prepare/finalize comes from vLLM's own builder (``maybe_make_prepare_finalize``:
  dispatch format and extra bytes from the layer's ``FusedMoEQuantConfig``), with
  ``scheduler_config.max_num_batched_tokens`` the layer's budget, and runs in vLLM's
  ``FusedMoEKernel`` with ``TestbedExperts`` (vLLM's modular experts interface over the
  testbed's experts, a class defined on first use: its base is vLLM's);
- each forward pass runs under vLLM's ``set_forward_context`` (its DP token-count exchange
  and DP metadata) and every layer of the pass in it, with no collective between layers,
  as in vLLM; the final TP all-reduce is decided by vLLM's own
  ``MoERunner._maybe_reduce_final_output``.

It stops below vLLM's ``FusedMoE`` module: that layer's construction needs a model config,
quantization method and weight loading, and its forward goes through ``torch.ops.vllm``
custom ops and the CUDA-graph-aware runner; the parts of it that decide what the all-to-all
sees (the prepare/finalize choice, the kernel, the reduce) are vLLM's own code above.

The CPU glue and the engine's description live in :mod:`.environment`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import fields, replace
from types import SimpleNamespace

import torch

from testbed import patch
from testbed.integrations import engine as support
from testbed.integrations.base import adapter_setup
from testbed.integrations.vllm import kernels
from testbed.integrations.vllm.environment import (
    BACKENDS,
    config_without_triton,
    fallback_warning_undone,
    destroy_parallel_state,
    gpu_buffers,
    moe_factory,
    prepare_environment,
    stub_accelerator,
)
from testbed.integrations.vllm.experts import experts_class
from testbed.integrations.vllm.layer import build_runner
from testbed.integrations.vllm.rules import executor_launch
from testbed.scenario.reference import ACT_DTYPE

# vLLM's CudaCommunicator (device_communicators/cuda_communicator.py) -> the manager it builds.
MANAGERS = {"flashinfer_nvlink_one_sided": "FlashInferNVLinkOneSidedManager",
            "flashinfer_nvlink_two_sided": "FlashInferNVLinkTwoSidedManager"}


def cuda_manager(backend: str, cpu_group):
    """The all-to-all manager vLLM's CUDA communicator builds for FlashInfer ``backend`` on the
    group ``cpu_group``, which vLLM's CPU communicator replaces (with ``AgRsAll2AllManager``,
    whose dispatch raises on a CPU); None for a backend that is not FlashInfer's."""
    if backend not in MANAGERS:
        return None
    from vllm.distributed.device_communicators import all2all

    return getattr(all2all, MANAGERS[backend])(cpu_group)


class VllmSession:
    def __init__(self, ctx, sc, api, log):
        prepare_environment()
        from vllm.config import ParallelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config
        from vllm.distributed import parallel_state as ps

        import vllm

        self.ctx, self.sc, self.log = ctx, sc, log
        lay = sc.layout
        with adapter_setup(f"standing up vLLM {vllm.__version__}'s CPU platform and workspace manager"):
            stub_accelerator(ctx)
            gpu_buffers(ctx)
            config_without_triton(ctx)
        support.name_the_fake(ctx, sc)
        _forget_probes()
        # Before 0.33 the managers' module binds FlashInfer's classes at import, under its probes.
        from vllm.distributed.device_communicators import all2all

        for name, value in support.guarded_flashinfer_imports(all2all).items():
            ctx.add_cleanup(patch.attribute(all2all, name, value))
        # vLLM's external_launcher reads the launcher's variables (its DP rank from RANK).
        ctx.add_cleanup(patch.environment({"RANK": str(ctx.rank), "LOCAL_RANK": str(ctx.rank),
                                           "WORLD_SIZE": str(ctx.world_size)}))
        budget = sc.stages[0][0].max_num_tokens  # one for every layer (the model refuses others)
        launch = executor_launch(lay, ctx.rank)
        with adapter_setup(f"building vLLM {vllm.__version__}'s VllmConfig for {lay}"):
            parallel = ParallelConfig(tensor_parallel_size=lay.tp, pipeline_parallel_size=lay.pp,
                                      data_parallel_size=lay.dp, enable_expert_parallel=True,
                                      all2all_backend=_backend(sc), **launch.config)
            scheduler = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=budget, max_model_len=budget,
                                        is_encoder_decoder=False)
            self.config = VllmConfig(parallel_config=parallel, scheduler_config=scheduler)
        entered = set_current_vllm_config(self.config)
        entered.__enter__()
        ctx.add_cleanup(lambda: entered.__exit__(None, None, None))
        fallback_warning_undone()  # the FlashInfer manager is put back below
        ps.init_distributed_environment(world_size=launch.world_size, rank=launch.rank, local_rank=launch.rank,
                                        backend="gloo", timeout=ctx.pg_timeout)
        ctx.add_cleanup(destroy_parallel_state)
        ps.initialize_model_parallel(tensor_model_parallel_size=lay.tp, pipeline_model_parallel_size=lay.pp,
                                     backend="gloo")
        ep = ps.get_ep_group()
        if tuple(ep.ranks) != tuple(ctx.group_ranks["ep"]):
            raise RuntimeError(f"vLLM's EP group {ep.ranks} is not the layout's {ctx.group_ranks['ep']}")
        self.ep = ep
        if type(ep.device_communicator.all2all_manager).__name__ != MANAGERS[_backend(sc)]:
            ep.device_communicator.all2all_manager = cuda_manager(_backend(sc), ep.cpu_group)
        self.manager = ep.device_communicator.all2all_manager
        ctx.add_cleanup(self.manager.cleanup)
        kernels.install(ctx.add_cleanup)

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts):
        if self.sc.level == "layer":
            return _layer_builder()(self, index, fmt, experts)
        return self._build_kernel(index, fmt, max_num_tokens, experts)

    def _build_kernel(self, index: int, fmt: str, max_num_tokens: int, experts):
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe.all2all_utils import maybe_make_prepare_finalize
        from vllm.model_executor.layers.fused_moe.config import (
            FusedMoEConfig,
            FusedMoEParallelConfig,
            RoutingMethodType,
        )
        from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel

        sc, lay = self.sc, self.sc.layout
        parallel = FusedMoEParallelConfig.make(tp_size_=lay.tp, pcp_size_=1, dp_size_=lay.dp, sp_size_=1,
                                               vllm_parallel_config=self.config.parallel_config)
        own = experts.own
        # 0.24 on: intermediate_size; before, the per-partition size (TP 1 here: the same).
        size = "intermediate_size" if "intermediate_size" in {f.name for f in fields(FusedMoEConfig)} \
            else "intermediate_size_per_partition"
        moe = FusedMoEConfig(num_experts=sc.experts, experts_per_token=sc.top_k, hidden_dim=sc.hidden,
                             **{size: sc.hidden}, num_local_experts=len(own), num_logical_experts=sc.experts,
                             activation=MoEActivation.SILU, device="cpu", routing_method=RoutingMethodType.Renormalize,
                             moe_parallel_config=parallel, in_dtype=ACT_DTYPE, max_num_tokens=max_num_tokens)
        quant = quant_config(fmt, sc.mx_alignment)
        with set_current_vllm_config(self.config):
            pf = maybe_make_prepare_finalize(moe, quant, allow_new_interface=True)
        if pf is None:
            raise RuntimeError(f"vLLM built no prepare/finalize for all2all_backend {_backend(sc)!r} at {lay}")
        kernel = FusedMoEKernel(pf, experts_class(experts)(moe, quant))
        return KernelLayer(kernel, moe, sc, len(own))

    @contextlib.contextmanager
    def forward_pass(self, num_tokens: int):
        from vllm.forward_context import get_forward_context, set_forward_context

        # Between the MoE layers of one forward nothing orders the ranks, as in vLLM.
        support.model_between_forwards(self.ctx, self.log)
        with set_forward_context(None, self.config, num_tokens=num_tokens):
            dp = get_forward_context().dp_metadata
            # The layer level's runner enters the sequence-parallel sizes itself.
            kernel = self.sc.level == "kernel" and dp is not None
            with dp.sp_local_sizes(1) if kernel else contextlib.nullcontext():
                yield

    def layer_call(self, num_tokens: int):
        return contextlib.nullcontext()


def _layer_builder():
    """How this release's MoE layer is built (the one place its form is decided, by a probe):
    through its factory (0.24 on, :mod:`.layer`) or as its module class (0.18 .. 0.23,
    :mod:`.moe_class`)."""
    if moe_factory() is not None:
        return build_runner
    from testbed.integrations.vllm.moe_class import build_layer

    return build_layer


def _forget_probes() -> None:
    """vLLM caches its FlashInfer capability probes per process (functools.cache); a rank
    runs scenarios of several releases, so each scenario probes its own."""
    import vllm.utils.flashinfer as probes

    for value in list(vars(probes).values()):
        if isinstance(value, functools._lru_cache_wrapper):
            value.cache_clear()


def _backend(sc) -> str:
    return BACKENDS[sc.path]


def quant_config(fmt: str, mx_alignment: int):
    """vLLM's ``FusedMoEQuantConfig`` of a layer's activation format."""
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG, FusedMoEQuantConfig

    if fmt == "bf16":
        return FUSED_MOE_UNQUANTIZED_CONFIG
    if fmt == "mxfp8":
        # is_scale_swizzled from 0.21; before, its nvfp4-only predecessor, which mxfp8 ignores.
        swizzle = {"is_scale_swizzled": False} if "is_scale_swizzled" in inspect.signature(
            FusedMoEQuantConfig.make).parameters else {}
        return replace(FusedMoEQuantConfig.make(quant_dtype="mxfp8", **swizzle), mx_alignment=mx_alignment)
    raise ValueError(f"--integration vllm has no quant config for {fmt!r}")


class KernelLayer:
    """A layer one level down (``--level kernel``): vLLM's ``FusedMoEKernel.apply`` fed the
    testbed's routing as the router left it, then vLLM's own final-reduce decision."""

    sequence_parallel = False

    def __init__(self, kernel, moe, sc, local_experts: int):
        self.kernel, self.moe, self.sc = kernel, moe, sc
        # Only the shapes are read (moe_problem_size); the testbed's experts hold the weights.
        self.w1 = torch.empty(local_experts, 2 * sc.hidden, sc.hidden, device="meta")
        self.w2 = torch.empty(local_experts, sc.hidden, sc.hidden, device="meta")
        self.reduce_pending = not kernel.output_is_reduced()

    def output_is_reduced(self) -> bool:
        return self.kernel.output_is_reduced()

    def topk_indices_dtype(self):
        return self.kernel.prepare_finalize.topk_indices_dtype()

    def __call__(self, x_TH, w_TK, ids_TK):
        from vllm.model_executor.layers.fused_moe.activation import MoEActivation
        from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

        out = self.kernel.apply(x_TH.clone(), self.w1, self.w2, w_TK, ids_TK, MoEActivation.SILU,
                                self.sc.experts, None, self.sc.router_weight_on_input)
        runner = SimpleNamespace(moe_config=self.moe, _fused_output_is_reduced=self.kernel.output_is_reduced())
        return MoERunner._maybe_reduce_final_output(runner, out, None)
