"""Mutants of the installed vLLM's own source (targets under ``vllm.``): small, realistic
wrong changes the invariants must catch (applied at run time in the rank processes by
:mod:`testbed.harness.mutants`)."""

from __future__ import annotations

from testbed.integrations.base import Mutant

_m = Mutant.of
V_MGR = "vllm.distributed.device_communicators.all2all:FlashInferNVLinkOneSidedManager"
V_MGR2 = "vllm.distributed.device_communicators.all2all:FlashInferNVLinkTwoSidedManager"
V_PF = ("vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided:"
        "FlashInferNVLinkOneSidedPrepareAndFinalize")
V_OS = "vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided"
V_TS = "vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_two_sided"
V_RUNNER = "vllm.model_executor.layers.fused_moe.runner.moe_runner:MoERunner"


VLLM_CATALOGUE: tuple[Mutant, ...] = (
    # -- the shared communication's replacement rule (seed 001 in vLLM's manager) ----------------
    _m("v-first-layer-communication", "historical bug 2: the first layer's communication is kept whatever later "
       "layers need", f"{V_MGR}.initialize", "max_num_tokens <= previous_max", "True or max_num_tokens <= previous_max",
       ("workspace", "does not cover"), ("completes", "insufficient")),
    _m("v-growth-ignores-dispatch-bytes", "the replacement rule compares tokens and hidden but not dispatch bytes",
       f"{V_MGR}.initialize", "                and dispatch_bytes <= previous_bytes\n", "",
       ("workspace", "does not cover"), ("completes", "insufficient")),
    _m("v-replace-when-covered", "a layer the shared communication already covers replaces it anyway",
       f"{V_MGR}.initialize", "                return\n", "                pass\n", ("workspace", "build(s) for layer")),
    # -- barriers and communicator scope (seed 001's historical bug 3) ---------------------------
    _m("v-world-barrier-after-build", "historical bug 3: the barrier after a build runs on the world group",
       f"{V_MGR}.initialize", "        )\n        dist.barrier(group=self.cpu_group)", "        )\n        dist.barrier()",
       ("collectives", "barrier on group"), ("completes", "")),
    _m("v-no-barrier-after-build", "no barrier after the communication is built",
       f"{V_MGR}.initialize", "        )\n        dist.barrier(group=self.cpu_group)", "        )\n        pass",
       ("collectives", "not followed by a barrier")),
    _m("v-world-mnnvl-communicator", "the MNNVL handles are exchanged over the world group",
       f"{V_MGR}.initialize", "comm_backend=CustomCommunicator(self.cpu_group),",
       "comm_backend=CustomCommunicator(dist.group.WORLD),",
       ("completes", "MNNVL communicator has"), ("collectives", "all_gather_object on group")),
    # -- the step's runtime max tokens ---------------------------------------------------------
    _m("v-step-is-local-count", "each rank dispatches with its own token count as the step's max",
       f"{V_PF}.prepare", "            max(global_num_tokens_cpu)\n", "            a1.shape[0]\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "")),
    _m("v-step-is-capacity", "the step's max is the layer's capacity, not the forward's largest count",
       f"{V_PF}.prepare", "            max(global_num_tokens_cpu)\n", "            self.max_num_tokens\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank")),
    _m("v-no-dp-metadata", "the one-sided prepare never reads the DP metadata (the local count serves)",
       f"{V_OS}:get_local_sizes", "return dp_metadata.get_chunk_sizes_across_dp_rank()", "return None",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "")),
    _m("v-two-sided-step-is-local-count", "the two-sided prepare sizes its step with this rank's own count",
       f"{V_TS}:flashinfer_alltoall_dispatch", "max(global_num_tokens_cpu) if global_num_tokens_cpu is not None else",
       "x.shape[0] if global_num_tokens_cpu is not None else", ("completes", ""), ("output", "x the tolerance"),
       ("expert-load", "lanes")),
    # -- payloads --------------------------------------------------------------------------------
    _m("v-weights-not-dispatched", "the router weights stay home: the experts weight received rows with local ones",
       f"{V_PF}.prepare", "            topk_weights,\n            hidden_states_scale=dispatch_x_sf,",
       "            None,\n            hidden_states_scale=dispatch_x_sf,", ("completes", ""), ("output", "x the tolerance")),
    _m("v-scales-not-dispatched", "the activation scales are not dispatched",
       f"{V_PF}.prepare", "hidden_states_scale=dispatch_x_sf,", "hidden_states_scale=None,",
       ("completes", "NoneType"), ("output", "x the tolerance")),
    _m("v-router-weight-not-applied", "with the router weight on the input, prepare does not apply it",
       f"{V_PF}.prepare", "a1.mul_(topk_weights.to(a1.dtype))", "a1.mul_(1)", ("output", "x the tolerance")),
    # -- the reduce contract (seed 002) ----------------------------------------------------------
    _m("v-one-sided-not-reduced", "historical bug 1: the one-sided finalize claims its output is not reduced",
       f"{V_PF}.output_is_reduced", "return True", "return False", ("reduce", "output_is_reduced()")),
    _m("v-two-sided-not-reduced", "historical bug 1 on the two-sided finalize",
       f"{V_TS}:FlashInferNVLinkTwoSidedPrepareAndFinalize.output_is_reduced", "return True", "return False",
       ("reduce", "output_is_reduced()")),
    _m("v-reduce-ignores-reduced", "the runner all-reduces over TP even when the kernel's output is reduced",
       f"{V_RUNNER}._maybe_reduce_final_output", "            and not output_is_reduced\n", "",
       ("reduce", "TP all_reduce"), ("output", "x the tolerance")),
    # -- combine -----------------------------------------------------------------------------------
    _m("v-combine-without-output", "finalize combines without output=: the layer's output is never written",
       f"{V_PF}.finalize", "            output=output,\n", "", ("output", "x the tolerance")),
    _m("v-two-sided-combine-token-count", "the two-sided combine is told the received rows' count, not the layer's",
       f"{V_TS}:FlashInferNVLinkTwoSidedPrepareAndFinalize.finalize", "token_count = output.shape[0]",
       "token_count = fused_expert_output.shape[0]", ("completes", ""), ("output", "")),
    _m("v-two-sided-mapping-tp-1", "the two-sided Mapping is built with tp_size 1 instead of the EP group's size",
       f"{V_MGR2}.initialize", "            tp_size=world_size,", "            tp_size=1,", ("completes", ""),
       ("output", "x the tolerance")),
)
