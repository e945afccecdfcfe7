"""The scenarios ``--integration vllm`` runs: what vLLM 0.33.0's own classes can run on the
CPU, what only impl has, and the passes vLLM's engine makes."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from dataclasses import dataclass
from types import SimpleNamespace

from testbed.cluster.layout import ParallelLayout
from testbed.integrations.vllm.environment import BACKENDS, ENGINE, LAYER_MODULE
from testbed.scenario.model import Scenario, first_given

# The paths vLLM 0.33.0 drives through a FlashInfer manager that run on the CPU (its
# all-gather/reduce-scatter fallback needs all_gatherv, which vLLM's CpuCommunicator lacks).
VLLM_PATHS = ("one_sided", "two_sided")
# The activation formats each level runs here. The layer: the quant methods whose experts
# the testbed's stand in for, their activation quantize on the CPU (bf16; DeepSeek's
# blockwise fp8 with the testbed's CPU group quantize in place of vLLM's Triton kernel;
# ModelOpt's mxfp8; ModelOpt's nvfp4 with the testbed's CPU kernel for vLLM's compiled
# scaled_fp4_quant). The kernel level: the quant configs the adapter makes itself.
VLLM_FORMATS = {"layer": ("bf16", "fp8_block", "mxfp8", "nvfp4"), "kernel": ("bf16", "mxfp8")}
# vLLM 0.33.0's engine, one step of DP ranks: a DP rank with no scheduled request runs a dummy
# batch of uniform_decode_query_len (1) tokens (v1/engine/core.py execute_dummy_batch ->
# gpu_worker.py _dummy_run), and no forward runs when every DP rank is idle.
DUMMY_BATCH_TOKENS = 1
# The most ranks a CPU pool starts vLLM's parallel state on within a scenario's watchdog: it
# builds gloo groups for every TP, PP, DP and EP group, and at 64 ranks on 2 cores that alone
# outlasted the 30 s watchdog. The impl matrix carries the scale entries.
MAX_RANKS = 16

# What only impl has: the scenario flags vLLM's classes have no counterpart for.
_VLLM_IMPL_ONLY = (("--combine-signature", "combine_signature", "release"), ("--a2a-api", "a2a_api", "auto"),
                   ("--expert-kernel", "expert_kernel", "reference"), ("--expert-output", "expert_output", "separate"),
                   ("--invalid-expert-id", "invalid_expert_id", "-1"), ("--defer-finalize", "defer_finalize", False),
                   ("--backend", "flashinfer_backend", "fake"))
# What lives in vLLM's MoERunner and the model around it: driven at the layer level only.
_LAYER_ONLY = (("--sequence-parallel", "sequence_parallel", False), ("--shared-experts", "shared_experts", False),
               ("--routed-scaling", "routed_scaling", 1.0))
# What the layer level decides itself: the router's id dtype (CPURouter casts to int32) and
# the mxfp8 scale alignment (the quant method's).
_KERNEL_ONLY = (("--router-ids", "router_ids", "int32"), ("--mx-alignment", "mx_alignment", 0))


@functools.cache
def refuses_pp_with_external_launcher() -> bool:
    """Whether the vLLM this process runs refuses PP > 1 under ``external_launcher`` when its
    config is built (from 0.34: its GPU model runner does not broadcast PP outputs to keep
    torchrun ranks in sync), read from its source (a probe, not a version)."""
    from testbed.contract.source import SourceError

    try:
        config = ENGINE.package().read("vllm/config/vllm.py")
    except (SourceError, FileNotFoundError, KeyError):
        return False
    # The GPU model runner's own list (0.34); 0.33 lists it only for its optional V2 runner.
    for node in ast.walk(ast.parse(config)):
        if isinstance(node, ast.FunctionDef) and node.name == "_get_model_runner_unsupported_features":
            return any(isinstance(c, ast.Constant) and c.value == "pipeline parallelism with external_launcher"
                       for c in ast.walk(node))
    return False


@dataclass(frozen=True)
class Launch:
    """How a rank's vLLM is started: ``config`` the ``ParallelConfig`` keywords of its executor,
    ``world_size`` and ``rank`` what its worker hands ``init_distributed_environment`` (vLLM
    offsets them by the DP rank where the executor is not the external launcher)."""

    config: dict
    world_size: int
    rank: int


def executor_launch(layout: ParallelLayout, rank: int) -> Launch:
    """The executor ``rank`` runs under: the external launcher (every rank one process of one
    world, its DP rank read from ``RANK``), or, where the release refuses pipeline parallelism
    under it (:func:`refuses_pp_with_external_launcher`), vLLM's mp executor as a PP
    deployment runs: one engine per DP rank, its ``data_parallel_rank`` given, each worker's
    rank within its DP rank's TP x PP world."""
    if layout.pp > 1 and refuses_pp_with_external_launcher():
        per_dp = layout.tp * layout.pp
        return Launch({"distributed_executor_backend": "mp", "data_parallel_rank": rank // per_dp},
                      per_dp, rank % per_dp)
    return Launch({"distributed_executor_backend": "external_launcher"}, layout.world_size, rank)


def engine_passes(sc: Scenario) -> tuple[tuple[int, ...], ...]:
    """The passes vLLM's engine makes of ``sc.passes``: an idle DP rank on the dummy batch,
    no pass where every DP rank is idle."""
    return tuple(tuple(n or DUMMY_BATCH_TOKENS for n in counts) for counts in sc.passes if any(counts))


def sequence_parallel(path: str, layout: ParallelLayout) -> bool:
    """Whether the release's MoE runs sequence parallel at ``layout`` on ``path``'s backend with
    expert parallel: its own rule, ``ParallelConfig.use_sequence_parallel_moe``, evaluated on
    those fields (the one-sided backend joined its list in 0.29; two-sided never did). Where
    vLLM is not installed, 0.33.0's (the release the adapter is written for): one-sided, TP > 1
    and DP > 1."""
    rule = _sequence_parallel_rule()
    if rule is None:
        return path == "one_sided" and layout.tp > 1 and layout.dp > 1
    return bool(rule(SimpleNamespace(all2all_backend=BACKENDS.get(path, path), enable_expert_parallel=True,
                                     tensor_parallel_size=layout.tp, data_parallel_size=layout.dp)))


@functools.cache
def _sequence_parallel_rule():
    module = ENGINE.module("vllm.config.parallel")
    return None if module is None else module.ParallelConfig.use_sequence_parallel_moe.fget


@functools.cache
def one_sided_dispatch_formats() -> tuple[str, ...] | None:
    """The activation formats the release's one-sided prepare builder dispatches, where it names
    them in the error it raises for any other when the layer is built (before 0.29:
    ``all2all_utils.maybe_make_prepare_finalize``, "flashinfer_nvlink_one_sided dispatch
    supports nvfp4, mxfp8, and bf16 (quant_dtype=None) today"; 0.20.0: nvfp4 only); None where it dispatches every
    format the layer level builds (a probe of its source)."""
    module = ENGINE.module("vllm.model_executor.layers.fused_moe.all2all_utils")
    if module is None:
        return None
    source = re.sub(r'"\s*\n\s*f?"', "", inspect.getsource(module))  # the message's pieces joined
    found = (re.search(r"flashinfer_nvlink_one_sided dispatch supports (.+?) today", source)
             # 0.20.0: "The 'flashinfer_nvlink_one_sided' all2all backend only supports nvfp4 ..."
             or re.search(r"'flashinfer_nvlink_one_sided' all2all backend only supports (.+?) activation", source))
    if found is None:
        return None
    names = {"nvfp4": "nvfp4", "mxfp8": "mxfp8", "bf16": "bf16", "Blockwise FP8": "fp8_block"}
    return tuple(fmt for name, fmt in names.items() if name in found.group(1))


@functools.cache
def unbuilt_formats() -> dict[str, str]:
    """The formats whose layer the release's experts oracle cannot hand the backend the layer
    level builds it on, as ``{format: "Enum.MEMBER"}`` (0.24's mxfp8 oracle has no Triton
    backend: a probe of the release's enum), nor, where the layer is built through a factory,
    resolve that backend's experts class; empty where vLLM is not installed. (A layer built as
    its module class takes its experts from the quant method's ``select_gemm_impl``.)"""
    from testbed.integrations.vllm.environment import moe_class
    from testbed.integrations.vllm.layer import FORMATS, format_on_this_release

    if ENGINE.module(LAYER_MODULE) is None:
        return {}
    resolved = moe_class() is None
    missing = {}
    for fmt, form in FORMATS.items():
        module = ENGINE.module(f"vllm.model_executor.layers.fused_moe.oracle.{form.oracle}")
        form = format_on_this_release(fmt)[0] if module is not None else form
        if module is not None and not (hasattr(getattr(module, form.enum, None), form.member)
                                       and (hasattr(module, form.resolver) or not resolved)):
            missing[fmt] = f"{form.enum}.{form.member}"
    return missing


def vllm_rule(sc: Scenario) -> tuple[str, str] | None:
    """``(flag, rule)`` the scenario breaks under ``--integration vllm``, or None."""
    if sc.path not in VLLM_PATHS:
        return "--path", (f"--integration vllm drives {', '.join(VLLM_PATHS)}: vLLM's all-gather/reduce-scatter "
                          "needs all_gatherv, which its CpuCommunicator does not implement, and expert parallel "
                          "off has no all-to-all")
    if sc.layout.dp < 2:
        return "--layout", ("vLLM runs its all-to-all kernels only with DP > 1 (FusedMoEParallelConfig."
                            f"use_all2all_kernels); with dp={sc.layout.dp} its layers dispatch nothing")
    if sc.layout.world_size > MAX_RANKS:
        return "--layout", (f"--integration vllm starts vLLM's parallel state on at most {MAX_RANKS} CPU ranks "
                            f"(its gloo groups at {sc.layout.world_size} outlast the scenario's watchdog); the impl "
                            "matrix carries the scale entries")
    if not sc.passes:
        return "--tokens", ("vLLM's engine runs no forward where every DP rank is idle: give a pass where a DP "
                            "rank has tokens, or --raw-passes to feed the layer passes the engine never makes")
    flag = first_given(sc, _VLLM_IMPL_ONLY)
    if flag:
        return flag, ("is not driven under --integration vllm, which runs vLLM's own classes on the fake "
                      "(impl's combine signatures, API choice, TRT-LLM experts, workspace output and sentinel "
                      "have no vLLM counterpart; vLLM defers finalize only with DP 1 and EP 1, where it has "
                      "no all-to-all)")
    if sc.level == "kernel":
        flag = first_given(sc, _LAYER_ONLY)
        if flag:
            return flag, ("lives in vLLM's MoERunner and the model around it: --level layer drives it, --level "
                          "kernel runs the prepare/finalize and kernel alone")
    else:
        flag = first_given(sc, _KERNEL_ONLY)
        if flag:
            return flag, ("is decided by vLLM's own layer (its CPURouter casts the router's ids to int32; its "
                          "quant method sets the mxfp8 scale alignment): --level kernel feeds the prepare "
                          "what a router or quant config of your choosing would")
        vllm_sp = sequence_parallel(sc.path, sc.layout)
        if sc.sequence_parallel != vllm_sp:
            return "--sequence-parallel", (
                f"vLLM {ENGINE.release()[0]} runs this deployment's MoE "
                + ("sequence parallel" if vllm_sp else "without sequence parallel")
                + " (its ParallelConfig.use_sequence_parallel_moe; 0.29 on: the one-sided backend with TP > 1 and "
                "DP > 1): " + ("give --sequence-parallel" if vllm_sp else "drop --sequence-parallel"))
        unbuilt = {ly.fmt: unbuilt_formats()[ly.fmt] for st in sc.stages for ly in st if ly.fmt in unbuilt_formats()}
        if unbuilt:
            return "--stages", (f"vLLM {ENGINE.release()[0]}'s experts oracle has no "
                                + ", ".join(f"{member} (for {fmt})" for fmt, member in sorted(unbuilt.items()))
                                + ", the backend whose experts the testbed's stand in for at the layer level")
        if sc.shared_experts and sc.layout.tp > 1 and not sc.sequence_parallel and sc.hidden % sc.layout.tp:
            return "--hidden", (f"vLLM's models shard the shared experts over TP off sequence parallel; hidden "
                                f"{sc.hidden} % tp {sc.layout.tp} != 0")
    dispatched = one_sided_dispatch_formats() if sc.path == "one_sided" else None
    if dispatched is not None:
        fmts = sorted({ly.fmt for st in sc.stages for ly in st} - set(dispatched))
        if fmts:
            return "--stages", (f"vLLM {ENGINE.release()[0]} refuses a {', '.join(fmts)} layer on the one-sided "
                                "backend when it builds the layer (all2all_utils.maybe_make_prepare_finalize raises: "
                                f"its one-sided dispatch supports {', '.join(dispatched)})")
    formats = VLLM_FORMATS[sc.level]
    fmts = sorted({ly.fmt for st in sc.stages for ly in st} - set(formats))
    if fmts:
        return "--stages", (f"vLLM 0.33.0 quantizes {', '.join(fmts)} with compiled ops or Triton kernels absent "
                            f"on the CPU; --integration vllm --level {sc.level} runs {', '.join(formats)}")
    budgets = {ly.max_num_tokens for st in sc.stages for ly in st}
    if len(budgets) > 1:
        return "--stages", (f"vLLM builds every MoE layer's prepare/finalize with "
                            f"scheduler_config.max_num_batched_tokens: give every layer one budget, got "
                            f"{sorted(budgets)}")
    return None
