"""vLLM as an engine the testbed installs, probes and imports, and the glue a CPU process needs to run it.

CPU glue (what vLLM needs that a CPU torch lacks): ``VLLM_TARGET_DEVICE=cpu``,
``VLLM_HAS_FLASHINFER_CUBIN=1`` (else ``has_flashinfer()`` wants nvcc), and no-op
``torch.accelerator.current_device_index / synchronize / empty_cache``, which vLLM's one-sided
manager calls. ``A2A_VLLM_SOURCE`` puts a checkout's Python first on
every rank's path, so a pull-request branch is what runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import os
import sys
from pathlib import Path

import torch

from testbed import patch
from testbed.integrations import engine as support
from testbed.integrations.vllm.consumer import CONSUMER

# Tested with vLLM 0.33.0 (which pins flashinfer-python 0.7.2.post1).
TESTED = ("0.33.0",)
SOURCE_ENV = "A2A_VLLM_SOURCE"
# The scenario's path -> vLLM's all2all_backend.
BACKENDS = {"one_sided": "flashinfer_nvlink_one_sided", "two_sided": "flashinfer_nvlink_two_sided"}


# The capabilities the adapter reaches for, as (module, name): a vLLM lacking one is named.
CAPABILITIES = (
    ("vllm.distributed.parallel_state", "init_distributed_environment"),
    ("vllm.distributed.parallel_state", "initialize_model_parallel"),
    ("vllm.distributed.device_communicators.all2all", "FlashInferNVLinkOneSidedManager"),
    ("vllm.distributed.device_communicators.all2all", "FlashInferNVLinkTwoSidedManager"),
    ("vllm.model_executor.layers.fused_moe.all2all_utils", "maybe_make_prepare_finalize"),
    ("vllm.model_executor.layers.fused_moe.modular_kernel", "FusedMoEKernel"),
    ("vllm.model_executor.layers.fused_moe.modular_kernel", "FusedMoEExpertsModular"),
    ("vllm.model_executor.layers.fused_moe.runner.moe_runner", "MoERunner"),
    ("vllm.forward_context", "set_forward_context"),
)
LAYER_MODULE = "vllm.model_executor.layers.fused_moe.layer"
FACTORIES = ("FusedMoEFactory", "FusedMoE")


def moe_factory():
    """vLLM's factory of its MoE layer, a function returning a ``MoERunner`` (its quant method,
    weights and runner), which the layer level builds through: ``FusedMoEFactory`` (0.27 on),
    or ``FusedMoE`` where that is the function (0.24 .. 0.26); None where the release has
    neither (its ``FusedMoE`` is a class: :func:`moe_class`)."""
    layer = importlib.import_module(LAYER_MODULE)
    return next((f for f in (getattr(layer, name, None) for name in FACTORIES) if inspect.isfunction(f)), None)


def moe_class():
    """vLLM's MoE layer where it is a module class owning its quant method, weights and runner
    (``FusedMoE``, a ``CustomOp`` in 0.18/0.19 and a ``PluggableLayer`` in 0.20 .. 0.23), built
    as that release's models build it; None where the release builds it through a factory."""
    if moe_factory() is not None:
        return None
    found = getattr(importlib.import_module(LAYER_MODULE), "FusedMoE", None)
    return found if inspect.isclass(found) and issubclass(found, torch.nn.Module) else None


# What the layer level hands the factory or class beyond the shape (.layer, .moe_class);
# apply_routed_scale_to_output only where the release takes it (0.18/0.19 scale in the router).
LAYER_ARGUMENTS = ("params_dtype", "renormalize", "quant_config", "prefix", "custom_routing_function",
                   "routed_scaling_factor", "apply_router_weight_on_input", "is_sequence_parallel")


def lacks_moe_layer() -> str | None:
    """The capability probe of the MoE layer the layer level builds: :func:`moe_factory`, or
    where there is none :func:`moe_class`, taking what the layer level hands it."""
    built = moe_factory() or moe_class()
    if built is None:
        return (f"has no MoE layer ({LAYER_MODULE}.FusedMoEFactory, a FusedMoE function returning a MoERunner, "
                "or a FusedMoE module class)")
    params = inspect.signature(built).parameters
    missing = [name for name in LAYER_ARGUMENTS + (() if moe_class() else ("shared_experts",)) if name not in params]
    if missing:
        return f"has a MoE layer {LAYER_MODULE}.{built.__name__} without {', '.join(missing)}"
    return None


def prepare_environment() -> None:
    """What must hold before vLLM is imported in a process (the fork server's too)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_HAS_FLASHINFER_CUBIN", "1")
    source = support.source_first(SOURCE_ENV)
    if source:
        # vLLM caches what it inspects of a model class in one file per class, keyed by the
        # module's hash: releases sharing a cache root evict each other's, and each miss costs
        # a subprocess importing vLLM (about 10 s here).
        tag = hashlib.sha1(os.path.realpath(source).encode()).hexdigest()[:12]
        os.environ.setdefault("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "vllm" / "sources" / tag))
    if importlib.util.find_spec("vllm") is not None:
        cpu_platform_by_target()


def cpu_platform_by_target() -> None:
    """vLLM's platform resolves to its CPU platform here, as ``VLLM_TARGET_DEVICE=cpu`` asks.

    From 0.28 vLLM's ``cpu_platform_plugin`` reads that variable; before, it takes the CPU
    platform only for a CPU build (a version such as ``0.22.0+cpu``) or macOS, and a wheel's
    Python fails with "Failed to infer device type". Where the release's plugin does not read
    the variable (a probe of its source, not a version), its version check answers as a CPU
    build's does."""
    try:
        platforms = importlib.import_module("vllm.platforms")
    except ImportError:  # not a vLLM this adapter can run: the capability probes say so
        return
    if getattr(platforms, "_testbed_probed", False):  # decided once per process: every rank set-up asks
        return
    platforms._testbed_probed = True
    plugin = getattr(platforms, "cpu_platform_plugin", None)
    check = getattr(platforms, "vllm_version_matches_substr", None)
    if plugin is None or check is None or "VLLM_TARGET_DEVICE" in inspect.getsource(plugin):
        return

    def vllm_version_matches_substr(substr: str) -> bool:
        return (substr == "cpu" and os.environ.get("VLLM_TARGET_DEVICE") == "cpu") or check(substr)

    platforms.vllm_version_matches_substr = vllm_version_matches_substr
    # Importing vllm resolves the platform once already (to none): resolved again on next use.
    if "_current_platform" in vars(platforms):
        platforms._current_platform = None


# The generations of vLLM's FlashInfer path the sweeps sample, one release each: 0.24.0 (0.22 ..
# 0.25: the prepare/finalize calls MoeAlltoAll's combine itself, without output=; 0.24's oracle
# without Triton mxfp8), 0.31.0 (its one-sided manager drives MoeAlltoAll itself through
# combine_into, sequence parallel; 0.26 .. 0.32 alike), 0.33.0 (installed: one-sided on moe_ep,
# two-sided on MnnvlMoe), 0.34.0 (both on moe_ep, the experts writing into FlashInfer's
# combine-input buffer, PP only under the mp executor, the standalone CPU runner).
# A tiny checkpoint's engine, as the engine level builds LLM and a served run starts vllm serve.
MAX_NUM_SEQS = 8
KV_CACHE_BYTES = 16 << 20  # a tiny checkpoint's few sequences need a few hundred kB of it


def engine_arguments(es, reference: bool, dp: bool = True) -> dict:
    """vLLM's engine arguments for ``es`` (:class:`testbed.scenario.engine.EngineScenario`), as
    the engine level builds ``LLM``, a served run starts ``vllm serve`` and an offline DP rank
    builds ``LLM``: eager, vLLM's torch versions of its custom ops, the scheduler's budget every
    MoE layer's max tokens, a few MB of KV cache; the deployment's parallel and all-to-all
    (``reference``: DP 1, expert parallel off; ``dp=False``: the data parallel left to the
    process's ``VLLM_DP_*``, as offline DP gives it)."""
    args = dict(dtype=es.dtype, enforce_eager=True, max_model_len=es.max_model_len, max_num_batched_tokens=es.budget,
                max_num_seqs=MAX_NUM_SEQS, seed=es.seed, kv_cache_memory_bytes=KV_CACHE_BYTES,
                compilation_config={"custom_ops": ["none"]})
    if reference:
        return args
    return args | ({"data_parallel_size": es.dp} if dp else {}) | dict(
        tensor_parallel_size=es.tp, enable_expert_parallel=True, all2all_backend=BACKENDS[es.path])


def served_command(es, model_dir: str, port: int, reference: bool) -> list[str]:
    """``vllm serve`` of ``es`` on the loopback address, with :func:`engine_arguments` as its flags."""
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "tiny"]
    for name, value in engine_arguments(es, reference).items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def offline_command(es, model_dir: str, run_dir: str) -> list[str]:
    """vLLM's offline data parallel of ``es`` as its documentation shows it
    (:mod:`.offline`): a process per DP rank, each an ``LLM`` of :func:`engine_arguments`."""
    return [sys.executable, "-m", "testbed.integrations.vllm.offline", run_dir, model_dir, str(es.dp),
            json.dumps(engine_arguments(es, False, dp=False))]


ENGINE = support.Engine("vllm", "vLLM", SOURCE_ENV, "root", TESTED, CAPABILITIES, prepare_environment, (
    LAYER_MODULE, "vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided",
    "vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_two_sided"), "0.7.2.post1",
    ("0.18.0", "0.19.0", "0.20.0", "0.21.0", "0.22.0", "0.23.0", "0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.28.0",
     "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.34.0"), CONSUMER,
    # The FlashInfer NVLink backends came with 0.18.0 (fused_moe/flashinfer_nvlink_*_prepare_finalize.py).
    # Patch releases are releases of their own: each may pin, or carry, something else.
    history=("0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1",
             "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0",
             "0.31.0", "0.32.0", "0.33.0", "0.34.0"), probes=(lacks_moe_layer,),
    # What a rank imported on first use (py-spy of 0.25.0's matrix and mutants): the executor
    # package ParallelConfig's checks import, the routers' model modules, ModelOpt's quant
    # configs, the nvfp4 oracle, the message queue of vLLM's groups, the adapter itself.
    rank_imports=("vllm.v1.executor", "vllm.model_executor.models.cohere2_moe", "vllm.model_executor.models.llama4",
                  "vllm.model_executor.layers.quantization.modelopt",
                  "vllm.model_executor.layers.fused_moe.oracle.nvfp4",
                  "vllm.distributed.device_communicators.shm_broadcast", "testbed.integrations.vllm.adapter"),
    # What `python -X importtime` of the fork server's preload (0.33.0) spent outside vLLM:
    # torch 3.5 s, transformers 1.2, networkx, openai, sympy 0.3 each, triton, aiohttp, fastapi.
    dependencies=("torch", "transformers", "networkx", "openai", "sympy", "triton", "aiohttp", "fastapi"),
    # The managers' lifecycles, the workspace that grows, both round trips (the seed PRs' tests).
    # Not tests/kernels/moe/test_flashinfer_moe_ep.py (0.34 on): FlashInfer's MoE-EP megakernel
    # layer and its configs, which the fake does not stand in for.
    own_tests=("tests/distributed/test_mnnvl_alltoall.py",),
    own_tests_off_cpu=(
        # 0.34: checks that the experts' output buffer is the combine workspace by comparing its
        # device with torch.device("cpu:<rank>"); a CPU tensor's device carries no index.
        ("tests/distributed/test_mnnvl_alltoall.py::test_one_sided_expert_output_in_workspace",
         "a tensor's device naming the rank's device index (CPU tensors read `cpu`, never `cpu:N`)"),),
    # Offline at DP 4, two ranks on the example's placeholder request: unequal counts, ranks that
    # end first and step dummy batches (the engines tier serves one-sided DP 2 offline).
    serving=support.Serving(served_command, plugins="vllm.plugins", offline=offline_command,
                            offline_shapes=(("two_sided", 4, 1, 2),)))


@functools.cache
def one_sided_api() -> str:
    """The FlashInfer API vLLM's one-sided manager drives, by what it has (a capability probe):
    ``get_communication`` (0.33: a ``moe_ep`` communication), else ``MoeAlltoAll`` itself
    (0.24 .. 0.32, through its ``combine_into`` from 0.26, its prepare/finalize before);
    ``moe_ep`` where vLLM is not installed (the release the adapter is written for)."""
    module = ENGINE.module("vllm.distributed.device_communicators.all2all")
    return "moe_ep" if module is None or hasattr(module.FlashInferNVLinkOneSidedManager, "get_communication") \
        else "comm"


@functools.cache
def one_sided_combine_output() -> bool:
    """Whether vLLM's one-sided path hands ``MoeAlltoAll.combine`` an ``output=`` where the
    release takes one (a capability probe): its manager's ``combine_into`` (0.26 .. 0.32) and its
    ``moe_ep`` communication (0.33 on) do; before, the prepare/finalize calls ``combine`` itself
    and copies the result (0.24, 0.25), which is not wrong."""
    module = ENGINE.module("vllm.distributed.device_communicators.all2all")
    return module is None or any(hasattr(module.FlashInferNVLinkOneSidedManager, name)
                                 for name in ("combine_into", "get_communication"))


@functools.cache
def two_sided_api() -> str:
    """The FlashInfer API vLLM's two-sided manager drives, by what it has (a capability probe):
    ``moe_ep`` (0.34: ``get_communication``, one ``NVLinkTwoSidedAlltoAll`` per size) or
    ``mnnvl`` (before: ``MnnvlMoe`` on a ``Mapping``); ``mnnvl`` where vLLM is not installed
    (the release the adapter is written for)."""
    module = ENGINE.module("vllm.distributed.device_communicators.all2all")
    return "moe_ep" if module is not None and hasattr(module.FlashInferNVLinkTwoSidedManager, "get_communication") \
        else "mnnvl"


# vLLM's integration code: its distributed layer and its fused-MoE layer; at the engine level
# only the MoE layer's (attention's TP all-reduce and the logits' gather are the model's).
LAYER_CODE = ("distributed/", "model_executor/layers/fused_moe/")
MOE_CODE = ("model_executor/layers/fused_moe/", "distributed/device_communicators/all2all.py")


@functools.cache
def code(parts: tuple[str, ...] = LAYER_CODE) -> tuple[tuple[str, str], ...]:
    """The (real path prefix, shown name) pairs of these ``parts`` of the installed vLLM
    (folders end in ``/``); none where vLLM is not installed: the invariants then judge logs
    with no vLLM frames."""
    prepare_environment()
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        return ()
    root = Path(spec.origin).resolve().parent
    return tuple((str(root / part) + (os.sep if part.endswith("/") else ""), f"vllm/{part}") for part in parts)


def stub_accelerator(ctx) -> None:
    """vLLM's one-sided manager calls these; a CPU torch raises "Cannot access accelerator"."""
    acc = torch.accelerator
    if acc.is_available():
        return
    stubs = {"current_device_index": lambda: ctx.coords.rank, "synchronize": lambda *a, **k: None,
             "empty_cache": lambda *a, **k: None}
    saved = {name: getattr(acc, name) for name in stubs}
    for name, fn in stubs.items():
        setattr(acc, name, fn)
    ctx.add_cleanup(lambda: [setattr(acc, name, fn) for name, fn in saved.items()])


def gpu_buffers(ctx) -> None:
    """The experts' buffers allocated as on a GPU host, where the release's modular kernel takes
    them from vLLM's workspace manager (a capability probe: the module binds
    ``current_workspace_manager``).

    vLLM's GPU model runner starts that manager; the layer level starts it on this rank's device
    in its place. Where ``FusedMoEKernel._allocate_buffers`` has a CPU branch (0.31 on: it skips
    the manager, and from 0.34 fetches the prepare's combine-input buffer and drops it), the
    module sees a platform that is not a CPU (its other platform questions, CUDA and ROCm,
    answer false on either), so the experts write where they write on a GPU: from 0.34 straight
    into FlashInfer's combine-input buffer."""
    mk = importlib.import_module("vllm.model_executor.layers.fused_moe.modular_kernel")
    if "current_workspace_manager" not in vars(mk):
        return
    from vllm.v1.worker import workspace

    workspace.init_workspace_manager(torch.device("cpu"))
    ctx.add_cleanup(lambda: setattr(workspace, "_manager", None))
    ctx.add_cleanup(patch.attribute(mk, "current_platform", NotACpu(mk.current_platform)))


class NotACpu:
    """vLLM's platform, answering that it is not a CPU (and, with ``cuda``, that it is CUDA)."""

    def __init__(self, platform, cuda: bool = False):
        self._platform, self._cuda = platform, cuda

    @staticmethod
    def is_cpu() -> bool:
        return False

    def is_cuda(self) -> bool:
        return self._cuda or self._platform.is_cuda()

    def __getattr__(self, name):
        return getattr(self._platform, name)


def config_without_triton(ctx) -> None:
    """vLLM's configs built on this CPU as on a host with Triton (:func:`checked_with_triton`),
    for the scenario of ``ctx``."""
    from vllm.platforms import cpu

    if "HAS_TRITON" not in vars(importlib.import_module("vllm.triton_utils")):
        return
    platform = cpu.CpuPlatform
    check = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        return checked_with_triton(check, cls, vllm_config)

    ctx.add_cleanup(patch.attribute(platform, "check_and_update_config", classmethod(check_and_update_config)))


def fallback_warning_undone() -> None:
    """Drop, in this process, vLLM's CPU communicator's warning that a FlashInfer all-to-all
    backend "is not supported on CPU. Falling back to `allgather_reducescatter` manager", where
    the testbed puts the FlashInfer manager back right after (the layer level, the engine
    level): there it says the opposite of what runs. Only that warning, only for FlashInfer's
    backends; a process of vLLM's own where the fallback holds keeps it."""
    logger = logging.getLogger("vllm.distributed.device_communicators.cpu_communicator")
    if not any(isinstance(f, _FallbackUndone) for f in logger.filters):
        logger.addFilter(_FallbackUndone())


class _FallbackUndone(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not ("all2all manager is not supported on CPU" in str(record.msg)
                    and bool(record.args) and str(record.args[0]) in BACKENDS.values())


def checked_with_triton(check, cls, vllm_config):
    """``check(cls, vllm_config)``, vLLM's CPU platform's check of a config, as on a host with Triton.

    From 0.34 vLLM's CPU platform refuses an x86 CPU whose Triton has no CPU backend when a
    config is built (``CpuPlatform.check_and_update_config``: "vLLM on x86 CPUs requires
    Triton (triton-cpu)"), for the kernels of its x86 model runner, which the layer level never
    runs and the engine level replaces (``llm._standalone_cpu_runner``). Where the release reads
    ``vllm.triton_utils.HAS_TRITON`` (a probe, not a version), it answers true inside that check,
    and only there."""
    triton_utils = importlib.import_module("vllm.triton_utils")
    if "HAS_TRITON" not in vars(triton_utils):
        return check(cls, vllm_config)
    undo = patch.attribute(triton_utils, "HAS_TRITON", True)
    try:
        return check(cls, vllm_config)
    finally:
        undo()


def destroy_parallel_state() -> None:
    """vLLM's groups go; the pool's world stays (vLLM's destroy_distributed_environment
    would destroy it)."""
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    if ps._WORLD is not None:
        ps._WORLD.destroy()
        ps._WORLD = None
