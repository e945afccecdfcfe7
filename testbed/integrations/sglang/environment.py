"""SGLang as an engine the testbed installs, probes and imports, and the glue a CPU process needs to run it.

CPU glue: a placeholder ``torchvision`` (PyPI's is a CUDA build; two of SGLang's model
configs import it at load, nothing here calls it); SGLang's group timeout set to the
pool's; the flashinfer names SGLang's dispatcher and fp4 quantize bind at import re-read from
the scenario's release (the dispatcher's own guarded imports, re-run: a rank runs scenarios of
several releases); and a CPU kernel for the two SGLang custom ops on the path (its nvfp4
quantize, the TP all-gather), each op's own Python implementation, which SGLang registers for
CUDA only. ``A2A_SGLANG_SOURCE`` puts a checkout's Python first on every rank's path.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
import types
from pathlib import Path

import torch

from testbed.integrations import engine as support
from testbed.integrations.engine import SERVE_RUN_ENV
from testbed.integrations.sglang.consumer import CONSUMER

TESTED = ("0.5.23",)  # pins flashinfer-python 0.7.2


SOURCE_ENV = "A2A_SGLANG_SOURCE"
DISPATCHER = "sglang.srt.layers.moe.token_dispatcher.flashinfer"


# SGLang's custom ops on the adapter's path -> (module, name) of their Python implementation.
CPU_OPS = {"flashinfer_fp4_quantize": ("sglang.srt.layers.quantization.fp4_utils", "_flashinfer_fp4_quantize_impl"),
           "reg_all_gather_into_tensor": ("sglang.srt.distributed.parallel_state", "reg_all_gather_into_tensor")}


CAPABILITIES = (
    ("sglang.srt.server_args", "ServerArgs"),
    ("sglang.srt.distributed.parallel_state", "init_distributed_environment"),
    ("sglang.srt.distributed.parallel_state", "initialize_model_parallel"),
    ("sglang.srt.layers.moe.utils", "initialize_moe_config"),
    ("sglang.srt.layers.moe.fused_moe_triton.layer", "create_moe_dispatcher"),
    ("sglang.srt.layers.moe.fused_moe_triton.layer", "FusedMoE"),
    (DISPATCHER, "FlashinferDispatcher"),
    ("sglang.srt.layers.dp_attention", "set_dp_buffer_len"),
)


def prepare_environment() -> None:
    """What must hold before SGLang is imported in a process (the fork server's too)."""
    support.source_first(SOURCE_ENV)
    _stand_in_torchvision()
    _stand_in_kv_cache_io()
    _configs_transformers_ships()


def _configs_transformers_ships() -> None:
    """A model config an older SGLang registers, without ``exist_ok``, under a name the
    installed transformers has since shipped itself keeps transformers' class instead of
    raising: SGLang 0.5.11 .. 0.5.19 register ``qwen3_asr`` so, and the transformers SGLang 0.5.23
    needs (5.20) ships it, so ``import sglang.srt.server_args`` raised "'qwen3_asr' is already
    used by a Transformers config". Every other registration is transformers' own. Model
    configs are not on the all-to-all's path."""
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("transformers") is None:
        return
    from transformers import AutoConfig
    from transformers.models.auto import configuration_auto

    register = AutoConfig.register  # a staticmethod
    if getattr(register, "keeps_shipped", False):
        return

    def keeps_shipped(model_type, config, exist_ok=False):
        if not exist_ok and model_type in configuration_auto.CONFIG_MAPPING_NAMES:
            return None
        return register(model_type, config, exist_ok=exist_ok)

    keeps_shipped.keeps_shipped = True
    AutoConfig.register = staticmethod(keeps_shipped)


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
    _placeholder_package("torchvision")


def _stand_in_kv_cache_io() -> None:
    """SGLang 0.5.9 .. 0.5.12's host KV-cache pool imports ``sgl_kernel.kvcacheio`` at load on
    any host but an NPU, XPU (or MPS), on the import path of ``FusedMoE`` (0.5.9/0.5.10: through
    EPLB and the scheduler's batch), and ``sgl_kernel`` is a CUDA build. A placeholder package answers
    that import where the release's pool imports it so and no sgl_kernel is installed; any
    use of it fails loudly. The KV cache is not on the all-to-all's path."""
    if "sgl_kernel" in sys.modules or importlib.util.find_spec("sgl_kernel") is not None:
        return
    spec = importlib.util.find_spec("sglang")
    origin = spec.origin if spec is not None else None  # None: not here, or a tree of path files alone
    pool = Path(origin).parent / "srt" / "mem_cache" / "memory_pool_host.py" if origin else None
    # Imported wherever the host is not an NPU, XPU or MPS (a CPU included); later releases
    # import it on CUDA and ROCm only.
    on_a_cpu = r"if not \(_is_npu or _is_xpu(?: or _is_mps)?\):\s*from sgl_kernel\.kvcacheio import"
    if pool is None or not pool.exists() or not re.search(on_a_cpu, pool.read_text()):
        return
    _placeholder_package("sgl_kernel")


def stand_in_sgl_kernel() -> None:
    """An import-only ``sgl_kernel`` where none is installed (PyPI's ``sglang-kernel`` is a
    CUDA build): SGLang's engine imports its ops at load; any call fails loudly."""
    if "sgl_kernel" not in sys.modules and importlib.util.find_spec("sgl_kernel") is None:
        _placeholder_package("sgl_kernel")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``root`` and any ``root.<sub>`` import with a module whose every name is a
    :class:`_Placeholder`."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name == self.root or name.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = lambda attr, _name=spec.name: _module_attr(_name, attr)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def _placeholder_package(root: str) -> None:
    """Package ``root`` and all its submodules as placeholders (for this process's life)."""
    if not any(isinstance(f, _PlaceholderFinder) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _PlaceholderFinder(root))


def _module_attr(module: str, attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Placeholder(f"{module}.{attr}")


# FlashinferDispatcher came with 0.5.9.
HISTORY = ("0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14",
           "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# The loopback-only server of a scenario, as a user on a CPU host starts it.
MAX_TOTAL_TOKENS = 4096  # the KV cache's tokens: SGLang sizes it from the host's memory otherwise
MAX_RUNNING_REQUESTS = 8


def runner_backend(sentinel: str, expert_output: str) -> str:
    """The MoE runner backend whose FlashInfer dispatch in this release uses ``sentinel`` and
    lets the experts write into the workspace (``expert_output`` ``workspace``) or not: the
    flashinfer_cutlass runner combines from the workspace (every release); a -1 sentinel is the
    TRT-LLM runner's (``flashinfer_trtllm`` where the dispatcher names it, 0.5.19 on; its routed
    variant before, 0.5.15 .. 0.5.18, the only TRT-LLM runner those accept with FlashInfer
    A2A), num_experts the CuTe DSL runner's. Before 0.5.15 the dispatcher's sentinel does not
    depend on the runner (none, then -1, then num_experts) and its start-up accepts CUTLASS
    (and CuTe DSL from 0.5.13): the same names, which its start-up judges."""
    if expert_output == "workspace":
        return "flashinfer_cutlass"
    if sentinel == "num_experts":
        return "flashinfer_cutedsl"
    return "flashinfer_trtllm_routed" if _sentinel_only_for_routed_trtllm() else "flashinfer_trtllm"


@functools.cache
def _sentinel_only_for_routed_trtllm() -> bool:
    """Whether this release's dispatcher pairs the -1 sentinel with the routed TRT-LLM runner
    alone (0.5.15 .. 0.5.18); False where SGLang is not here (0.5.23's rule)."""
    dispatcher = ENGINE.module(DISPATCHER)
    source = inspect.getsource(dispatcher) if dispatcher is not None else ""
    return "is_flashinfer_trtllm_routed()" in source and "is_flashinfer_trtllm()" not in source


def serve_command(es, model_dir: str, port: int, reference: bool) -> list[str]:
    """``python -m sglang.launch_server`` of ``es`` on the loopback address: DP attention over
    ``dp`` DP ranks of ``tp`` attention-TP ranks each (SGLang's ``--tp-size`` is the world),
    FlashInfer's all-to-all with the TRT-LLM bf16 runner (the FlashInfer runner the fake
    implements); ``reference``: one rank, expert parallel off."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir, "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny", "--dtype", es.dtype,
            "--max-total-tokens", str(MAX_TOTAL_TOKENS), "--max-running-requests", str(MAX_RUNNING_REQUESTS),
            # The warmup request is the client's first one instead: SGLang is not ready until
            # its warmup is answered, so a hang in it would read as a start-up hang.
            "--random-seed", str(es.seed), "--skip-server-warmup"]
    if reference:
        return argv + ["--tp-size", "1"]
    # The release's TRT-LLM runner of its FlashInfer A2A: the one the -1 sentinel goes with.
    return argv + ["--tp-size", str(es.dp * es.tp), "--dp-size", str(es.dp), "--enable-dp-attention",
                   "--moe-a2a-backend", "flashinfer", "--moe-runner-backend", runner_backend("-1", "separate")]


def serve_environment(es, reference: bool) -> dict:
    """SGLang's CPU engine; with several ranks each rank's OpenMP threads on the host's cores
    in turn (SGLang wants a NUMA node per rank otherwise)."""
    ranks = 1 if reference else es.dp * es.tp
    cores = os.cpu_count() or 1
    bind = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(r % cores) for r in range(ranks))} if ranks > 1 else {}
    return {"SGLANG_USE_CPU_ENGINE": "1"} | bind


def prepare_served_process() -> None:
    """Before the main module of every process of a served run (:data:`fakes.spawned.PREPARE_ENV`),
    before SGLang's first import (a scheduler imports the KV-cache ops at load): the process
    glue of the layer level and an import-only ``sgl_kernel``, every name a placeholder that
    raises if called (PyPI's ``sglang-kernel`` is a CUDA build; on a CPU without AMX SGLang
    calls none of its ops for this model)."""
    if os.environ.get(SERVE_RUN_ENV):
        prepare_environment()
        stand_in_sgl_kernel()


# /ready came in 0.5.20; before it the HTTP server starts once every scheduler is ready, and
# /v1/models answers from then on. The general plugins came in 0.5.11.
SERVING = support.Serving(serve_command, serve_environment, devices=False, prompt_logprobs="echo",
                          prepare=f"{__name__}:prepare_served_process", ready=("/ready", "/v1/models"),
                          plugins="sglang.srt.plugins", refusal="testbed.integrations.sglang.rules:served_refusal",
                          shapes=(("one_sided", 2, 1, 3), ("one_sided", 4, 1, 2)))
ENGINE = support.Engine("sglang", "SGLang", SOURCE_ENV, "python/ directory", TESTED, CAPABILITIES,
                        # The post releases are their release's code on the path (history runs them).
                        prepare_environment, default_pin="0.7.2", consumer=CONSUMER,
                        other_releases=tuple(r for r in HISTORY[:-1] if ".post" not in r),
                        history=HISTORY,
                        # What a rank imported on first use (py-spy of 0.5.20's matrix): the sampler
                        # initialize_model_parallel imports, the model blocks' modules, the group
                        # communicators, the adapter itself.
                        rank_imports=("sglang.srt.layers.sampler", "sglang.srt.models.qwen3_moe",
                                      "sglang.srt.models.deepseek_v2",
                                      "sglang.srt.distributed.device_communicators.custom_all_reduce",
                                      "sglang.srt.distributed.device_communicators.shm_broadcast",
                                      "sglang.srt.distributed.device_communicators.pynccl",
                                      "testbed.integrations.sglang.adapter", "testbed.integrations.sglang.blocks"),
                        # What `python -X importtime` of the fork server's preload (0.5.23) spent
                        # outside SGLang: torch 2.2 s, transformers 0.6, sympy, openai,
                        # compressed_tensors 0.25 each, triton, aiohttp, networkx.
                        dependencies=("torch", "transformers", "sympy", "openai", "compressed_tensors", "triton",
                                      "aiohttp", "networkx"), serving=SERVING)


@functools.cache
def dispatcher_has_sp_prefill() -> bool:
    """Whether this SGLang's ``FlashinferDispatcher`` runs Muse Spark's SP-prefill all-to-all
    (``enable_sp_prefill_a2a=``; 0.5.22 has none), a capability probe; True where SGLang is not
    installed (the release the adapter is written for)."""
    module = ENGINE.module(DISPATCHER)
    return module is None or "enable_sp_prefill_a2a" in inspect.signature(module.FlashinferDispatcher.__init__).parameters


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


@functools.cache
def cpu_kernels() -> torch.library.Library:
    """Register each of :data:`CPU_OPS` for the CPU with its own implementation (once per
    process; the library object keeps the registrations)."""
    lib = torch.library.Library("sglang", "IMPL")
    for op, (module, name) in CPU_OPS.items():
        implementation = getattr(importlib.import_module(module), name, None)
        if implementation is not None:  # the release has the op (SGLang's fp4 quantize op came with 0.5.12)
            lib.impl(op, inspect.unwrap(implementation), "CPU")
    return lib

