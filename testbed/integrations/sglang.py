"""SGLang behind the integration seam: the installed SGLang's own FlashInfer MoE dispatcher
(``sglang/srt/layers/moe/token_dispatcher/flashinfer.py``), built and driven as SGLang's
``FusedMoE`` does, on the pool's ranks and the fake (or real) FlashInfer.

Per rank and scenario:

The two deployments SGLang 0.5.23 starts FlashInfer MoE A2A in (``arg_groups/moe_hook.py``):
DP attention over the whole TP group (the testbed's ``W,1,W,1``), and Muse Spark's prefill
sequence parallelism on TP4/EP4 or TP8/EP8 (``--sp-prefill``). Per rank and scenario:

- SGLang's server configuration of the scenario (``ServerArgs`` with ``moe_a2a_backend=
  "flashinfer"``, TP and EP over the stage's ranks, DP attention, the MoE runner backend, the
  A2A dispatch format), published with ``runtime_context.publish`` and
  ``initialize_moe_config`` as its scheduler does;
- SGLang's own parallel state on the pool's world (``init_distributed_environment`` keeps the
  initialized ``torch.distributed``; ``initialize_model_parallel`` builds its TP group, the
  dispatcher's EP group, which must be the layout's; ``initialize_dp_attention``);
- under DP attention, each layer's dispatcher from SGLang's ``create_moe_dispatcher`` (what
  ``FusedMoE.__init__`` calls): one ``MoeAlltoAll`` per layer at the fixed capacity
  ``SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK`` (the scenario's one budget), their
  workspace shared through FlashInfer's size-keyed cache, the nvfp4 global scale handed over
  as ModelOpt's NVFP4 method does; each layer call is SGLang's ``FusedMoE.forward_impl``
  (dispatch, ``run_moe_core``, combine) on a stand-in module whose quant method runs the
  testbed's experts (into the workspace's combine region where the ``flashinfer_cutlass``
  runner combines from it), then SGLang's own post-experts reduce (``reduce_moe_output``);
- under Muse Spark's SP, one model-wide dispatcher with a decode and an SP-prefill
  ``MoeAlltoAll``, their sizes padded apart (``enable_sp_prefill_a2a``), and every layer's
  prefill as Muse Spark runs it: ``sp_entry_scatter``, dispatch and combine on that
  dispatcher, ``sp_exit_gather`` (its decode runs without the all-to-all);
- each forward publishes SGLang's per-forward state: decode (``set_is_extend_in_batch(False)``)
  and the DP ranks' token counts (``set_dp_buffer_len``), which SGLang's scheduler all-gathers
  (the testbed all-gathers them on the EP group in its place), or SP prefill (extend with
  ``sp_active``).

It stops below ``FusedMoE``'s construction (weights, quant method, CUDA-graph runners) and
above SGLang's server-argument resolution (a dummy model resolves nothing; the model holds
SGLang's start-up rules, ``testbed.scenario.model.sglang_rule``, and a test compares them with
SGLang's own).

CPU glue: a placeholder ``torchvision`` (PyPI's is a CUDA build; two of SGLang's model
configs import it at load, nothing here calls it); SGLang's group timeout set to the
pool's; the flashinfer names SGLang's dispatcher and fp4 quantize bind at import re-read from
the scenario's release (the dispatcher's own guarded imports, re-run: a rank runs scenarios of
several releases); and a CPU kernel for the two SGLang custom ops on the path (its nvfp4
quantize, the TP all-gather), each op's own Python implementation, which SGLang registers for
CUDA only. ``A2A_SGLANG_SOURCE`` puts a checkout's Python first on every rank's path.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

from testbed import patch
from testbed.integrations import Traits
from testbed.integrations import engine_support as support
from testbed.scenario.moe import logged_token_counts, quant_config
from testbed.scenario.reference import ACT_DTYPE

TESTED = ("0.5.23",)  # pins flashinfer-python 0.7.2
SOURCE_ENV = "A2A_SGLANG_SOURCE"
DISPATCHER = "sglang.srt.layers.moe.token_dispatcher.flashinfer"
CAPACITY_ENV = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
# The scenario's sentinel and combine region -> the MoE runner backend SGLang picks them for
# (FlashinferDispatcher.__init__: -1 for the TRT-LLM and DeepGEMM runners, else num_experts;
# payload_in_workspace for flashinfer_cutlass only).
RUNNERS = {("-1", "separate"): "flashinfer_trtllm", ("num_experts", "separate"): "flashinfer_cutedsl",
           ("num_experts", "workspace"): "flashinfer_cutlass"}
# SGLang's custom ops on the adapter's path -> (module, name) of their Python implementation.
CPU_OPS = {"flashinfer_fp4_quantize": ("sglang.srt.layers.quantization.fp4_utils", "_flashinfer_fp4_quantize_impl"),
           "reg_all_gather_into_tensor": ("sglang.srt.distributed.parallel_state", "reg_all_gather_into_tensor")}
CAPABILITIES = (
    ("sglang.srt.server_args", "ServerArgs"),
    ("sglang.srt.runtime_context", "publish"),
    ("sglang.srt.distributed.parallel_state", "init_distributed_environment"),
    ("sglang.srt.distributed.parallel_state", "initialize_model_parallel"),
    ("sglang.srt.distributed.bootstrap", "reset_parallel_initialised"),  # destroy_model_parallel imports it
    ("sglang.srt.layers.moe.utils", "initialize_moe_config"),
    ("sglang.srt.layers.moe.fused_moe_triton.layer", "create_moe_dispatcher"),
    ("sglang.srt.layers.moe.fused_moe_triton.layer", "FusedMoE"),
    (DISPATCHER, "FlashinferDispatcher"),
    ("sglang.srt.layers.dp_attention", "set_dp_buffer_len"),
)


def prepare_environment() -> None:
    """What must hold before SGLang is imported in a process (the fork server's too)."""
    source = os.environ.get(SOURCE_ENV)
    if source and source not in sys.path:
        sys.path.insert(0, source)
    _stand_in_torchvision()


class _Placeholder:
    """Any torchvision name at import time; fails loudly if it is ever used."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name}: the testbed's torchvision placeholder was called (SGLang on a CPU "
                           "torch has no torchvision)")

    def __mro_entries__(self, bases):
        return (object,)


def _stand_in_torchvision() -> None:
    """``sglang.srt.configs`` imports every model config; two import ``torchvision.transforms``
    at load. transformers must go on seeing no torchvision: its availability checks are cached
    before the placeholder exists."""
    if "torchvision" in sys.modules or importlib.util.find_spec("transformers") is None:
        return
    if importlib.util.find_spec("torchvision") is not None:
        return  # a real one (a CUDA torch's machine)
    from transformers.utils import import_utils

    import_utils.is_torchvision_available(), import_utils.is_torchvision_v2_available()
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                 "torchvision.transforms.v2", "torchvision.transforms.v2.functional", "torchvision.io",
                 "torchvision.ops"):
        module = types.ModuleType(name)
        module.__getattr__ = lambda attr, _name=name: _module_attr(_name, attr)
        module.__path__ = []
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        sys.modules[name] = module
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], leaf, module)


def _module_attr(module: str, attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Placeholder(f"{module}.{attr}")


ENGINE = support.Engine("sglang", "SGLang", SOURCE_ENV, "python/ directory", TESTED, CAPABILITIES,
                        prepare_environment)
unavailable, use, preload = ENGINE.unavailable, ENGINE.use, ENGINE.preload


@functools.cache
def code() -> tuple[tuple[str, str], ...]:
    """SGLang's integration code: its MoE layers and dispatchers, Muse Spark's SP entry and
    exit, its distributed layer (none where SGLang is not installed)."""
    prepare_environment()
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        return ()
    root = Path(spec.origin).resolve().parent
    return tuple((str(root / sub), f"sglang/{sub}") for sub in
                 ("srt/layers/moe/", "srt/layers/layernorm_sp.py", "srt/distributed/"))


class SglangIntegration:
    name = "sglang"

    def traits(self, sc) -> Traits:
        # One MoeAlltoAll per layer at one fixed capacity; the size-keyed cache shares their
        # workspace. SGLang never barriers after a build and never passes combine's output=.
        return Traits(shared_communication=False, barrier_after_build=False, code=code(), fixed_capacity=True,
                      combine_output=False)

    def start(self, ctx, sc, api, log) -> "SglangSession":
        return SglangSession(ctx, sc, api, log)


def server_arguments(sc) -> dict:
    """SGLang's ``ServerArgs`` of the scenario: TP and EP over a stage's ranks, DP attention
    unless it is Muse Spark's SP, the model's one dispatch format."""
    lay = sc.layout
    stage = lay.tp * lay.dp
    kw = dict(model_path="dummy", device="cpu", tp_size=stage, ep_size=stage, pp_size=lay.pp,
              moe_a2a_backend="flashinfer", moe_runner_backend=RUNNERS[(sc.invalid_expert_id, sc.expert_output)],
              flashinfer_a2a_dispatch_type=sc.stages[0][0].fmt,
              disable_custom_all_reduce=True)  # a CUDA all-reduce; its set-up only warns on the CPU
    if not sc.sp_prefill:
        kw.update(enable_dp_attention=True, dp_size=lay.dp)
    return kw


@functools.cache
def _cpu_kernels() -> torch.library.Library:
    """Register each of :data:`CPU_OPS` for the CPU with its own implementation (once per
    process; the library object keeps the registrations)."""
    lib = torch.library.Library("sglang", "IMPL")
    for op, (module, name) in CPU_OPS.items():
        lib.impl(op, inspect.unwrap(getattr(importlib.import_module(module), name)), "CPU")
    return lib


def rebind_guarded_imports(module) -> dict:
    """Re-run ``module``'s guarded ``from flashinfer... import`` block under the FlashInfer now
    installed: the names it binds and the flag its ``except ImportError`` sets, as a fresh
    import of the module would have them. Returns ``{name: value}`` to set on the module."""
    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if not isinstance(node, ast.Try):
            continue
        imports = [n for n in node.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("flashinfer")]
        if not imports:
            continue
        flags = [t.id for n in node.handlers for s in n.body if isinstance(s, ast.Assign) for t in s.targets
                 if isinstance(t, ast.Name)]
        found = {}
        try:
            for n in imports:
                source = importlib.import_module(n.module)
                for alias in n.names:
                    try:
                        found[alias.asname or alias.name] = getattr(source, alias.name)
                    except AttributeError:
                        raise ImportError(f"cannot import name {alias.name!r} from {n.module!r}") from None
        except ImportError:
            return {flag: False for flag in flags}
        return {**found, **{flag: True for flag in flags}}
    raise RuntimeError(f"{module.__name__} has no guarded flashinfer import block (not the SGLang {TESTED[0]} layout)")


class SglangSession:
    def __init__(self, ctx, sc, api, log):
        prepare_environment()
        self.ctx, self.sc, self.log = ctx, sc, log
        support.name_the_fake(ctx, sc)
        from sglang.srt import runtime_context as rc
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.layers import dp_attention as dpa
        from sglang.srt.layers.moe.utils import initialize_moe_config
        from sglang.srt.server_args import ServerArgs

        self.ps, self.dpa, self.rc = ps, dpa, rc
        self.sp_dispatcher = None
        dispatcher = importlib.import_module(DISPATCHER)
        for name, value in rebind_guarded_imports(dispatcher).items():
            ctx.add_cleanup(patch.attribute(dispatcher, name, value))
        import flashinfer
        from sglang.srt.layers.quantization import fp4_utils

        if hasattr(flashinfer, "fp4_quantize"):
            ctx.add_cleanup(patch.attribute(fp4_utils, "_flashinfer_fp4_quantize", flashinfer.fp4_quantize))
        _cpu_kernels()
        buffers = dpa._DpGatheredBufferWrapper
        saved = {k: v for k, v in vars(buffers).items() if k.startswith("_") and not k.startswith("__")
                 and not callable(v)}
        ctx.add_cleanup(lambda: [setattr(buffers, k, v) for k, v in saved.items()])
        budget = sc.stages[0][0].max_num_tokens  # one capacity for every layer
        ctx.add_cleanup(patch.environment({CAPACITY_ENV: str(budget)}))
        lay = sc.layout
        ctx.add_cleanup(rc.reset_context)  # last: SGLang's published configuration, flags and forward state
        server_args = ServerArgs(**server_arguments(sc))
        rc.publish(server_args, role="test",
                   ranks=rc.SpawnRanks(world_rank=ctx.rank, dp_rank=None if sc.sp_prefill else ctx.coords.dp_rank))
        initialize_moe_config()
        ctx.add_cleanup(self._teardown)
        ps._MODEL_PARALLEL_GROUP_TIMEOUT = ctx.pg_timeout  # SGLang sets it only where it starts the world
        ps.init_distributed_environment(world_size=lay.world_size, rank=ctx.rank, local_rank=ctx.rank,
                                        backend="gloo")
        ps.initialize_model_parallel(backend="gloo")
        dpa.initialize_dp_attention(server_args)
        tp = rc.get_parallel().tp_group
        if tuple(tp.ranks) != tuple(ctx.group_ranks["ep"]):
            raise RuntimeError(f"SGLang's TP group {tp.ranks} (its dispatcher's EP group) is not the layout's EP "
                               f"group {ctx.group_ranks['ep']}")

    def _teardown(self) -> None:
        """SGLang's groups go; the pool's world stays."""
        ps = self.ps
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if ps._WORLD is not None:
            ps._WORLD.destroy()
            ps._WORLD = None
        ps._MODEL_PARALLEL_GROUP_TIMEOUT = None

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts):
        from sglang.srt.layers.moe.fused_moe_triton.layer import create_moe_dispatcher
        from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
        from sglang.srt.layers.moe.utils import MoeRunnerBackend

        sc = self.sc
        config = MoeRunnerConfig(num_experts=sc.experts, num_local_experts=len(experts.own), hidden_size=sc.hidden,
                                 top_k=sc.top_k, layer_id=index, params_dtype=ACT_DTYPE, num_fused_shared_experts=0,
                                 runner_backend=MoeRunnerBackend(RUNNERS[(sc.invalid_expert_id, sc.expert_output)]))
        if sc.sp_prefill:
            if self.sp_dispatcher is None:  # Muse Spark's, from its first MoE layer's config
                from sglang.srt.layers.moe.token_dispatcher.flashinfer import FlashinferDispatcher

                self.sp_dispatcher = FlashinferDispatcher(
                    group=self.rc.get_parallel().tp_group.device_group, router_topk=sc.top_k, num_experts=sc.experts,
                    num_local_experts=len(experts.own), hidden_size=sc.hidden, moe_runner_config=config,
                    enable_sp_prefill_a2a=True)
            return SpPrefillLayer(self.sp_dispatcher, experts, sc)
        dispatcher = create_moe_dispatcher(config, quant_method=None)
        if fmt == "nvfp4":  # what ModelOpt's NVFP4 method hands the dispatcher for an nvfp4 dispatch
            dispatcher.set_quant_config({"input_global_scale": quant_config(fmt).a1_gscale})
        return SglangLayer(dispatcher, experts, self.rc.get_parallel().moe_ep_size, sc)

    @contextlib.contextmanager
    def forward_pass(self, num_tokens: int):
        # Under DP attention SGLang's scheduler all-gathers every DP rank's token count before
        # each forward (its MLP sync); that collective also orders every EP rank's forwards.
        forward = self.rc.get_forward()
        if self.sc.sp_prefill:
            support.model_between_forwards(self.ctx, self.log)
            self.dpa.set_is_extend_in_batch(True)
            forward.set("sp_active", True)
            try:
                yield
            finally:
                forward.set("sp_active", False)
            return
        counts = logged_token_counts(self.ctx, self.log, num_tokens, "testbed: SGLang's scheduler token-count all-gather")
        self.dpa.set_is_extend_in_batch(False)  # decode: the all-to-all (extend all-gathers)
        self.dpa.set_dp_buffer_len(sum(counts), num_tokens, False, global_num_tokens=list(counts))
        yield

    def layer_call(self, num_tokens: int):
        return contextlib.nullcontext()


class _TestbedMethod:
    """The quant method's ``apply`` as SGLang's FlashInfer runners do it: the experts over the
    received rows, into the combine region when the dispatcher hands one (``moe_output``)."""

    def __init__(self, experts):
        self.experts = experts

    def apply(self, layer, dispatch_output):
        from sglang.srt.layers.moe.token_dispatcher.flashinfer import FlashinferCombineInput

        d = dispatch_output
        received = SimpleNamespace(a1q=d.hidden_states, a1q_scale=d.hidden_states_scale,
                                   topk_ids=d.topk_output.topk_ids.long(), topk_weights=d.topk_output.topk_weights)
        return FlashinferCombineInput(hidden_states=self.experts(received, output=d.moe_output))


class SglangLayer:
    """An MoE layer as SGLang's ``FusedMoE.forward_impl`` runs it, on a stand-in module with
    the dispatcher SGLang built and the testbed's experts as its quant method, then the MoE
    block's post-experts reduce as SGLang decides it (``reduce_moe_output``)."""

    sequence_parallel = False
    reduce_pending = False

    def __init__(self, dispatcher, experts, moe_ep_size: int, sc):
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

        self.sc = sc
        # FusedMoE's default: the MoE models SGLang serves with FlashInfer A2A leave the
        # post-experts sum to the MoE block (reduce_moe_output).
        module = SimpleNamespace(dispatcher=dispatcher, quant_method=_TestbedMethod(experts), reduce_results=False,
                                 moe_tp_size=1, moe_ep_size=moe_ep_size, _dwdp_bound=False)
        module._dispatch_with_pre_quant = types.MethodType(FusedMoE._dispatch_with_pre_quant, module)
        module.run_moe_core = types.MethodType(FusedMoE.run_moe_core, module)
        self._forward = types.MethodType(FusedMoE.forward_impl, module)

    def output_is_reduced(self) -> bool:
        from sglang.srt.layers.moe.utils import post_experts_output_is_complete

        return post_experts_output_is_complete(is_tp_path=True)

    def topk_indices_dtype(self):
        return None  # SGLang's router hands its own ids; the dispatcher converts them to int32

    def __call__(self, x_TH, w_TK, ids_TK):
        from sglang.srt.layers.moe.utils import reduce_moe_output

        return reduce_moe_output(self._forward(x_TH, _topk(x_TH, w_TK, ids_TK, self.sc)))


class SpPrefillLayer(SglangLayer):
    """A Muse Spark MoE layer's sequence-parallel prefill (``MuseSpark1xMoE`` under
    ``sp_active``): this rank's slice of the rows (``sp_entry_scatter``), dispatched and
    combined on the model-wide SP dispatcher, gathered back (``sp_exit_gather``)."""

    def __init__(self, dispatcher, experts, sc):
        self.sc, self.dispatcher, self.method = sc, dispatcher, _TestbedMethod(experts)

    def __call__(self, x_TH, w_TK, ids_TK):
        from sglang.srt.layers.layernorm_sp import sp_entry_scatter, sp_exit_gather

        x_tH, w_tK, ids_tK = (sp_entry_scatter(t) for t in (x_TH, w_TK, ids_TK))  # the router runs on the slice
        received = self.dispatcher.dispatch(x_tH, _topk(x_tH, w_tK, ids_tK, self.sc))
        return sp_exit_gather(self.dispatcher.combine(self.method.apply(None, received)), x_TH.size(0))


def _topk(x_TH, w_TK, ids_TK, sc):
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    return StandardTopKOutput(topk_weights=w_TK, topk_ids=ids_TK,
                              router_logits=torch.zeros(x_TH.size(0), sc.experts, dtype=torch.float32))


SGLANG = SglangIntegration()
