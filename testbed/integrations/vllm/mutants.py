"""Mutants of the installed vLLM's own source (targets under ``vllm.``): small, realistic
wrong changes the invariants must catch (applied at run time in the rank processes by
:mod:`testbed.harness.mutants`). Written against 0.33.0; ``forms`` give the same change where
0.31.0 and 0.32.0 (whose one-sided manager drives ``MoeAlltoAll`` itself) write the code otherwise.
0.34.0's two-sided path on ``flashinfer.moe_ep`` and its experts writing into FlashInfer's
combine-input buffer have mutants of their own; so does 0.20.1 .. 0.32's sizing of the scales.
On 0.18 .. 0.23 (the MoE layer a module class) the forms follow their managers and 0.18's
prepare/finalizes beside the layer (``a|b`` targets). A probe of the release says where a mutant's
code is absent, its change is undone on every path, or a finding of the release's own already
fails every deployment it reaches the same way (``requires``, ``equivalent``, ``masked``: 0.18 ..
0.21, where VLLM-009 double-reduces, or keep the first workspace and barrier on the world, are
those mutants)."""

from __future__ import annotations

import inspect
import re

from testbed.integrations.base import Mutant

_m = Mutant.of


def _two_sided_on_mnnvl():
    from testbed.integrations.vllm.environment import two_sided_api

    return None if two_sided_api() == "mnnvl" else (
        "this vLLM's two-sided manager drives flashinfer.moe_ep (get_communication): it builds no Mapping, and "
        "its combine takes no token count (moe_ep's combine uses its dispatch's)")


def _no_flashinfer_sequence_parallel():
    from testbed.cluster.layout import ParallelLayout
    from testbed.integrations.vllm.rules import sequence_parallel

    wide = ParallelLayout.parse("4,2,2,1")
    if any(sequence_parallel(path, wide) for path in ("one_sided", "two_sided")):
        return None
    return ("no FlashInfer backend of this vLLM runs the MoE sequence parallel (its "
            "ParallelConfig.use_sequence_parallel_moe lists neither; one-sided from 0.29): the code it changes never "
            "runs on a FlashInfer all-to-all deployment")


def _two_sided_on_moe_ep():
    from testbed.integrations.vllm.environment import two_sided_api

    return None if two_sided_api() == "moe_ep" else (
        "this vLLM's two-sided path drives MnnvlMoe, not flashinfer.moe_ep's NVLinkTwoSidedAlltoAll")


def _no_one_sided_buffer():
    module = _first_module(V_OS)
    # Its own: the modular kernel's base has one that hands nothing (0.33).
    if module is not None and "allocate_fused_expert_output" in vars(module.FlashInferNVLinkOneSidedPrepareAndFinalize):
        return None
    return ("this vLLM never hands the experts FlashInfer's combine-input buffer (its one-sided prepare has no "
            "allocate_fused_expert_output): their output is the modular kernel's own, free once combined")


def _set_up_barriers_itself():
    from fakes.flashinfer.profiles import resolve
    from testbed.integrations.vllm.environment import ENGINE, one_sided_api

    pin = ENGINE.pinned()
    if one_sided_api() == "comm" and not resolve(pin).init_barrier:
        return None
    return (f"the manager's barrier after a build is redundant on this vLLM's FlashInfer ({pin}): "
            + ("its moe_ep communication barriers inside its own set-up" if one_sided_api() == "moe_ep" else
               "its MoeAlltoAll barriers after zeroing the workspace (0.7.1 on)")
            + ", so no peer can dispatch into a row before it is zeroed")


def _first_module(alternatives: str):
    """The first of ``a|b`` module names the release has, imported as the engine's probes are
    (None where vLLM cannot run here)."""
    from testbed.integrations.vllm.environment import ENGINE

    names = alternatives.split("|")
    for name in names:
        try:
            return ENGINE.module(name)
        except ModuleNotFoundError:
            if name == names[-1]:
                raise
    return None


def _finalizes_claim_not_reduced():
    """Where the release's FlashInfer prepare/finalizes already say their output is not reduced
    (0.18 .. 0.21, VLLM-009), a mutant that makes them or the runner act so changes nothing."""
    for modules, cls in ((V_OS, "FlashInferNVLinkOneSidedPrepareAndFinalize"),
                         (V_TS, "FlashInferNVLinkTwoSidedPrepareAndFinalize")):
        module = _first_module(modules)
        if module is None or not _returns_false(getattr(module, cls).output_is_reduced):
            return None
    return ("this vLLM's FlashInfer prepare/finalizes already declare output_is_reduced() False (VLLM-009), so "
            "the reduce runs whatever the change: the release is this mutant")


def _one_sided_initialize() -> str:
    """The source of the release's one-sided manager's ``initialize`` ("" where vLLM cannot run here)."""
    from testbed.integrations.vllm.environment import ENGINE

    module = ENGINE.module("vllm.distributed.device_communicators.all2all")
    return "" if module is None else inspect.getsource(module.FlashInferNVLinkOneSidedManager.initialize)


def _keeps_the_first_communication():
    """0.18 .. 0.21's one-sided manager returns at the top of ``initialize`` once initialized
    (VLLM-012): it keeps the first layer's workspace and has no replacement rule to change."""
    if re.search(r'"""[^"]*"""\s*if self\.initialized:\s*return\n', _one_sided_initialize()) is None:
        return None
    return ("this vLLM's one-sided manager keeps the first layer's workspace (initialize returns once initialized, "
            "VLLM-012): there is no replacement rule, and keeping the first is what the release does")


def _barriers_on_the_world():
    """0.18 .. 0.21's one-sided manager barriers on the world group after its build (VLLM-013)."""
    if "        dist.barrier()\n" not in _one_sided_initialize():
        return None
    return "this vLLM's one-sided manager already barriers on the world group after its build (VLLM-013)"


def _reduce_already_doubled():
    """Where the prepare/finalizes say their output is not reduced (VLLM-009), every TP > 1
    deployment already all-reduces complete outputs, which the reduce and output invariants
    report; at TP 1 a TP all-reduce is over one rank."""
    if _finalizes_claim_not_reduced() is None:
        return None
    return ("VLLM-009: this vLLM's prepare/finalizes declare output_is_reduced() False, so every TP > 1 deployment "
            "already reduces a complete output over TP (reported by the reduce and output invariants) and at TP 1 "
            "the reduce it changes is over one rank")


def _sizes_the_scales():
    """The one-sided manager adds the activation scales' bytes to the dispatch row it sizes the
    workspace for (0.20.1 .. 0.32)."""
    source = _one_sided_initialize()
    if any(f"+ {name}\n" in source for name in ("x_sf_bytes_per_token", "dispatch_scale_bytes_per_token")):
        return None
    return ("this vLLM's one-sided manager adds no scale bytes of a layer's own: before 0.20.1 it sizes an nvfp4 row "
            "whatever the layer (VLLM-011), from 0.33 moe_ep sizes the row from the communication's parameters")


def _runner_sums_the_shared_output():
    """From 0.20 the runner adds the shared experts' output; 0.18/0.19's ``MoERunner`` is an
    abstract base (``DefaultMoERunner`` returns the two apart, and the model sums them)."""

    from testbed.integrations.vllm.environment import ENGINE

    module = ENGINE.module(V_RUNNER.partition(":")[0])
    if module is None or not inspect.isabstract(module.MoERunner):
        return None
    return ("this vLLM's runner returns the shared and routed outputs apart (MoERunner is an abstract base); its "
            "models sum them")


def _reading_backwards_undoes_the_double_reduce():
    """Where the finalizes declare their output not reduced (VLLM-009), the runner reading the
    flag backwards skips the TP all-reduce that doubles it."""
    if _finalizes_claim_not_reduced() is None:
        return None
    return ("VLLM-009: this vLLM's prepare/finalizes declare output_is_reduced() False, so the runner reading it "
            "backwards skips exactly the TP all-reduce VLLM-009 doubles the output with (its reduce claim still "
            "fails every deployment) and at TP 1 reduces over one rank")


def _returns_false(function) -> bool:

    return re.search(r"return False\s*$", inspect.getsource(function)) is not None


def _one_sided_on_moe_ep():
    from testbed.integrations.vllm.environment import one_sided_api

    return None if one_sided_api() == "moe_ep" else (
        "this vLLM's one-sided prepare drives MoeAlltoAll itself: it has no moe_ep communication to ask for a "
        "combine-input buffer")


def _ids_cast_on_every_path():
    from testbed.integrations.vllm.environment import one_sided_api, two_sided_api

    if one_sided_api() == "moe_ep" and two_sided_api() == "moe_ep":
        return ("every path of this vLLM dispatches through flashinfer.moe_ep, whose dispatch casts topk_ids to "
                "int32 itself in every FlashInfer release that has it (moe_ep/nvlink.py): int64 ids are what it takes")
    return None
V_MGR = "vllm.distributed.device_communicators.all2all:FlashInferNVLinkOneSidedManager"
V_MGR2 = "vllm.distributed.device_communicators.all2all:FlashInferNVLinkTwoSidedManager"
# The prepare/finalize modules: in prepare_finalize/ from 0.19, beside the layer in 0.18 (a|b: the
# first a release has).
V_OS = ("vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided|"
        "vllm.model_executor.layers.fused_moe.flashinfer_nvlink_one_sided_prepare_finalize")
V_TS = ("vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_two_sided|"
        "vllm.model_executor.layers.fused_moe.flashinfer_nvlink_two_sided_prepare_finalize")
V_PF = f"{V_OS}:FlashInferNVLinkOneSidedPrepareAndFinalize"
V_RUNNER = "vllm.model_executor.layers.fused_moe.runner.moe_runner:MoERunner"
V_SHARED = "vllm.model_executor.layers.fused_moe.runner.shared_experts:SharedExperts"
V_ROUTER = "vllm.model_executor.layers.fused_moe.router.cpu_router:CPURouter"
V_SP_CHUNK = "vllm.model_executor.models.utils:sequence_parallel_chunk"
V_TP_GATHER = "vllm.distributed.communication_op:tensor_model_parallel_all_gather"
V_SP_SIZES = "vllm.forward_context:_compute_sp_num_tokens"
V_QUANT = "vllm.model_executor.layers.fused_moe.utils:_fp8_quantize"
# 0.31 and 0.32 barrier after building MoeAlltoAll, below this comment.
_BARRIER_0_32 = "would deadlock.\n        dist.barrier(group=self.cpu_group)"


V_DP_LOOP = "vllm.v1.engine.core:DPEngineCoreProc.run_busy_loop"

VLLM_CATALOGUE: tuple[Mutant, ...] = (
    # -- the served engine's data-parallel loop: every engine core steps while any has work -----
    _m("v-dp-wave-decided-locally", "an engine core decides alone whether the DP wave goes on (its own unfinished "
       "requests, not every core's): an idle core stops stepping dummy batches while a peer still runs forwards, "
       "whose all-to-all and DP synchronisation then wait for it", V_DP_LOOP,
       "self.engines_running = self._has_global_unfinished_reqs(",
       "self.engines_running = (lambda local_unfinished: local_unfinished)(", ("completes", "no answer within"),
       served="vLLM's DPEngineCoreProc busy loop, one per DP rank of `vllm serve`"),
    # -- the shared communication's replacement rule (seed 001 in vLLM's manager) ----------------
    _m("v-first-layer-communication", "historical bug 2: the first layer's communication is kept whatever later "
       "layers need", f"{V_MGR}.initialize", "max_num_tokens <= previous_max", "True or max_num_tokens <= previous_max",
       ("workspace", "does not cover"), ("completes", "insufficient"),
       forms=(("needed_workspace_size <= self.workspace_size\n", "True or needed_workspace_size <= self.workspace_size\n"),),
       equivalent=_keeps_the_first_communication),
    _m("v-growth-ignores-dispatch-bytes", "the replacement rule compares tokens and hidden but not dispatch bytes",
       f"{V_MGR}.initialize", "                and dispatch_bytes <= previous_bytes\n", "",
       ("workspace", "does not cover"), ("completes", "insufficient"),
       forms=(("                needed_workspace_size <= self.workspace_size\n                and ", "                "),),
       equivalent=_keeps_the_first_communication),
    _m("v-replace-when-covered", "a layer the shared communication already covers replaces it anyway",
       f"{V_MGR}.initialize", "                return\n", "                pass\n", ("workspace", "build(s) for layer"),
       ("workspace", "builds after layer"), equivalent=_keeps_the_first_communication),
    # -- barriers and communicator scope (seed 001's historical bug 3) ---------------------------
    _m("v-sized-without-scales", "the one-sided workspace is sized for the dispatch row without its activation "
       "scales", f"{V_MGR}.initialize", "            + x_sf_bytes_per_token\n", "", ("workspace", "does not cover"),
       ("completes", "insufficient"), forms=(("            + dispatch_scale_bytes_per_token\n", ""),),
       requires=_sizes_the_scales),
    _m("v-world-barrier-after-build", "historical bug 3: the barrier after a build runs on the world group",
       f"{V_MGR}.initialize", "        )\n        dist.barrier(group=self.cpu_group)", "        )\n        dist.barrier()",
       ("collectives", "barrier on group"), ("completes", ""),
       forms=((_BARRIER_0_32, "would deadlock.\n        dist.barrier()"),), equivalent=_barriers_on_the_world),
    _m("v-no-barrier-after-build", "no barrier after the communication is built",
       f"{V_MGR}.initialize", "        )\n        dist.barrier(group=self.cpu_group)", "        )\n        pass",
       ("collectives", "not followed by a barrier"),
       # 0.18 .. 0.21: the world barrier (VLLM-013) is the one after the build.
       forms=((_BARRIER_0_32, "would deadlock.\n        pass"), ("        dist.barrier()\n", "        pass\n")),
       equivalent=_set_up_barriers_itself),
    _m("v-world-mnnvl-communicator", "the MNNVL handles are exchanged over the world group",
       f"{V_MGR}.initialize", "comm_backend=CustomCommunicator(self.cpu_group),",
       "comm_backend=CustomCommunicator(dist.group.WORLD),",
       ("completes", "MNNVL communicator has"), ("collectives", "all_gather_object on group"),
       # 0.18/0.19 exchange them over the DP group (VLLM-010).
       forms=(("comm_backend=CustomCommunicator(get_dp_group().cpu_group),",
               "comm_backend=CustomCommunicator(dist.group.WORLD),"),)),
    # -- the step's runtime max tokens ---------------------------------------------------------
    _m("v-step-is-local-count", "each rank dispatches with its own token count as the step's max",
       f"{V_PF}.prepare", "            max(global_num_tokens_cpu)\n", "            a1.shape[0]\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "")),
    _m("v-step-is-capacity", "the step's max is the layer's capacity, not the forward's largest count",
       f"{V_PF}.prepare", "            max(global_num_tokens_cpu)\n", "            self.max_num_tokens\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank")),
    _m("v-no-dp-metadata", "the one-sided prepare never reads the DP metadata (the local count serves)",
       f"{V_OS}:get_local_sizes", "return dp_metadata.get_chunk_sizes_across_dp_rank()", "return None",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", ""),
       forms=(("return get_forward_context().dp_metadata.get_chunk_sizes_across_dp_rank()", "return None"),)),
    _m("v-two-sided-step-is-local-count", "the two-sided prepare sizes its step with this rank's own count",
       f"{V_TS}:flashinfer_alltoall_dispatch", "max(global_num_tokens_cpu) if global_num_tokens_cpu is not None else",
       "x.shape[0] if global_num_tokens_cpu is not None else", ("completes", ""), ("output", "x the tolerance"),
       ("expert-load", "lanes")),
    # -- payloads --------------------------------------------------------------------------------
    _m("v-weights-not-dispatched", "the router weights stay home: the experts weight received rows with local ones",
       f"{V_PF}.prepare", "            topk_weights,\n            hidden_states_scale=dispatch_x_sf,",
       "            None,\n            hidden_states_scale=dispatch_x_sf,", ("completes", ""), ("output", "x the tolerance"),
       forms=(("payloads.append(topk_weights)", "payloads.append(torch.ones_like(topk_weights))"),)),
    _m("v-scales-not-dispatched", "the activation scales are not dispatched",
       f"{V_PF}.prepare", "hidden_states_scale=dispatch_x_sf,", "hidden_states_scale=None,",
       ("completes", "NoneType"), ("output", "x the tolerance"),
       forms=(("payloads.append(dispatch_x_sf)", "payloads.append(torch.zeros_like(dispatch_x_sf))"),
              ("payloads.append(a1q_scale)", "payloads.append(torch.zeros_like(a1q_scale))"))),
    _m("v-router-weight-not-applied", "with the router weight on the input, prepare does not apply it",
       f"{V_PF}.prepare", "a1.mul_(topk_weights.to(a1.dtype))", "a1.mul_(1)", ("output", "x the tolerance")),
    # -- the reduce contract (seed 002) ----------------------------------------------------------
    _m("v-one-sided-not-reduced", "historical bug 1: the one-sided finalize claims its output is not reduced",
       f"{V_PF}.output_is_reduced", "return True", "return False", ("reduce", "output_is_reduced()"),
       equivalent=_finalizes_claim_not_reduced),
    _m("v-two-sided-not-reduced", "historical bug 1 on the two-sided finalize",
       f"{V_TS}:FlashInferNVLinkTwoSidedPrepareAndFinalize.output_is_reduced", "return True", "return False",
       ("reduce", "output_is_reduced()"), equivalent=_finalizes_claim_not_reduced),
    _m("v-reduce-ignores-reduced", "the runner all-reduces over TP even when the kernel's output is reduced",
       f"{V_RUNNER}._maybe_reduce_final_output", "            and not output_is_reduced\n", "",
       ("reduce", "TP all_reduce"), ("output", "x the tolerance"),
       forms=(("            and not self._fused_output_is_reduced\n", ""),), equivalent=_finalizes_claim_not_reduced),
    # -- combine -----------------------------------------------------------------------------------
    _m("v-combine-without-output", "finalize hands combine a scratch tensor as output=: the layer's output is "
       "never written", f"{V_PF}.finalize", "            output=output,\n",
       "            output=torch.empty_like(output),\n", ("output", "x the tolerance"),
       # 0.24, 0.25: finalize copies combine's result into the layer's output itself.
       forms=(("        output.copy_(combined_output)", "        torch.empty_like(output).copy_(combined_output)"),)),
    # -- the experts' output in FlashInfer's combine-input buffer (0.34 on a GPU) -------------------
    _m("v-buffer-cleared-after-combine", "finalize clears the experts' output after the combine for the next "
       "round: on a GPU that output is FlashInfer's combine-input buffer, which a peer may still be reading",
       f"{V_PF}.finalize", "            output=output,\n        )", "            output=output,\n        )\n"
       "        fused_expert_output.zero_()", ("round-ordering", "wrote into the workspace"),
       equivalent=_no_one_sided_buffer),
    _m("v-buffer-fetched-before-dispatch", "the prepare fetches the experts' output buffer before its dispatch "
       "(to overlap the allocation with the exchange): the buffer FlashInfer hands for a round is asked for "
       "outside it", f"{V_PF}.prepare", "        communication = self.all2all_manager.get_communication()\n"
       "        received = communication.dispatch(",
       "        communication = self.all2all_manager.get_communication()\n"
       "        communication.get_combine_input_buffer(torch.bfloat16)\n        received = communication.dispatch(",
       ("completes", "get_combine_input_buffer called before dispatch"), requires=_one_sided_on_moe_ep),
    _m("v-two-sided-combine-token-count", "the two-sided combine is told the received rows' count, not the layer's",
       f"{V_TS}:FlashInferNVLinkTwoSidedPrepareAndFinalize.finalize", "token_count = output.shape[0]",
       "token_count = fused_expert_output.shape[0]", ("completes", ""), ("output", ""), requires=_two_sided_on_mnnvl),
    _m("v-two-sided-mapping-tp-1", "the two-sided Mapping is built with tp_size 1 instead of the EP group's size",
       f"{V_MGR2}.initialize", "            tp_size=world_size,", "            tp_size=1,", ("completes", ""),
       ("output", "x the tolerance"), requires=_two_sided_on_mnnvl),
    # -- the two-sided path on flashinfer.moe_ep (0.34) ---------------------------------------------
    _m("v-two-sided-combine-discarded", "the two-sided finalize combines without output= and drops the result: the "
       "layer's output is never written", f"{V_TS}:flashinfer_alltoall_combine",
       "    return communication.combine(fused_expert_output, output=output)",
       "    communication.combine(fused_expert_output)\n    return output", ("output", "x the tolerance"),
       requires=_two_sided_on_moe_ep),
    _m("v-two-sided-invalid-id-real-expert", "the two-sided communication marks padding rows with expert 0, a real "
       "expert, instead of num_experts, which no rank owns", f"{V_MGR2}.get_communication",
       "            invalid_expert_id=num_experts,", "            invalid_expert_id=0,", ("expert-load", "lanes"),
       ("output", "x the tolerance"), ("completes", ""), requires=_two_sided_on_moe_ep),
    # -- one level up: vLLM's MoERunner, its sequence-parallel context and the model's chunking --
    _m("r-shared-reduced-under-sp", "the runner all-reduces the shared experts' output under sequence parallel, "
       "where vLLM's models replicate them", f"{V_RUNNER}._maybe_reduce_shared_expert_output",
       "            and not self.moe_config.is_sequence_parallel\n", "", ("reduce", "TP all_reduce"),
       ("output", "x the tolerance"),
       equivalent=_no_flashinfer_sequence_parallel),
    _m("r-shared-not-reduced", "the TP-sharded shared output is reduced only when the routed one is not",
       f"{V_RUNNER}._maybe_reduce_shared_expert_output", "            and fused_output_is_reduced\n",
       "            and not fused_output_is_reduced\n", ("reduce", "TP all_reduce"), ("output", "x the tolerance"),
       forms=(("            and self._fused_output_is_reduced\n", "            and not self._fused_output_is_reduced\n"),),
       masked=_reduce_already_doubled),
    _m("r-fused-reduced-inverted", "the runner reads the kernel's output_is_reduced() backwards",
       f"{V_RUNNER}._fused_output_is_reduced", "            and self._quant_method.moe_kernel.output_is_reduced()",
       "            and not self._quant_method.moe_kernel.output_is_reduced()", ("reduce", ""),
       ("output", "x the tolerance"),
       # 0.20.0: the runner's quant_method not yet private.
       forms=(("            and self.quant_method.moe_kernel.output_is_reduced()",
               "            and not self.quant_method.moe_kernel.output_is_reduced()"),),
       masked=_reading_backwards_undoes_the_double_reduce),
    _m("r-routed-scale-dropped", "routed_scaling_factor is applied only where it is 1",
       f"{V_RUNNER}._maybe_apply_routed_scale_to_output", "        if self.routed_scaling_factor != 1.0:",
       "        if self.routed_scaling_factor == 1.0:", ("output", "x the tolerance")),
    _m("r-shared-output-dropped", "the runner returns the routed output without the shared experts'",
       f"{V_RUNNER}.forward", "            result = shared_output + fused_output",
       "            result = fused_output", ("output", "x the tolerance"), requires=_runner_sums_the_shared_output),
    _m("r-shared-never-run", "the shared experts run in no order (the order test is inverted)",
       # SharedExperts.apply before it was forward (0.20 .. 0.2x).
       f"{V_SHARED}.forward|SharedExperts.apply", "        if order != experts_order:", "        if order == experts_order:",
       ("completes", ""), ("output", "x the tolerance")),
    _m("r-sp-sizes-unchunked", "the runner's sequence-parallel context counts each DP rank's tokens unchunked",
       f"{V_RUNNER}._sequence_parallel_context", "                self.moe_config.sp_size,", "                1,",
       ("runtime-max-tokens", ""), ("completes", ""),
       # 0.29 and 0.30 pass the SP size alone.
       forms=(("sp_local_sizes(self.moe_config.sp_size)", "sp_local_sizes(1)"),),
       equivalent=_no_flashinfer_sequence_parallel),
    _m("r-sp-sizes-floor", "the sequence-parallel chunk sizes round down instead of up",
       V_SP_SIZES, "        num_tokens_across_dp_cpu + sequence_parallel_size - 1\n",
       "        num_tokens_across_dp_cpu\n", ("runtime-max-tokens", ""), ("completes", ""),
       equivalent=_no_flashinfer_sequence_parallel),
    # (sequence_parallel_chunk_impl itself is a registered op: a mutant of it would not reach the op.)
    _m("r-sp-chunk-skipped", "the model's sequence-parallel chunk hands every TP rank all the tokens",
       V_SP_CHUNK, "    return torch.ops.vllm.sequence_parallel_chunk_impl(x)", "    return x",
       ("runtime-max-tokens", ""), ("completes", ""), ("expert-load", "lanes"),
       equivalent=_no_flashinfer_sequence_parallel),
    _m("r-sp-gather-skipped", "the TP all-gather after a sequence-parallel layer returns this rank's chunk",
       V_TP_GATHER, "    return get_tp_group().all_gather(input_, dim)", "    return input_",
       ("output", ""), ("completes", ""),
       equivalent=_no_flashinfer_sequence_parallel),
    _m("r-nvfp4-scales-not-interleaved", "the one-sided prepare leaves received nvfp4 scales linear where the "
       "experts read them 128x4-interleaved", f"{V_PF}.prepare",
       'if quant_config.quant_dtype == "nvfp4" and quant_config.is_scale_swizzled:',
       'if quant_config.quant_dtype == "nvfp4" and not quant_config.is_scale_swizzled:',
       ("output", "x the tolerance"), ("completes", ""),
       forms=(("and quant_config.is_nvfp4_scale_swizzled\n", "and not quant_config.is_nvfp4_scale_swizzled\n"),)),
    # -- the router hand-off and the layer's quantize ---------------------------------------------
    _m("r-router-ids-int64", "the CPU router hands the custom function's ids on as int64",
       f"{V_ROUTER}._compute_routing", "            topk_ids = topk_ids.to(torch.int32).contiguous()",
       "            topk_ids = topk_ids.to(torch.int64).contiguous()", ("completes", ""),
       equivalent=_ids_cast_on_every_path),
    _m("r-router-weights-dropped", "the CPU router replaces the custom function's weights by ones",
       f"{V_ROUTER}._compute_routing", "            topk_weights = topk_weights.to(torch.float32).contiguous()",
       "            topk_weights = torch.ones_like(topk_weights, dtype=torch.float32)", ("output", "x the tolerance")),
    _m("r-fp8-block-size", "the blockwise FP8 activations are quantized in groups of twice the weight block",
       V_QUANT, "            A, block_k, column_major_scales=is_scale_transposed",
       "            A, 2 * block_k, column_major_scales=is_scale_transposed", ("completes", ""), ("output", ""),
       forms=(("per_token_group_quant_fp8(A, block_k)", "per_token_group_quant_fp8(A, 2 * block_k)"),)),
)
