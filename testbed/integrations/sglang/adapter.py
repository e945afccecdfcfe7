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
SGLang's start-up rules, ``testbed.integrations.sglang.rules.sglang_rule``, and a test compares them with
SGLang's own; of the resolution it runs only the A2A shared-experts fusion pass). With
``--block`` SGLang builds the model family's MoE block, its ``FusedMoE`` included
(:mod:`.blocks`).

The CPU glue and the engine's description live in :mod:`.environment`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import inspect
from types import SimpleNamespace

import torch

from fakes.flashinfer.fused_moe.layouts import deinterleave_128x4
from testbed import patch
from testbed.integrations import engine as support
from testbed.integrations.sglang import shapes
from testbed.integrations.sglang.environment import DISPATCHER, ENGINE, cpu_kernels, prepare_environment, runner_backend
from testbed.scenario.events import Collective
from testbed.scenario.rank import logged_token_counts, quant_config
from testbed.scenario.reference import ACT_DTYPE

CAPACITY_ENV = "SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


def server_arguments(sc, **more) -> dict:
    """SGLang's ``ServerArgs`` of the scenario: TP and EP over a stage's ranks, DP attention
    unless it is Muse Spark's SP, and ``more`` (the model's one dispatch format, where the
    release takes it as an argument)."""
    lay = sc.layout
    stage = lay.tp * lay.dp
    kw = dict(model_path="dummy", device="cpu", tp_size=stage, ep_size=stage, pp_size=lay.pp,
              moe_a2a_backend="flashinfer", moe_runner_backend=runner_backend(sc.invalid_expert_id, sc.expert_output),
              disable_custom_all_reduce=True, **more)  # a CUDA all-reduce; its set-up only warns on the CPU
    if not sc.sp_prefill:
        kw.update(enable_dp_attention=True, dp_size=lay.dp)
    return kw


class SglangSession:
    def __init__(self, ctx, sc, api, log):
        prepare_environment()
        self.ctx, self.sc, self.log = ctx, sc, log
        support.name_the_fake(ctx, sc)
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.layers import dp_attention as dpa
        from sglang.srt.server_args import ServerArgs

        self.ps, self.dpa = ps, dpa
        self.sp_dispatcher = None
        self.counts = None  # this forward's token counts of every DP rank
        self._batch = None  # this forward's ForwardBatch, built on a block's first call
        dispatcher = importlib.import_module(DISPATCHER)
        rebound = support.guarded_flashinfer_imports(dispatcher)
        if not rebound:
            raise RuntimeError(f"{DISPATCHER} has no guarded flashinfer import block (not the layout of SGLang "
                               f"{', '.join(ENGINE.tested)})")
        for name, value in rebound.items():
            ctx.add_cleanup(patch.attribute(dispatcher, name, value))
        shapes.comm_backend_as_on_a_gpu(ctx, dispatcher)
        import flashinfer
        from sglang.srt.layers.quantization import fp4_utils

        if hasattr(flashinfer, "fp4_quantize"):
            ctx.add_cleanup(patch.attribute(fp4_utils, "_flashinfer_fp4_quantize", flashinfer.fp4_quantize))
        cpu_kernels()
        buffers = dpa._DpGatheredBufferWrapper
        saved = {k: v for k, v in vars(buffers).items() if k.startswith("_") and not k.startswith("__")
                 and not callable(v)}
        ctx.add_cleanup(lambda: [setattr(buffers, k, v) for k, v in saved.items()])
        budget = sc.stages[0][0].max_num_tokens  # one capacity for every layer
        ctx.add_cleanup(patch.environment({CAPACITY_ENV: str(budget)}))
        lay = sc.layout
        fmt = sc.stages[0][0].fmt
        shapes.dispatch_format_environment(ctx, fmt)
        server_args = ServerArgs(**server_arguments(sc, **shapes.dispatch_format_argument(fmt)))
        shapes.a2a_startup(server_args, fmt)
        shapes.publish(ctx, server_args, dp_rank=None if sc.sp_prefill else ctx.coords.dp_rank)
        shapes.import_time_format(ctx, dispatcher)
        shapes.cuda_tensors_on_this_device(ctx, dispatcher)
        if sc.block:
            _unbuilt_expert_locations(ctx)
        ctx.add_cleanup(self._teardown)
        ps._MODEL_PARALLEL_GROUP_TIMEOUT = ctx.pg_timeout  # SGLang sets it only where it starts the world
        ps.init_distributed_environment(world_size=lay.world_size, rank=ctx.rank, local_rank=ctx.rank,
                                        backend="gloo")
        shapes.initialize_model_parallel(server_args)
        shapes.initialize_dp_attention(server_args, sc)
        tp = shapes.tp_group()
        if tuple(tp.ranks) != tuple(ctx.group_ranks["ep"]):
            raise RuntimeError(f"SGLang's TP group {tp.ranks} (its dispatcher's EP group) is not the layout's EP "
                               f"group {ctx.group_ranks['ep']}")

    def _teardown(self) -> None:
        """SGLang's groups go; the pool's world stays."""
        ps = self.ps
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        # A group the release's destroy leaves (0.5.9's keeps its attention TP group): a served
        # process builds its groups once; a rank here builds them per scenario.
        for name, group in list(vars(ps).items()):
            if isinstance(group, ps.GroupCoordinator) and name != "_WORLD":
                group.destroy()
                setattr(ps, name, None)
        if ps._WORLD is not None:
            ps._WORLD.destroy()
            ps._WORLD = None
        ps._MODEL_PARALLEL_GROUP_TIMEOUT = None

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts):
        from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
        from sglang.srt.layers.moe.utils import MoeRunnerBackend, speculative_moe_a2a_backend_context

        sc = self.sc
        if sc.block:
            from testbed.integrations.sglang.blocks import FAMILIES, BlockLayer

            return BlockLayer(self, FAMILIES[sc.block], index, _TestbedMethod, experts)
        backend = MoeRunnerBackend(runner_backend(sc.invalid_expert_id, sc.expert_output))
        # The config carries the runner backend from 0.5.23 on; before, the server arguments' does.
        own = {"runner_backend": backend} if "runner_backend" in {f.name for f in dataclasses.fields(MoeRunnerConfig)} \
            else {}
        config = MoeRunnerConfig(num_experts=sc.experts, num_local_experts=len(experts.own), hidden_size=sc.hidden,
                                 top_k=sc.top_k, layer_id=index, params_dtype=ACT_DTYPE, num_fused_shared_experts=0,
                                 **own)
        if sc.sp_prefill:
            if self.sp_dispatcher is None:  # Muse Spark's, from its first MoE layer's config
                from sglang.srt.layers.moe.token_dispatcher.flashinfer import FlashinferDispatcher

                self.sp_dispatcher = FlashinferDispatcher(
                    group=shapes.tp_group().device_group, router_topk=sc.top_k, num_experts=sc.experts,
                    num_local_experts=len(experts.own), hidden_size=sc.hidden, moe_runner_config=config,
                    enable_sp_prefill_a2a=True)
            return SpPrefillLayer(self.sp_dispatcher, experts, sc)
        draft = index >= len(sc.stages[self.ctx.coords.pp_rank]) - sc.draft_layers
        with speculative_moe_a2a_backend_context() if draft else contextlib.nullcontext():
            dispatcher = shapes.create_dispatcher(config)
        if fmt == "nvfp4":  # what ModelOpt's NVFP4 method hands the dispatcher for an nvfp4 dispatch
            dispatcher.set_quant_config({"input_global_scale": quant_config(fmt).a1_gscale})
        return SglangLayer(dispatcher, experts, shapes.moe_ep_size(), sc)

    @contextlib.contextmanager
    def forward_pass(self, num_tokens: int):
        # Under DP attention SGLang's scheduler all-gathers every DP rank's token count before
        # each forward (its MLP sync); that collective also orders every EP rank's forwards.
        if self.sc.sp_prefill:
            from sglang.srt.runtime_context import get_forward

            forward = get_forward()
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
        self.counts = tuple(counts)
        try:
            yield
        finally:
            self.counts = self._batch = None

    def forward_batch(self):
        """SGLang's ``ForwardBatch`` of this DP rank's decode batch in the forward (an idle rank's
        ``IDLE`` batch where it has no token), with the DP ranks' token counts its scheduler
        gathered; one per forward, as the scheduler hands every layer the same."""
        if self._batch is None:
            self._batch = self._build_forward_batch()
        return self._batch

    def _build_forward_batch(self):
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        T = self.counts[self.ctx.coords.dp_rank]
        rows = torch.zeros(T, dtype=torch.int64)
        extra = {"global_num_tokens_cpu": list(self.counts), "num_token_non_padded": torch.tensor(T)}
        fields = {f.name for f in dataclasses.fields(ForwardBatch)}
        return ForwardBatch(forward_mode=ForwardMode.DECODE if T else ForwardMode.IDLE, batch_size=T, input_ids=rows,
                            req_pool_indices=rows.clone(), seq_lens=torch.ones(T, dtype=torch.int32),
                            out_cache_loc=rows.clone(), seq_lens_sum=T,
                            **{k: v for k, v in extra.items() if k in fields})

    def dp_row_start(self) -> int:
        """Where this DP rank's rows start among every DP rank's, gathered in DP-rank order."""
        return sum(self.counts[:self.ctx.coords.dp_rank])

    def gather_dp_rows(self, *tensors):
        """Every DP rank's rows of each tensor, in DP-rank order (the layer boundary's DP gather,
        over the attention DP group: here the EP group, DP attention spanning it)."""
        group, top = self.ctx.groups["ep"], max(self.counts)
        out = []
        for t in tensors:
            self.log.write(Collective("all_gather", tuple(self.ctx.group_ranks["ep"]),
                                      "testbed: SGLang's layer boundary, the DP gather of the FFN's input"))
            padded = torch.zeros((top, *t.shape[1:]), dtype=t.dtype, device=t.device)
            padded[:t.size(0)] = t
            parts = [torch.empty_like(padded) for _ in self.counts]
            torch.distributed.all_gather(parts, padded, group=group)
            out.append(torch.cat([p[:n] for p, n in zip(parts, self.counts)]))
        return out

    def layer_call(self, num_tokens: int):
        return contextlib.nullcontext()


class _UnbuiltExpertLocations:
    """ModelRunner's expert-location metadata, which it builds from the checkpoint's model
    config and the testbed does not: present (a block asks for it before each top-k, 0.5.22's
    DeepSeek among them, and uses it only under an EPLB dispatch algorithm), and failing
    loudly where it is read."""

    def __getattr__(self, name):
        raise RuntimeError(f"SGLang read expert-location metadata ({name}), which the testbed does not build "
                           "(ModelRunner builds it from the checkpoint; EPLB is not driven here)")


def _unbuilt_expert_locations(ctx) -> None:
    from sglang.srt.eplb import expert_location

    if expert_location.get_global_expert_location_metadata() is None:
        expert_location.set_global_expert_location_metadata(_UnbuiltExpertLocations())
        if "allow_overwrite" in inspect.signature(expert_location.set_global_expert_location_metadata).parameters:
            ctx.add_cleanup(lambda: expert_location.set_global_expert_location_metadata(None, allow_overwrite=True))
        else:  # before 0.5.16 a module global, set once per served process
            ctx.add_cleanup(lambda: setattr(expert_location, "_global_expert_location_metadata", None))


class _TestbedMethod(torch.nn.Module):
    """The quant method's ``apply`` as SGLang's FlashInfer runners do it: the experts over the
    received rows, into the combine region when the dispatcher hands one (``moe_output``). A
    module, as SGLang's quant methods are (a block's FusedMoE holds it as one)."""

    def __init__(self, experts):
        super().__init__()
        self.experts = experts

    def apply(self, layer, dispatch_output):
        from sglang.srt.layers.moe.token_dispatcher.flashinfer import FlashinferCombineInput

        d = dispatch_output
        scale = d.hidden_states_scale
        if scale is not None and scale.dim() == 1:
            # The dispatcher interleaved the received nvfp4 scales 128x4 for the flashinfer_cutlass
            # runner (nvfp4_block_scale_interleave), the layout that runner reads.
            rows, cols = d.hidden_states.size(0), 2 * d.hidden_states.size(1) // 16
            scale = deinterleave_128x4(scale.view(torch.uint8), rows, cols)
        received = SimpleNamespace(a1q=d.hidden_states, a1q_scale=scale,
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
        shapes.bind_forward(module, FusedMoE)
        self._forward = module.forward_impl
        self._reduce = shapes.post_experts_reduce() or (lambda out: out)

    def output_is_reduced(self) -> bool:
        return shapes.output_is_complete()

    def topk_indices_dtype(self):
        return None  # SGLang's router hands its own ids; the dispatcher converts them to int32

    def __call__(self, x_TH, w_TK, ids_TK):
        return self._reduce(self._forward(x_TH, _topk(x_TH, w_TK, ids_TK, self.sc)))


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


