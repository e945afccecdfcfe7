"""What SGLang's releases (0.5.9 .. 0.5.23) differ in on the adapter's path, one fact per
function, each decided by a capability probe of the release's own code, never by its version.

Groups found (newest first), by the probe that marks each:

- 0.5.21 on: ``FusedMoE._dispatch_with_pre_quant``; the MoE block's post-experts reduce is
  SGLang's ``reduce_moe_output``, its claim ``post_experts_output_is_complete``;
  ``create_moe_dispatcher(config, quant_method)``.
- 0.5.17 .. 0.5.20: ``runtime_context.publish`` publishes the server configuration; the
  post-experts reduce is inline in each model block (``should_skip_post_experts_all_reduce``).
- 0.5.9 .. 0.5.16: the scheduler publishes through ``set_global_server_args_for_scheduler`` and
  ``initialize_moe_config(server_args)`` (0.5.15/0.5.16's shim writes the runtime context).
- 0.5.9 .. 0.5.14: the dispatcher's constructor creates its dummy-token tensors on
  ``device="cuda"``; they land on the rank's CPU (:func:`cuda_tensors_on_this_device`).
- 0.5.9 .. 0.5.19: the dispatcher reads its dispatch format once, at import
  (``MOE_NVFP4_DISPATCH``), after the server arguments set it; a process serves one
  configuration, a rank here several, so it is read again per scenario
  (:func:`import_time_format`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import os
from types import SimpleNamespace

from testbed import patch
from testbed.integrations import engine as support
from testbed.integrations.sglang.environment import ENGINE
from testbed.scenario.reference import ACT_DTYPE


@functools.cache
def server_argument_names() -> frozenset[str]:
    """The fields of this release's ``ServerArgs`` (none where SGLang is not here); a process
    runs one release."""
    server_args = ENGINE.module("sglang.srt.server_args")
    return frozenset(inspect.signature(server_args.ServerArgs).parameters) if server_args is not None else frozenset()


NVFP4_DISPATCH_ENV = "SGLANG_MOE_NVFP4_DISPATCH"


def dispatch_format_argument(fmt: str) -> dict:
    """The scenario's dispatch format as a server argument (``flashinfer_a2a_dispatch_type``,
    0.5.20 on), or none where the release takes it from the environment
    (:func:`dispatch_format_environment`)."""
    return {"flashinfer_a2a_dispatch_type": fmt} if "flashinfer_a2a_dispatch_type" in server_argument_names() else {}


def dispatch_format_environment(ctx, fmt: str) -> None:
    """Before 0.5.20, ``SGLANG_MOE_NVFP4_DISPATCH`` as the release's start-up leaves it for the
    scenario's checkpoint: set for nvfp4 (an NVFP4 checkpoint, for which every release's
    start-up sets it), left to the release's own default for bf16 (0.5.9 .. 0.5.14's start-up
    sets it whatever the checkpoint); restored after the scenario (the start-up writes it into
    this process's environment)."""
    if dispatch_format_argument(fmt):
        return
    ctx.add_cleanup(_format_in_environment(fmt))


def _format_in_environment(fmt: str):
    restore = patch.environment({NVFP4_DISPATCH_ENV: "1"})
    if fmt != "nvfp4":
        os.environ.pop(NVFP4_DISPATCH_ENV)
    return restore


def publish(ctx, server_args, dp_rank: int | None) -> None:
    """Publish the scenario's server configuration and MoE configuration as this release's
    scheduler does, undone by the context's cleanup."""
    from sglang.srt.layers.moe.utils import initialize_moe_config

    rc = _runtime_context()
    if rc is not None and hasattr(rc, "reset_context"):
        ctx.add_cleanup(rc.reset_context)  # SGLang's published configuration, flags and forward state
    if rc is not None and hasattr(rc, "publish"):
        # The launcher's placement of this rank, where publish takes it (0.5.21 on).
        ranks = {"ranks": rc.SpawnRanks(world_rank=ctx.rank, dp_rank=dp_rank)} if hasattr(rc, "SpawnRanks") else {}
        rc.publish(server_args, role="test", **ranks)
    else:
        from sglang.srt import server_args as sa

        if not hasattr(rc, "reset_context"):  # before 0.5.15: a module global
            ctx.add_cleanup(patch.attribute(sa, "_global_server_args", getattr(sa, "_global_server_args", None)))
        sa.set_global_server_args_for_scheduler(server_args)
    if inspect.signature(initialize_moe_config).parameters:
        initialize_moe_config(server_args)
    else:
        initialize_moe_config()


def _runtime_context():
    try:
        from sglang.srt import runtime_context
    except ImportError:  # before 0.5.14
        return None
    return runtime_context


def tp_group():
    """SGLang's TP group coordinator (the FlashInfer dispatcher's EP group)."""
    rc = _runtime_context()
    if rc is not None and hasattr(rc, "get_parallel"):
        return rc.get_parallel().tp_group
    from sglang.srt.distributed.parallel_state import get_tp_group

    return get_tp_group()


def moe_ep_size() -> int:
    rc = _runtime_context()
    if rc is not None and hasattr(rc, "get_parallel"):
        return rc.get_parallel().moe_ep_size
    from sglang.srt.distributed.parallel_state import get_moe_expert_parallel_world_size

    return get_moe_expert_parallel_world_size()


def create_dispatcher(config):
    """``FusedMoE.__init__``'s dispatcher for a layer of ``config`` (its quant method none:
    the testbed hands the nvfp4 global scale as ModelOpt's method does)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import create_moe_dispatcher

    if "quant_method" in inspect.signature(create_moe_dispatcher).parameters:
        return create_moe_dispatcher(config, quant_method=None)
    return create_moe_dispatcher(config)


def cuda_tensors_on_this_device(ctx, module) -> None:
    """Stand-in: a dispatcher module that creates tensors on ``device="cuda"`` (0.5.9 ..
    0.5.14's dummy-token tensors) creates them on the rank's CPU; the module's ``torch`` is
    torch itself otherwise."""
    if 'device="cuda"' in inspect.getsource(module):
        ctx.add_cleanup(patch.attribute(module, "torch", support.TorchOnThisDevice()))


def import_time_format(ctx, module) -> None:
    """A dispatcher module that read ``SGLANG_MOE_NVFP4_DISPATCH`` at import (before 0.5.20)
    reads it again, after this scenario's server arguments set it, as the scheduler process
    that imports it after them does."""
    if hasattr(module, "MOE_NVFP4_DISPATCH"):
        from sglang.srt.environ import envs

        ctx.add_cleanup(patch.attribute(module, "MOE_NVFP4_DISPATCH", envs.SGLANG_MOE_NVFP4_DISPATCH.get()))


def bind_forward(module, fused_moe_class) -> None:
    """``FusedMoE``'s own forward methods bound on the stand-in ``module``."""
    for name in ("_dispatch_with_pre_quant", "run_moe_core", "forward_impl"):
        if hasattr(fused_moe_class, name):
            setattr(module, name, getattr(fused_moe_class, name).__get__(module))


def post_experts_reduce():
    """SGLang's shared post-experts reduce of an MoE block (``reduce_moe_output``, 0.5.21 on),
    or None where each model block decides it inline (checked with ``--block``)."""
    from sglang.srt.layers.moe import utils

    return getattr(utils, "reduce_moe_output", None)


def output_is_complete() -> bool:
    """SGLang's claim that the MoE output owes no TP sum (``post_experts_output_is_complete``,
    0.5.21 on). Before, the layer alone makes no claim: its output is the combine's, which
    sums every expert rank's contribution, and each model block decides its reduce inline."""
    from sglang.srt.layers.moe import utils

    claim = getattr(utils, "post_experts_output_is_complete", None)
    return True if claim is None else claim(is_tp_path=True)


def initialize_model_parallel(server_args) -> None:
    """SGLang's model-parallel groups at the scenario's widths: read from the published
    configuration (0.5.21 on), or handed from the server arguments as the release's model
    runner hands them."""
    from sglang.srt.distributed import parallel_state as ps

    params = inspect.signature(ps.initialize_model_parallel).parameters
    widths = {"tensor_model_parallel_size": server_args.tp_size, "pipeline_model_parallel_size": server_args.pp_size,
              "expert_model_parallel_size": server_args.ep_size,
              "attention_data_parallel_size": server_args.dp_size if server_args.enable_dp_attention else 1,
              "attention_context_model_parallel_size": getattr(server_args, "attn_cp_size", 1),
              "moe_data_model_parallel_size": getattr(server_args, "moe_dp_size", 1),
              "decode_context_parallel_size": getattr(server_args, "dcp_size", 1)}
    ps.initialize_model_parallel(backend="gloo", **{k: v for k, v in widths.items() if k in params})


def initialize_dp_attention(server_args, sc) -> None:
    """SGLang's DP-attention state; the releases that size the DP gather buffer here (before
    0.5.21) read it from the model config, which the testbed does not build from a checkpoint:
    a stand-in of the scenario's model (hidden size, activation dtype, no hybrid pattern)
    answers them."""
    from sglang.srt.layers import dp_attention as dpa

    if "model_config" in inspect.signature(dpa.initialize_dp_attention).parameters:
        model = SimpleNamespace(hidden_size=sc.hidden, dtype=ACT_DTYPE, hf_config=SimpleNamespace())
        dpa.initialize_dp_attention(server_args, model)
    else:
        dpa.initialize_dp_attention(server_args)


def moe_input_is_own_rows() -> bool:
    """SGLang's decision whether a sparse FFN's input is the DP rank's own rows
    (``is_moe_input_scattered_across_dp_ranks``, 0.5.19 on; before, the layer communicator's
    MLP scatter mode of a sparse layer, the same rule where it lived)."""
    from sglang.srt.layers.moe import utils

    if hasattr(utils, "is_moe_input_scattered_across_dp_ranks"):
        return utils.is_moe_input_scattered_across_dp_ranks()
    from sglang.srt.layers.communicator import LayerScatterModes, ScatterMode

    return LayerScatterModes._compute_mlp_mode(SimpleNamespace(is_layer_sparse=True)) is ScatterMode.SCATTERED


def a2a_startup(server_args, fmt: str) -> None:
    """This release's own FlashInfer A2A start-up handling of the server arguments, where a
    dummy model's construction stops before it.

    Before 0.5.19 it is ``ServerArgs._handle_a2a_moe`` (its asserts, the forced EP size, the
    shared-experts fusion turned off, the NVFP4 dispatch default), which the resolution calls
    after the dummy-model boundary: it is called on the arguments directly, its declarations
    then applied as the end of the resolution applies them (``materialize_declarations``,
    0.5.15 on); the model config it reads is a stand-in of the scenario's checkpoint (NVFP4
    MoE metadata for nvfp4, none for bf16). From 0.5.19 the handler (``moe_hook``) reads
    fields the resolution derives first; of it the dummy's construction runs the topology
    rule, and the shared-experts fusion pass (``_a2a_fusion_adjustments``) runs here. Raises
    what the handler raises where the release refuses the arguments."""
    from sglang.srt.server_args import ServerArgs

    handler = getattr(ServerArgs, "_handle_a2a_moe", None)
    if handler is None:
        from sglang.srt.arg_groups import overrides

        with _quiet(overrides.__name__):
            overrides.run_post_process_pass(server_args, overrides._a2a_fusion_adjustments)
        return
    model = SimpleNamespace(nvfp4_moe_meta=object() if fmt == "nvfp4" else None, dtype=ACT_DTYPE,
                            hf_config=SimpleNamespace())
    server_args.model_config = server_args._model_config = model
    server_args.get_model_config = lambda: model
    with _quiet(ServerArgs.__module__, "sglang.srt.arg_groups.overrides"):
        handler(server_args)
    try:
        from sglang.srt.arg_groups.overrides import materialize_declarations
    except ImportError:  # before 0.5.15 the handler writes the fields itself
        return
    if not getattr(server_args, "_declarations_materialized", False):
        materialize_declarations(server_args)


@contextlib.contextmanager
def _quiet(*loggers: str):
    """The start-up's warnings are a server operator's, once; here they would repeat per
    scenario and rank."""
    quiet = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(quiet, levels):
            logger.setLevel(level)


def a2a_startup_refusal(arguments: dict, fmt: str) -> str | None:
    """The message of this release's A2A start-up handling (:func:`a2a_startup`) where it
    refuses the server ``arguments``, else None (from 0.5.19 the dummy's construction runs
    the rule, which ``rules.sglang_rule`` holds and a test compares). The environment it
    writes is restored."""
    return _startup_refusal(tuple(sorted(arguments.items())), fmt)


@functools.cache  # every scenario's validation asks; a process runs one release
def _startup_refusal(arguments: tuple, fmt: str) -> str | None:
    module = ENGINE.module("sglang.srt.server_args")  # the rules ask in a process without SGLang imported
    if module is None or not hasattr(module.ServerArgs, "_handle_a2a_moe"):
        return None  # no SGLang here, or from 0.5.19: the rule is rules.sglang_rule's
    restore = _format_in_environment(fmt)
    try:
        a2a_startup(module.ServerArgs(**dict(arguments)), fmt)
    except (AssertionError, ValueError, NotImplementedError) as refused:
        return f"{type(refused).__name__}: {refused}"
    finally:
        restore()
    return None


def comm_backend_as_on_a_gpu(ctx, dispatcher) -> None:
    """Stand-in: SGLang's ``TorchDistributedCommBackend`` as its module defines it on a GPU box,
    a subclass of FlashInfer's ``CommBackend``. Its module (``flashinfer_utils``) picks the base
    by ``is_flashinfer_available()``, which asks for CUDA, and on a CPU gets a placeholder
    class; it is imported again with FlashInfer available, for this scenario's release."""
    cls = getattr(dispatcher, "TorchDistributedCommBackend", None)
    from flashinfer.comm import mnnvl

    base = getattr(mnnvl, "CommBackend", None)
    if cls is None or base is None or issubclass(cls, base):
        return
    rebuilt = _with_flashinfer_available(cls.__module__, base).TorchDistributedCommBackend
    ctx.add_cleanup(patch.attribute(dispatcher, "TorchDistributedCommBackend", rebuilt))


@functools.cache  # per FlashInfer release: its CommBackend is the key
def _with_flashinfer_available(name: str, base: type):
    """Module ``name`` imported afresh while ``is_flashinfer_available()`` answers True (its
    ``from flashinfer.comm.mnnvl import CommBackend`` then reads ``base``'s release)."""
    from sglang.srt import utils

    spec = importlib.util.find_spec(name)
    module = importlib.util.module_from_spec(spec)
    undo = patch.attribute(utils, "is_flashinfer_available", lambda: True)
    try:
        spec.loader.exec_module(module)
    finally:
        undo()
    return module
