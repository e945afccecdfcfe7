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

import os

from fakes.accelerator import DEVICES_ENV
from testbed.integrations import served


def plugin() -> None:
    """vLLM's general-plugin hook (only where the run stands in accelerators for vLLM)."""
    if os.environ.get(DEVICES_ENV):
        served.apply_once(_glue, _on_groups)


def _glue() -> None:
    from testbed.integrations.vllm import engine_kernels, llm

    engine_kernels.register()
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
    llm.use_weight_experts(served.ProcessLife())


def _on_groups(run_dir: str, plan: dict) -> None:
    from vllm.distributed import parallel_state as ps

    life = served.ProcessLife()
    formed = ps.initialize_model_parallel

    def initialize_model_parallel(*a, **k):
        out = formed(*a, **k)
        import torch.distributed as dist

        with served.testbed_errors(run_dir):
            rank, world = dist.get_rank(), dist.get_world_size()
            log = served.named(plan["start_rank"])(run_dir, rank, world, tuple(ps.get_ep_group().ranks))
            from testbed.integrations.vllm import llm

            llm.record_prepares(life, plan["path"], served.Steps(run_dir, rank))
            llm.log_layers(life, log)
        return out

    ps.initialize_model_parallel = initialize_model_parallel
