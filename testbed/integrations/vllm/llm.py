"""vLLM's own engine on a rank: ``LLM(...)`` with the external launcher, generating from a
tiny checkpoint the testbed wrote (:mod:`testbed.scenario.checkpoint`), every MoE layer's
all-to-all on the fake FlashInfer.

What the testbed puts around vLLM's engine, and why:

- the compiled ops its CPU loop calls (:mod:`.engine_kernels`) and
  ``compilation_config.custom_ops=["none"]`` (vLLM's torch versions of its custom ops);
- where the release runs x86 CPUs only on its Triton-based model runner (0.34; triton-cpu has
  no wheel), the runner it runs on CPUs without Triton, with its compiled ops
  (:mod:`.runner_kernels`);
- the expert-parallel all-to-all manager vLLM's CUDA communicator builds for the backend
  (the CPU communicator always builds ``AgRsAll2AllManager``, whose dispatch raises on a CPU);
- experts that compute with the layer's loaded weights and honour ``expert_map`` in place
  of vLLM's CPU experts (they need compiled ops its CUDA wheel lacks, and ignore
  ``expert_map`` under expert parallel: VLLM-007);
- the events the invariants read: a layer built once its quant method processed the loaded
  weights (which builds its all-to-all), and each MoE layer call of each engine forward;
- a record of what reached each prepare: per layer and forward, this rank's rows and the
  DP rank token counts vLLM's forward context gave it.
"""

from __future__ import annotations

import functools
import importlib
import logging

from testbed import patch
from testbed.integrations import engine as support
from testbed.integrations.vllm.adapter import cuda_manager
from testbed.integrations.vllm.environment import (
    BACKENDS,
    config_without_triton,
    fallback_warning_undone,
    destroy_parallel_state,
    engine_arguments,
    prepare_environment,
    stub_accelerator,
)
from testbed.scenario.events import ForwardEnd, ForwardStart, LayerBuilt

PREPARES = {"one_sided": ("flashinfer_nvlink_one_sided", "FlashInferNVLinkOneSidedPrepareAndFinalize"),
            "two_sided": ("flashinfer_nvlink_two_sided", "FlashInferNVLinkTwoSidedPrepareAndFinalize")}
def run_engine(ctx, sc, es, model_dir: str, log, reference: bool = False) -> dict:
    """This rank's ``LLM`` on ``model_dir``, deployed as ``es`` (``reference``: one rank, expert
    parallel off, every DP rank's prompts), generating greedily with prompt logprobs.

    Returns ``{"logprobs": [per prompt: each token's logprob after the first], "tokens": [per
    prompt: the generated ids], "prepares": [(layer, rows, DP token counts)] in call order,
    "generate_from": the first of them in generate (those before ran while the engine was built)}``.
    """
    prepare_environment()
    dp_rank = ctx.rank // es.tp
    ctx.add_cleanup(patch.environment({
        "RANK": str(ctx.rank), "LOCAL_RANK": str(ctx.rank), "WORLD_SIZE": str(ctx.world_size),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}))
    stub_accelerator(ctx)
    _quiet(ctx)
    support.name_the_fake(ctx, sc)
    from testbed.integrations.vllm import engine_kernels

    engine_kernels.register()
    _standalone_cpu_runner(ctx)
    prepares: list = []
    if not reference:
        _use_flashinfer_manager(ctx, es.path)
        record_prepares(ctx, es.path, prepares)
    use_weight_experts(ctx)
    log_layers(ctx, log)
    from vllm import LLM, SamplingParams

    # Before the engine: a build that raises half-way has left vLLM's groups up.
    ctx.add_cleanup(destroy_parallel_state)
    llm = LLM(model=model_dir, skip_tokenizer_init=True, distributed_executor_backend="external_launcher",
              **engine_arguments(es, reference))
    shutdown = functools.cache(llm.llm_engine.engine_core.shutdown)  # once, here or at clean-up
    ctx.add_cleanup(shutdown)
    built = len(prepares)
    if reference:
        prompts = tuple(p for d in range(es.dp) for p in es.prompt_ids(d))
        max_tokens = 1
    else:
        prompts, max_tokens = es.prompt_ids(dp_rank), es.max_tokens[dp_rank]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, prompt_logprobs=0)
    # A DP rank without prompts still steps the engine: its peers' forwards need its dummy batches.
    outs = llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
    # As a launched script ends: the engine's own shutdown (its gc.collect, its teardown of the
    # world it was given) within the run's time limit, not the rank's clean-up's few seconds.
    shutdown()
    logprobs = [[entry[token].logprob for token, entry in zip(prompt[1:], out.prompt_logprobs[1:])]
                for prompt, out in zip(prompts, outs)]
    return {"logprobs": logprobs, "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "prepares": prepares, "generate_from": built}


def _standalone_cpu_runner(ctx) -> None:
    """Where the release runs x86 CPUs on its Triton-based model runner (0.34: ``CpuPlatform.
    check_and_update_config`` refuses an x86 CPU without Triton, and triton-cpu has no wheel),
    vLLM's runner for CPUs without Triton (``StandaloneCPUModelRunner``, what it runs on other
    CPU architectures) instead, its config built past that refusal (``config_without_triton``)."""
    from vllm.platforms import cpu

    platform = cpu.CpuPlatform
    if "uses_standalone_cpu_model_runner" not in vars(platform):
        return
    from testbed.integrations.vllm import runner_kernels

    runner_kernels.register()
    config_without_triton(ctx)
    ctx.add_cleanup(patch.attribute(platform, "uses_standalone_cpu_model_runner", classmethod(lambda cls: True)))


def _quiet(ctx) -> None:
    """vLLM's engine logs its start-up at INFO and, without a tokenizer, a chat-template
    traceback at WARNING on every rank; its errors are what a run's report needs."""
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    ctx.add_cleanup(lambda: logger.setLevel(level))


def _use_flashinfer_manager(ctx, path: str) -> None:
    from vllm.distributed.device_communicators import cpu_communicator

    backend = BACKENDS[path]
    original = cpu_communicator.CpuCommunicator.__init__
    fallback_warning_undone()  # the FlashInfer manager is put back in init

    def init(self, *a, **k):
        original(self, *a, **k)
        if self.use_all2all and self.all2all_backend == backend:
            self.all2all_manager = cuda_manager(backend, self.cpu_group)

    ctx.add_cleanup(patch.attribute(cpu_communicator.CpuCommunicator, "__init__", init))


def record_prepares(ctx, path: str, prepares: list) -> None:
    module_name, cls_name = PREPARES[path]
    module = importlib.import_module(f"vllm.model_executor.layers.fused_moe.prepare_finalize.{module_name}")
    cls = getattr(module, cls_name)
    original = cls.prepare
    layers: dict[int, int] = {}

    def prepare(self, a1, *a, **k):
        from vllm.forward_context import get_forward_context

        dp = get_forward_context().dp_metadata
        counts = tuple(dp.num_tokens_across_dp_cpu.tolist()) if dp is not None else None
        prepares.append((layers.setdefault(id(self), len(layers)), int(a1.shape[0]), counts))
        return original(self, a1, *a, **k)

    ctx.add_cleanup(patch.attribute(cls, "prepare", prepare))


def use_weight_experts(ctx) -> None:
    import vllm.model_executor.layers.fused_moe.oracle.unquantized as oracle

    from testbed.integrations.vllm.experts import weight_experts_class

    resolve, cls = oracle.backend_to_kernel_cls, weight_experts_class()
    ctx.add_cleanup(patch.attribute(oracle, "backend_to_kernel_cls",
                                    lambda b: [cls] if b == oracle.UnquantizedMoeBackend.CPU else resolve(b)))


def log_layers(ctx, log) -> None:
    """A layer is built when its quant method has processed the loaded weights (that builds
    its modular kernel and all-to-all); each MoE layer call is logged with what the runner
    says of its output, numbered by the engine forward it belongs to."""
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.models.utils import extract_layer_index

    process, forward = UnquantizedFusedMoEMethod.process_weights_after_loading, MoERunner.forward
    calls: dict[int, int] = {}

    def processed(self, layer):
        process(self, layer)
        log.write(LayerBuilt(layer=extract_layer_index(layer.layer_name)))

    def forward_logged(self, hidden_states, router_logits, *a, **k):
        i = extract_layer_index(self.layer_name)
        p = calls[i] = calls.get(i, -1) + 1
        reduced = bool(self._fused_output_is_reduced)
        log.write(ForwardStart(pass_index=p, layer=i, reduced=reduced, pending=not reduced,
                               sp=bool(self.moe_config.is_sequence_parallel)))
        out = forward(self, hidden_states, router_logits, *a, **k)
        log.write(ForwardEnd(pass_index=p, layer=i))
        return out

    ctx.add_cleanup(patch.attribute(UnquantizedFusedMoEMethod, "process_weights_after_loading", processed))
    ctx.add_cleanup(patch.attribute(MoERunner, "forward", forward_logged))
