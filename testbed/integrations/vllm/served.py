"""vLLM's own processes where the testbed serves it (``a2a-testbed serve``): what its engine
level puts around ``LLM``, here for the life of every process ``vllm serve`` starts.

Registered as a vLLM general plugin (entry point group ``vllm.general_plugins``, which vLLM
loads in its API server, each engine core and each worker). It acts only in a process of a
served run: one with the accelerator stand-in (:data:`fakes.accelerator.DEVICES_ENV`) and a
run directory (:data:`RUN_ENV`); everywhere else it does nothing. The platform
(:mod:`.platform`) gives the communicator, the config check and the model runner; this gives:

- the compiled ops vLLM's CPU engine loop calls (:mod:`.engine_kernels`);
- a host without AMX as vLLM's CPU linears ask (``torch.cpu._is_amx_tile_supported``): on one
  with AMX they pick the compiled ops of vLLM's CPU build for bf16 weights
  (``convert_weight_packed``, ``weight_packed_linear``), which its CUDA wheel lacks; without,
  torch's linear;
- experts that compute with the layer's weights and honour ``expert_map`` (:mod:`.experts`;
  vLLM's CPU experts need compiled ops its CUDA wheel lacks, and ignore ``expert_map``);
- what the run's plan (``plan.json``, written by the serving command) names: a function for
  each process as it starts (``start_process``: the run's mutant applied before the engine runs
  its code), and one for each worker once vLLM's model-parallel groups are formed
  (``start_rank``: that rank's recorders, with the rank and the expert-parallel group read from
  vLLM's own groups; it returns the rank's event log);
- then, per MoE layer call of each forward, the layer's events in that log and a line in
  ``steps<rank>.jsonl``: the layer, this rank's rows and the DP token counts vLLM's forward
  context gave it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os

from fakes.accelerator import DEVICES_ENV
from testbed.integrations.engine import SERVE_RUN_ENV


def plugin() -> None:
    """vLLM's general-plugin hook."""
    if not (os.environ.get(DEVICES_ENV) and os.environ.get(SERVE_RUN_ENV)):
        return
    with _testbed_errors(os.environ[SERVE_RUN_ENV]):
        _apply(os.environ[SERVE_RUN_ENV])


@contextlib.contextmanager
def _testbed_errors(run_dir: str):
    """What the testbed's own code raises in an engine process, written where the serving
    command reads it (``testbed-error``), so that the report blames the testbed, never the
    engine; then raised on, as the engine would see it."""
    try:
        yield
    except BaseException as e:
        with open(os.path.join(run_dir, "testbed-error"), "a") as f:
            f.write(f"process {os.getpid()}: {type(e).__name__}: {e}\n")
        raise


class _ProcessLife:
    """What the engine level's helpers take as a scenario's context, where the scenario is the
    process's life: nothing is undone."""

    def add_cleanup(self, fn) -> None:
        pass


_applied = False


def _apply(run_dir: str) -> None:
    global _applied
    if _applied:  # vLLM loads plugins once per process; a second load changes nothing
        return
    _applied = True
    from testbed.integrations.vllm import engine_kernels, llm

    life = _ProcessLife()
    engine_kernels.register()
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
    llm.use_weight_experts(life)
    with open(os.path.join(run_dir, "plan.json")) as f:
        plan = json.load(f)
    if plan["start_process"]:
        _named(plan["start_process"])(run_dir)
    if plan["start_rank"]:
        _on_groups(run_dir, plan, life)


def _named(ref: str):
    """The function ``module:name`` names."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class _Steps(list):
    """The prepares :func:`llm.record_prepares` sees, one JSON line each as they come."""

    def __init__(self, path: str):
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, item) -> None:
        layer, rows, counts = item
        os.write(self._fd, (json.dumps([layer, rows, list(counts) if counts is not None else None]) + "\n").encode())


def _on_groups(run_dir: str, plan: dict, life: _ProcessLife) -> None:
    from vllm.distributed import parallel_state as ps

    formed = ps.initialize_model_parallel

    def initialize_model_parallel(*a, **k):
        out = formed(*a, **k)
        import torch.distributed as dist

        with _testbed_errors(run_dir):
            rank, world = dist.get_rank(), dist.get_world_size()
            log = _named(plan["start_rank"])(run_dir, rank, world, tuple(ps.get_ep_group().ranks))
            from testbed.integrations.vllm import llm

            llm.record_prepares(life, plan["path"], _Steps(os.path.join(run_dir, f"steps{rank}.jsonl")))
            llm.log_layers(life, log)
        return out

    ps.initialize_model_parallel = initialize_model_parallel
