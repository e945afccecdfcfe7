"""vLLM as an integration: the installed vLLM's own FlashInfer all-to-all code.

Private modules: :mod:`.adapter` (vLLM's managers, prepare/finalize builder and modular kernel
on a rank), :mod:`.layer` (its MoE layer through its factory, 0.24 on) and :mod:`.moe_class` (its
``FusedMoE`` module class, 0.18 .. 0.23), :mod:`.environment` (the engine: install, probe, preload, and the CPU glue),
:mod:`.rules` (what vLLM's classes can run here), :mod:`.matrix`, :mod:`.fuzz`,
:mod:`.mutants` (of vLLM's own source), :mod:`.findings` (docs/findings.md's VLLM-* and
FI-RACE), :mod:`.consumer` (the files the consumer contract reads) and :mod:`.preload`.
"""

from __future__ import annotations

from testbed.integrations.base import Integration, Traits, sglang_flags_elsewhere
from testbed.integrations.vllm.environment import ENGINE, code, one_sided_combine_output


class VllmIntegration(Integration):
    name = "vllm"
    summary = ("the installed vLLM's own MoE layer (FusedMoEFactory -> MoERunner: router, quant method, "
               "prepare/finalize, shared experts, reduces), or with --level kernel its prepare/finalize and "
               "modular kernel alone")
    engine = ENGINE
    levels = ("layer", "kernel")

    def api(self, sc):
        # Each manager drives what the release writes it for (a probe of its code): one-sided,
        # MoeAlltoAll or moe_ep; two-sided, comm's MnnvlMoe or moe_ep (0.34).
        from testbed.integrations.vllm.environment import one_sided_api, two_sided_api

        if sc.path == "one_sided":
            return one_sided_api()
        if sc.path == "two_sided":
            return "comm" if two_sided_api() == "mnnvl" else "moe_ep"
        return None

    def refusal(self, sc):
        from testbed.integrations.vllm.rules import vllm_rule

        return vllm_rule(sc) or sglang_flags_elsewhere(sc)

    def engine_passes(self, sc):
        from testbed.integrations.vllm.rules import engine_passes

        return engine_passes(sc)

    def traits(self, sc) -> Traits:
        # vLLM's one-sided manager shares one communication, grows it and barriers itself.
        one_sided = sc.path == "one_sided"
        layer = sc.level == "layer"
        return Traits(shared_communication=one_sided, code=code(), combine_output=one_sided_combine_output(),
                      sp_pads_routed=layer, shared_tp_sharded=layer, expert_output_by_scenario=False)

    def start(self, ctx, sc, api, log):
        from testbed.integrations.vllm.adapter import VllmSession

        return VllmSession(ctx, sc, api, log)

    def matrix(self):
        from testbed.integrations.vllm.matrix import VLLM_MATRIX

        return VLLM_MATRIX

    def strategy(self):
        from testbed.integrations.vllm.fuzz import vllm_scenarios

        return vllm_scenarios()

    def mutants(self):
        from testbed.integrations.vllm.mutants import VLLM_CATALOGUE

        return VLLM_CATALOGUE

    def findings(self):
        from testbed.integrations.vllm.findings import FINDINGS

        return FINDINGS

    def consumer(self):
        return self.engine.consumer

    def engine_matrix(self):
        from testbed.integrations.vllm.matrix import ENGINE_MATRIX

        return ENGINE_MATRIX

    def engine_code(self):
        from testbed.integrations.vllm.environment import MOE_CODE

        return code(MOE_CODE)

    def run_engine(self, ctx, sc, es, model_dir, log, reference):
        from testbed.integrations.vllm.llm import run_engine

        return run_engine(ctx, sc, es, model_dir, log, reference)


INTEGRATION = VllmIntegration()
