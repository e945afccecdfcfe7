"""Mutants of ``impl``: small, realistic wrong changes, applied at run time in the rank processes.

A mutant replaces one exact piece of one ``impl`` function's source and recompiles that
function in its module (the file name and line numbers stay the real ones, so call sites and
stacks still point into ``impl/``). A replacement that does not match exactly once is a
broken mutant (:class:`MutantError`), never a "killed" one. ``expect`` says how the testbed
must catch it: the name of an invariant (:mod:`testbed.scenario.invariants`) and a piece of
its evidence; a scenario failing for another reason does not count. What scenarios cannot
reach (a refusal of bad input, a checkpoint) names the tests that must fail instead:
``("tests", name)`` with ``tests`` their pytest ids, run with ``A2A_MUTANT`` set.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Callable


class MutantError(RuntimeError):
    """A mutant that cannot be applied as written (its source no longer matches ``impl``)."""


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    target: str  # "impl.module:Function" or "impl.module:Class.method"
    old: str
    new: str
    expect: tuple[tuple[str, str], ...]  # (invariant or "tests", evidence substring): any one kills it
    tests: tuple[str, ...] = ()  # pytest ids, relative to the repository root
    integration: str = "impl"  # whose code it changes (testbed.integrations), and so which matrix hunts it

    @property
    def needs_scenarios(self) -> bool:
        return any(kind != "tests" for kind, _ in self.expect)


def _m(name, description, target, old, new, *expect, tests=(), integration="impl") -> Mutant:
    return Mutant(name, description, target, old, new, tuple(expect), tuple(tests), integration)


def _v(name, description, target, old, new, *expect) -> Mutant:
    """A mutant of the installed vLLM's own source (``target`` under ``vllm.``)."""
    return _m(name, description, target, old, new, *expect, integration="vllm")


def _s(name, description, target, old, new, *expect) -> Mutant:
    """A mutant of the installed SGLang's own source (``target`` under ``sglang.``)."""
    return _m(name, description, target, old, new, *expect, integration="sglang")


UNITS, ONE_SIDED_TESTS = "tests/test_impl_units.py", "tests/test_impl_one_sided.py"


OS, MGR = "impl.one_sided", "impl.one_sided:OneSidedManager"
PF = "impl.one_sided:OneSidedPrepareFinalize"
LAYER = "impl.moe_layer:MoELayer"
EP_MGR, EP_PF = "impl.moe_ep:MoeEpManager", "impl.moe_ep:MoeEpPrepareFinalize"
CATALOGUE: tuple[Mutant, ...] = (
    # -- workspace growth (seed 001) --------------------------------------------------------
    _m("first-layer-workspace", "historical bug 2: the workspace is built for the first layer and never grown",
       f"{MGR}.initialize", "        payload = self.workspace_size_for(",
       "        if self.initialized:\n            return\n        payload = self.workspace_size_for(",
       ("workspace", "does not cover"), ("completes", "workspace insufficient")),
    _m("workspace-latest-layer", "the workspace is set to the latest layer's need instead of the largest",
       f"{MGR}.initialize", "self.payload_size = max(self.payload_size, payload)",
       "self.payload_size = payload", ("workspace", "")),
    _m("aux-at-layer-budget", "each layer's need is taken with the auxiliary region of its own budget",
       f"{MGR}.initialize", "needed = self.aux_size_for(max_tokens) + self.payload_size",
       "needed = self.aux_size_for(max_num_tokens) + self.payload_size",
       ("workspace", "does not cover"), ("completes", "workspace insufficient")),
    _m("token-budget-of-first-layer", "the token budget stays the first layer's",
       f"{MGR}.initialize", "max_tokens = max(self.max_num_tokens, max_num_tokens)",
       "max_tokens = self.max_num_tokens or max_num_tokens", ("workspace", "max_num_tokens")),
    _m("max-tokens-latest-layer", "the token budget is set to the latest layer's instead of the largest",
       f"{MGR}.initialize", "max_tokens = max(self.max_num_tokens, max_num_tokens)",
       "max_tokens = max_num_tokens", ("workspace", "")),
    _m("rebuild-on-equal-need", "a layer whose need equals the current size rebuilds anyway",
       f"{MGR}.initialize", "needed <= self.workspace_size and max_num_tokens", "needed < self.workspace_size and max_num_tokens",
       ("workspace", "builds")),
    _m("combine-bytes-8bit", "the combine region is sized for 1 byte per hidden value",
       f"{OS}:combine_bytes_per_token", "return hidden_size * 2", "return hidden_size",
       ("workspace", "does not cover"), ("completes", "workspace insufficient")),
    _m("dispatch-bytes-without-scales", "the dispatch payload is sized without the activation scales",
       f"{OS}:dispatch_bytes_per_token", "return x_bytes_per_token + x_sf_bytes_per_token +",
       "return x_bytes_per_token +", ("workspace", "does not cover")),
    _m("dispatch-bytes-without-weights", "the dispatch payload is sized without the router weights",
       f"{OS}:dispatch_bytes_per_token", "+ top_k * ID_BYTES + top_k * WEIGHT_BYTES", "+ top_k * ID_BYTES",
       ("workspace", "does not cover")),
    _m("workspace-for-one-rank", "the workspace is sized for an EP group of one rank",
       f"{MGR}.workspace_size_for", "self.world_size, max_num_tokens,", "1, max_num_tokens,",
       ("workspace", "does not cover")),
    # -- barrier scope (seed 001) ------------------------------------------------------------
    _m("world-barrier-rebuild", "historical bug 3: the rebuild barrier runs on the world group",
       f"{MGR}._barrier_after_build", "dist.barrier(group=self.cpu_group)", "dist.barrier()",
       ("collectives", "barrier on group")),
    _m("no-barrier-after-rebuild", "no barrier after the MoeAlltoAll is rebuilt",
       f"{MGR}.initialize", "        self._build()\n        self._barrier_after_build()\n",
       "        self._build()\n", ("collectives", "not followed by a barrier")),
    _m("barrier-before-rebuild", "the barrier runs before the rebuild instead of after it",
       f"{MGR}.initialize", "        self.cleanup()\n        self._build()\n        self._barrier_after_build()\n",
       "        self._barrier_after_build()\n        self.cleanup()\n        self._build()\n",
       ("collectives", "not followed by a barrier")),
    _m("communicator-world-barrier", "FlashInfer's communicator barriers on the world group",
       "impl.communicator:_GroupCommunicator.barrier", "dist.barrier(group=self.group)", "dist.barrier()",
       ("collectives", "barrier on group")),
    _m("communicator-world-allgather", "FlashInfer's communicator gathers over the world group",
       "impl.communicator:_GroupCommunicator.allgather", "dist.all_gather_object(out, data, group=self.group)",
       "dist.all_gather_object(out, data)", ("collectives", "all_gather_object on group")),
    # -- capability probe (seed 000) ---------------------------------------------------------
    _m("unprobed-output", "historical bug 4: combine(output=) passed without asking FlashInfer",
       f"{MGR}._build", "self.combine_supports_output = supports_kw(",
       "self.combine_supports_output = True or supports_kw(",
       ("probe", "output="), ("completes", "unexpected keyword argument 'output'")),
    _m("probe-allows-var-kwargs", "the probe counts **kwargs as accepting output=",
       f"{MGR}._build", "allow_var_kwargs=False)", "allow_var_kwargs=True)", ("probe", "output=")),
    _m("probe-without-fallback", "a combine without an inspectable signature crashes the probe",
       f"{MGR}._build", "except (TypeError, ValueError):", "except ValueError:",
       ("completes", "in __signature__ attribute")),
    _m("probe-counts-positional-only", "the probe counts a positional-only output as a keyword",
       "impl.compat:supports_kw", "if param is not None and param.kind in _PASSABLE_BY_NAME:",
       "if param is not None:", ("completes", "positional-only arguments passed as keyword"), ("probe", "output=")),
    _m("never-output-kw", "combine_into never passes output=, even where combine takes it",
       f"{MGR}.combine_into", "if self.combine_supports_output:", "if False:", ("probe", "output=")),
    _m("combine-result-dropped", "without output=, combine's result is not copied into the output",
       f"{MGR}.combine_into", "output_TH.copy_(self.moe_alltoall.combine(", "(self.moe_alltoall.combine(",
       ("output", "")),
    # -- the reduce contract (seed 002) ------------------------------------------------------
    _m("double-reduce-one-sided", "historical bug 1: one-sided output_is_reduced() says False (MoeAlltoAll "
       "and moe_ep)", "impl.one_sided:OneSidedLayer.output_is_reduced", "return True", "return False",
       ("reduce", "output_is_reduced")),
    _m("double-reduce-two-sided", "historical bug 1 on the two-sided path",
       "impl.two_sided:TwoSidedPrepareFinalize.output_is_reduced", "return True", "return False",
       ("reduce", "output_is_reduced")),
    _m("reduce-ignores-contract", "the MoE layer all-reduces over TP whatever output_is_reduced() says",
       "impl.moe_layer:MoELayer._finalized", "reduce=self.reduce_pending)", "reduce=True)",
       ("reduce", "all_reduce")),
    _m("router-weight-not-applied", "prepare ignores apply_router_weight_on_input",
       f"{OS}:check_prepare_inputs", "        a1 = scale_input_by_router_weight(a1, topk_weights, topk_ids)\n",
       "        pass\n", ("output", "")),
    # -- layout and quantizers (seed 003) ----------------------------------------------------
    _m("nvfp4-scale-width", "the nvfp4 layout counts one scale per 32 values",
       "impl.formats:dispatch_layout", "DispatchLayout(hidden // 2, hidden // NVFP4_BLOCK)",
       "DispatchLayout(hidden // 2, hidden // 32)", ("workspace", "does not cover"),
       ("completes", "disagrees")),
    _m("fp8-scale-bytes", "the DeepSeek fp8 layout counts 1 byte per fp32 scale",
       "impl.formats:dispatch_layout", "hidden // FP8_BLOCK * torch.float32.itemsize", "hidden // FP8_BLOCK",
       ("workspace", "does not cover"), ("completes", "disagrees"), ("completes", "to be a multiple of 4 bytes")),
    _m("nvfp4-nibble-order", "the nvfp4 quantizer packs the first value of a pair in the high nibble",
       "impl.quant:quantize_nvfp4", "packed = codes[:, 0::2] | (codes[:, 1::2] << 4)",
       "packed = (codes[:, 0::2] << 4) | codes[:, 1::2]", ("output", "")),
    _m("mxfp8-scale-floor", "the mxfp8 scale exponent rounds down, so block maxima saturate",
       "impl.quant:quantize_mxfp8", "exp = torch.ceil(torch.log2(", "exp = torch.floor(torch.log2(",
       ("output", "")),
    # -- runtime max tokens and 0-token ranks ------------------------------------------------
    _m("rtm-local-count", "the runtime max tokens per rank is the local count, not the DP max",
       "impl.forward_context:runtime_max_tokens_per_rank",
       "return max(max(counts) if counts is not None else local_num_tokens, 1)",
       "return max(local_num_tokens, 1)", ("runtime-max-tokens", "")),
    _m("rtm-one-extra", "the runtime max tokens per rank is one more than the DP max",
       "impl.forward_context:runtime_max_tokens_per_rank",
       "return max(max(counts) if counts is not None else local_num_tokens, 1)",
       "return max(max(counts) + 1 if counts is not None else local_num_tokens, 1)",
       ("runtime-max-tokens", "")),
    _m("rtm-without-floor", "a pass where no rank has tokens dispatches with runtime max 0",
       "impl.forward_context:runtime_max_tokens_per_rank",
       "return max(max(counts) if counts is not None else local_num_tokens, 1)",
       "return max(counts) if counts is not None else local_num_tokens",
       ("completes", "runtimeMaxTokensPerRank > 0")),
    _m("skip-empty-rank", "a rank without tokens skips the all-to-all (its peers wait for it)",
       "impl.moe_layer:MoELayer.forward", "        prepared = pf.prepare(",
       "        if T == 0:\n            return MoEOutput(torch.zeros_like(x_TH), shared)\n        prepared = pf.prepare(",
       ("collectives", "moe_a2a_dispatch"), ("completes", "CollectiveMismatchError")),
    _m("two-sided-rtm-local", "the two-sided prepare sizes its exchange from the local count",
       "impl.two_sided:TwoSidedPrepareFinalize.prepare", "M = runtime_max_tokens_per_rank(a1.size(0))",
       "M = max(a1.size(0), 1)", ("completes", "max_token_count_per_rank differs across the EP group")),
    # -- payload order and the expert-id sentinel --------------------------------------------
    _m("ids-weights-swapped", "ids and weights swapped in the dispatch payload list",
       f"{PF}.prepare", "+ [topk_ids, topk_weights]", "+ [topk_weights, topk_ids]",
       ("completes", "expert_ids must be int32")),
    _m("ids-index-off-by-one", "the expert-id payload index points at the weights",
       f"{PF}.prepare", "ids_index = len(payloads) - 2", "ids_index = len(payloads) - 1",
       ("completes", "expert_ids must be int32")),
    _m("sentinel-zero", "stale received rows are marked with expert 0 instead of -1",
       f"{PF}.prepare", "invalid_token_expert_id=self.invalid_expert_id", "invalid_token_expert_id=0",
       ("expert-load", "")),
    _m("no-sanitize", "stale received rows keep the expert ids of an earlier round",
       f"{PF}.prepare", "invalid_token_expert_id=self.invalid_expert_id, ", "", ("expert-load", "")),
    # -- sequence parallel (seed 003) -------------------------------------------------------
    _m("sp-no-gather", "under sequence parallel the chunks are not all-gathered over TP",
       f"{LAYER}.__call__", "        return all_gatherv(self._finalized(out, len(rows)), sizes, self.tp_group)\n",
       "        return self._finalized(out, len(rows))\n", ("output", "")),
    _m("sp-not-split", "under sequence parallel every TP rank routes all of its DP rank's tokens",
       f"{LAYER}.__call__", "rows = sp_chunk(T, tp_size, tp_rank)", "rows = range(T)",
       ("expert-load", ""), ("output", ""), ("completes", "forward context")),
    _m("sp-sizes-ignored", "the dispatching ranks' counts ignore the sequence-parallel split",
       "impl.forward_context:token_counts_per_rank", "return sp if sp is not None else num_tokens_across_dp()",
       "return num_tokens_across_dp()", ("runtime-max-tokens", ""), ("completes", "one token count per rank")),
    _m("agrs-gathers-over-dp-under-sp", "all-gather/reduce-scatter stays on the DP group under sequence parallel",
       "impl.factory:make_prepare_finalize", "AllGatherReduceScatter(ep_group if parallel.use_sequence_parallel_moe",
       "AllGatherReduceScatter(dp_group if parallel.use_sequence_parallel_moe", ("completes", ""),
       ("output", "")),
    # -- the reduce contract's other side: all-gather/reduce-scatter, expert parallel off -----
    _m("agrs-claims-reduced", "all-gather/reduce-scatter says its output is reduced (the TP reduce is skipped)",
       "impl.gather:AllGatherReduceScatter.output_is_reduced", "return False", "return True",
       ("reduce", "output_is_reduced")),
    _m("no-ep-claims-reduced", "expert parallel off says its output is reduced (the TP reduce is skipped)",
       "impl.gather:LocalPrepareFinalize.output_is_reduced", "return False", "return True",
       ("reduce", "output_is_reduced")),
    _m("reduce-scatter-keeps-all", "the reduce-scatter hands back the first rank's rows on every rank",
       "impl.collectives:reduce_scatterv", "start = sum(sizes[:me])", "start = 0", ("output", "")),
    # -- the output contract and deferred finalize (seed 004) --------------------------------
    _m("defer-at-tp1", "historical bug 6: deferral ignores the TP > 1 guard",
       "impl.parallel:ParallelConfig.use_deferred_moe_finalize", "self.defer_moe_finalize and self.moe_tp_size > 1",
       "self.defer_moe_finalize", ("finalize", "")),
    _m("defer-on-empty-rank", "historical bug 6: a 0-token rank defers too",
       f"{LAYER}.forward", "self.parallel.use_deferred_moe_finalize and T > 0 and",
       "self.parallel.use_deferred_moe_finalize and", ("finalize", ""), ("completes", "0 tokens")),
    _m("topk-reduce-unweighted", "the consumer's top-k reduce ignores the expert weights",
       "impl.moe_output:topk_reduce", "routed.expert_weights.float()[hit][:, None] * rows", "rows",
       ("output", "")),
    _m("scaling-dropped", "the consumer drops the routed scaling factor",
       "impl.moe_output:finalize_moe_output", "y_TH = routed * float(out.routed_scaling_factor)", "y_TH = routed",
       ("output", "")),
    _m("scaling-on-shared", "the routed scaling factor is applied after the shared add",
       "impl.moe_output:finalize_moe_output", "        y_TH += out.shared_output.float()\n",
       "        y_TH = (routed + out.shared_output.float()) * float(out.routed_scaling_factor)\n",
       ("output", "")),
    _m("shared-output-dropped", "the layer leaves the shared experts' output out of its MoEOutput",
       f"{LAYER}.forward", "        return MoEOutput(routed, shared, cfg.routed_scaling_factor)",
       "        return MoEOutput(routed, None, cfg.routed_scaling_factor)", ("output", "")),
    # -- experts writing into the workspace, and the TRT-LLM experts ---------------------------
    _m("workspace-staging-copy", "expert output in the workspace is still combined through a staging copy",
       f"{PF}.finalize", "payload_in_workspace=in_workspace is not None)", "payload_in_workspace=False)",
       ("expert-output", "payload_in_workspace")),
    _m("trtllm-offset-zero", "the TRT-LLM experts are told their first local expert is 0",
       "impl.experts:TrtLlmExperts.__call__", "local_expert_offset=self.local_expert_offset,",
       "local_expert_offset=0,", ("output", "")),
    _m("trtllm-gate-rows-unordered", "bf16 gemm1 weights skip the gated-activation row reorder",
       "impl.experts:_shuffled_block_major", "raw = fm.reorder_rows_for_gated_act_gemm(raw) if gated else raw",
       "raw = raw", ("output", "")),
    _m("packed-ids-misaligned", "the packed routing shifts the expert ids by 15 bits, not 16",
       "impl.experts:pack_topk_ids_weights", "(ids_NK.to(torch.int32) << 16)", "(ids_NK.to(torch.int32) << 15)",
       ("output", ""), ("completes", "expert ids must be in")),
    _m("trtllm-router-weight-twice", "the TRT-LLM experts weight the rows again after prepare applied the weight",
       "impl.experts:TrtLlmExperts.__call__", "if self.weighted else torch.ones_like(", "if True else torch.ones_like(",
       ("output", "")),
    _m("trtllm-w2-global-scale-of-w1", "the nvfp4 TRT-LLM experts scale GEMM2 by w1's global scale",
       "impl.experts:TrtLlmExperts.__init__", "self.scale2 = (1.0 / w2.global_scale.float()).float()",
       "self.scale2 = (1.0 / w1.global_scale.float()).float()", ("output", "")),
    _m("trtllm-global-scale-dropped", "the nvfp4 TRT-LLM experts drop the weights' global scale from GEMM1",
       "impl.experts:TrtLlmExperts.__init__", "self.scale1 = (1.0 / (a1_gscale.float() * w1.global_scale.float())).float()",
       "self.scale1 = (1.0 / (a1_gscale.float() * torch.ones_like(w1.global_scale.float()))).float()",
       ("output", "")),
    # -- what scenarios cannot reach: refusals and checkpoints, caught by the tests named ----
    _m("split-ignores-colors", "the communicator's Split pretends a split over different colors worked",
       "impl.communicator:_GroupCommunicator.Split", "if len(colors) != 1:", "if len(colors) > len(pairs):",
       ("tests", "test_communicator_split_refuses_to_split_its_group"),
       tests=(f"{ONE_SIDED_TESTS}::test_communicator_split_refuses_to_split_its_group",)),
    _m("stale-context-accepted", "a rank with more tokens than the forward context says is not refused",
       "impl.forward_context:runtime_max_tokens_per_rank",
       "if counts is not None and local_num_tokens > max(counts):", "if False:",
       ("tests", "test_runtime_max_tokens_is_max_over_dp_and_at_least_one"),
       tests=(f"{UNITS}::test_runtime_max_tokens_is_max_over_dp_and_at_least_one",)),
    _m("checkpoint-restore-skipped", "checkpoint_restore does not map the workspace again",
       f"{MGR}.checkpoint_restore",
       'self._checkpoint_method("checkpoint_restore")(make_communicator(self.api, self.cpu_group))',
       'self._checkpoint_method("checkpoint_restore")', ("tests", "test_one_sided_checkpoint_prepare_restore"),
       tests=(f"{ONE_SIDED_TESTS}::test_one_sided_checkpoint_prepare_restore",)),
    _m("fp8-missing-scales-passes", "DeepSeek fp8 activations without scales reach the kernel",
       "impl.quant:prepare_deepseek_fp8_x_sf",
       'raise RuntimeError("TRT-LLM FP8 experts require precomputed activation scales")', "return x_sf",
       ("tests", "test_prepare_deepseek_fp8_x_sf_transposes_and_checks"),
       tests=(f"{UNITS}::test_prepare_deepseek_fp8_x_sf_transposes_and_checks",)),
    _m("workspace-buffer-unchecked", "finalize takes whatever the experts return as the workspace's combine region",
       f"{PF}.finalize", "            check_workspace_resident(fused_expert_output, in_workspace)\n",
       "            pass\n", ("tests", "test_one_sided_workspace_output_refuses_another_buffer"),
       tests=(f"{ONE_SIDED_TESTS}::test_one_sided_workspace_output_refuses_another_buffer",)),
    _m("sentinel-inside-expert-range", "an invalid-expert id inside [0, num_experts) is accepted",
       f"{OS}:check_invalid_expert_id", "or invalid_expert_id not in (-1, num_experts):", "or invalid_expert_id < -1:",
       ("tests", "test_one_sided_invalid_expert_id_outside_the_experts"),
       tests=(f"{UNITS}::test_one_sided_invalid_expert_id_outside_the_experts",)),
    _m("moe-output-unvalidated", "the consumer finalizes a MoEOutput without validating it",
       "impl.moe_output:finalize_moe_output", "    out.validate(activation_dtype, num_tokens, top_k, hidden)\n",
       "", ("tests", "test_moe_output_rejects_each_broken_field"),
       tests=("tests/test_moe_output.py::test_moe_output_rejects_each_broken_field",)),
    _m("two-sided-combine-top1", "the two-sided combine is told top_k = 1",
       "impl.two_sided:TwoSidedPrepareFinalize.finalize", "top_k=topk_ids.size(1)", "top_k=1",
       ("completes", "would write outside it")),
    # -- arguments the release's annotations (or defaults) rule out ------------------------------
    _m("gpus-per-node-function", "vLLM's VLLM-005 in impl: the two-sided manager hands Mapping the function "
       "torch.cuda.device_count as gpus_per_node", "impl.two_sided:TwoSidedManager.initialize",
       "gpus_per_node=self.gpus_per_node, tp_size=W)", "gpus_per_node=torch.cuda.device_count, tp_size=W)",
       ("arguments", "gpus_per_node=<function")),
    _m("payloads-as-tuple", "the one-sided dispatch is handed its payloads as a tuple (the release annotates "
       "list[torch.Tensor])", f"{PF}.prepare", "token_selected_experts=topk_ids, input_payloads=payloads,",
       "token_selected_experts=topk_ids, input_payloads=tuple(payloads),", ("arguments", "input_payloads=(")),
    # -- flashinfer.moe_ep (issue 10) ------------------------------------------------------------
    _m("moe-ep-first-layer-communication", "historical bug 2 on moe_ep: every layer runs on the first "
       "layer's communication", f"{EP_MGR}.communication",
       "key = (max_num_tokens, top_k, num_experts, hidden_size, invalid_expert_id)", "key = ()",
       ("workspace", "communication"), ("completes", "must be in (0")),
    _m("moe-ep-unaligned-payloads", "0.7.4: a sequence-parallel chunk of the ids is dispatched where it starts",
       "impl.moe_ep:aligned", "return t if t is None or t.data_ptr() % PAYLOAD_ALIGNMENT == 0 else t.clone()",
       "return t", ("completes", "16-byte aligned")),
    _m("moe-ep-world-communicator", "historical bug 3 on moe_ep: the MNNVL handles are exchanged over the world",
       f"{EP_MGR}.communication", "comm_backend = make_communicator(self.api, self.cpu_group)",
       "comm_backend = make_communicator(self.api, dist.group.WORLD)",
       ("completes", "MNNVL communicator has"), ("collectives", "")),
    _m("moe-ep-old-step-keyword", "0.7.4's dispatch is called with 0.7.2's max_tokens_per_rank keyword",
       f"{EP_PF}.__init__", 'if supports_kw(self.comm.dispatch, "runtime_max_tokens_per_rank", allow_var_kwargs=False)',
       "if False", ("completes", "max_tokens_per_rank")),
    _m("moe-ep-step-is-local-count", "moe_ep dispatches with this rank's token count as the step's max",
       f"{EP_PF}.prepare", "**{self._step_kw: S})", "**{self._step_kw: max(a1.size(0), 1)})",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "")),
)
# -- vLLM 0.33.0's own code (a2a-testbed mutants --integration vllm) ------------------------------
V_MGR = "vllm.distributed.device_communicators.all2all:FlashInferNVLinkOneSidedManager"
V_MGR2 = "vllm.distributed.device_communicators.all2all:FlashInferNVLinkTwoSidedManager"
V_PF = ("vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided:"
        "FlashInferNVLinkOneSidedPrepareAndFinalize")
V_OS = "vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided"
V_TS = "vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_two_sided"
V_RUNNER = "vllm.model_executor.layers.fused_moe.runner.moe_runner:MoERunner"
VLLM_CATALOGUE: tuple[Mutant, ...] = (
    # -- the shared communication's replacement rule (seed 001 in vLLM's manager) ----------------
    _v("v-first-layer-communication", "historical bug 2: the first layer's communication is kept whatever later "
       "layers need", f"{V_MGR}.initialize", "max_num_tokens <= previous_max", "True or max_num_tokens <= previous_max",
       ("workspace", "does not cover"), ("completes", "insufficient")),
    _v("v-growth-ignores-dispatch-bytes", "the replacement rule compares tokens and hidden but not dispatch bytes",
       f"{V_MGR}.initialize", "                and dispatch_bytes <= previous_bytes\n", "",
       ("workspace", "does not cover"), ("completes", "insufficient")),
    _v("v-replace-when-covered", "a layer the shared communication already covers replaces it anyway",
       f"{V_MGR}.initialize", "                return\n", "                pass\n", ("workspace", "build(s) for layer")),
    # -- barriers and communicator scope (seed 001's historical bug 3) ---------------------------
    _v("v-world-barrier-after-build", "historical bug 3: the barrier after a build runs on the world group",
       f"{V_MGR}.initialize", "        )\n        dist.barrier(group=self.cpu_group)", "        )\n        dist.barrier()",
       ("collectives", "barrier on group"), ("completes", "")),
    _v("v-no-barrier-after-build", "no barrier after the communication is built",
       f"{V_MGR}.initialize", "        )\n        dist.barrier(group=self.cpu_group)", "        )\n        pass",
       ("collectives", "not followed by a barrier")),
    _v("v-world-mnnvl-communicator", "the MNNVL handles are exchanged over the world group",
       f"{V_MGR}.initialize", "comm_backend=CustomCommunicator(self.cpu_group),",
       "comm_backend=CustomCommunicator(dist.group.WORLD),",
       ("completes", "MNNVL communicator has"), ("collectives", "all_gather_object on group")),
    # -- the step's runtime max tokens ---------------------------------------------------------
    _v("v-step-is-local-count", "each rank dispatches with its own token count as the step's max",
       f"{V_PF}.prepare", "            max(global_num_tokens_cpu)\n", "            a1.shape[0]\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "")),
    _v("v-step-is-capacity", "the step's max is the layer's capacity, not the forward's largest count",
       f"{V_PF}.prepare", "            max(global_num_tokens_cpu)\n", "            self.max_num_tokens\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank")),
    _v("v-no-dp-metadata", "the one-sided prepare never reads the DP metadata (the local count serves)",
       f"{V_OS}:get_local_sizes", "return dp_metadata.get_chunk_sizes_across_dp_rank()", "return None",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "")),
    _v("v-two-sided-step-is-local-count", "the two-sided prepare sizes its step with this rank's own count",
       f"{V_TS}:flashinfer_alltoall_dispatch", "max(global_num_tokens_cpu) if global_num_tokens_cpu is not None else",
       "x.shape[0] if global_num_tokens_cpu is not None else", ("completes", ""), ("output", "x the tolerance"),
       ("expert-load", "lanes")),
    # -- payloads --------------------------------------------------------------------------------
    _v("v-weights-not-dispatched", "the router weights stay home: the experts weight received rows with local ones",
       f"{V_PF}.prepare", "            topk_weights,\n            hidden_states_scale=dispatch_x_sf,",
       "            None,\n            hidden_states_scale=dispatch_x_sf,", ("completes", ""), ("output", "x the tolerance")),
    _v("v-scales-not-dispatched", "the activation scales are not dispatched",
       f"{V_PF}.prepare", "hidden_states_scale=dispatch_x_sf,", "hidden_states_scale=None,",
       ("completes", "NoneType"), ("output", "x the tolerance")),
    _v("v-router-weight-not-applied", "with the router weight on the input, prepare does not apply it",
       f"{V_PF}.prepare", "a1.mul_(topk_weights.to(a1.dtype))", "a1.mul_(1)", ("output", "x the tolerance")),
    # -- the reduce contract (seed 002) ----------------------------------------------------------
    _v("v-one-sided-not-reduced", "historical bug 1: the one-sided finalize claims its output is not reduced",
       f"{V_PF}.output_is_reduced", "return True", "return False", ("reduce", "output_is_reduced()")),
    _v("v-two-sided-not-reduced", "historical bug 1 on the two-sided finalize",
       f"{V_TS}:FlashInferNVLinkTwoSidedPrepareAndFinalize.output_is_reduced", "return True", "return False",
       ("reduce", "output_is_reduced()")),
    _v("v-reduce-ignores-reduced", "the runner all-reduces over TP even when the kernel's output is reduced",
       f"{V_RUNNER}._maybe_reduce_final_output", "            and not output_is_reduced\n", "",
       ("reduce", "TP all_reduce"), ("output", "x the tolerance")),
    # -- combine -----------------------------------------------------------------------------------
    _v("v-combine-without-output", "finalize combines without output=: the layer's output is never written",
       f"{V_PF}.finalize", "            output=output,\n", "", ("output", "x the tolerance")),
    _v("v-two-sided-combine-token-count", "the two-sided combine is told the received rows' count, not the layer's",
       f"{V_TS}:FlashInferNVLinkTwoSidedPrepareAndFinalize.finalize", "token_count = output.shape[0]",
       "token_count = fused_expert_output.shape[0]", ("completes", ""), ("output", "")),
    _v("v-two-sided-mapping-tp-1", "the two-sided Mapping is built with tp_size 1 instead of the EP group's size",
       f"{V_MGR2}.initialize", "            tp_size=world_size,", "            tp_size=1,", ("completes", ""),
       ("output", "x the tolerance")),
)
# -- SGLang 0.5.23's own code (a2a-testbed mutants --integration sglang) ----------------------------
S_MOD = "sglang.srt.layers.moe.token_dispatcher.flashinfer"
S_D = f"{S_MOD}:FlashinferDispatcher"
S_MOE = "sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE"
SGLANG_CATALOGUE: tuple[Mutant, ...] = (
    # -- capacity and workspace sizing (seed 001's class in SGLang's fixed-capacity sizing) ----------
    _s("s-capacity-halved", "the MoeAlltoAll capacity is half the configured dispatch tokens per rank",
       f"{S_D}.__init__", "            max_prefill_buffer_tokens()\n        )\n",
       "            max_prefill_buffer_tokens()\n        ) // 2\n", ("workspace", "needs max_num_tokens"),
       ("completes", "exceeds its fixed workspace")),
    _s("s-workspace-without-weights", "the dispatch payload size leaves out the router weights' bytes",
       f"{S_D}.__init__", "topk_id_and_weight_bytes = self.router_topk * 4 + self.router_topk * 4",
       "topk_id_and_weight_bytes = self.router_topk * 4", ("workspace", "bytes"), ("completes", "")),
    _s("s-combine-region-fp8", "the combine payload is sized at one byte per value, not bf16's two",
       f"{S_D}.__init__", "combine_payload_size_per_token = hidden_size * 2", "combine_payload_size_per_token = hidden_size",
       ("workspace", "bytes"), ("completes", "")),
    _s("s-no-namespace-padding", "the workspace sizes are not padded apart: decode and SP prefill share one workspace",
       f"{S_MOD}:_workspace_size_for_namespace", "return workspace_size + int(namespace) * _WORKSPACE_NAMESPACE_ALIGNMENT",
       "return workspace_size", ("workspace", "share a workspace")),
    # -- the runtime max tokens per rank (issue #30242's class) ---------------------------------
    _s("s-runtime-max-of-smallest", "DP attention's runtime max is the smallest DP rank's count",
       f"{S_MOD}:_max_tokens_per_scattered_source", "max_dp_tokens = max(dp_global_num_tokens)",
       "max_dp_tokens = min(dp_global_num_tokens)", ("runtime-max-tokens", "runtime_max_tokens_per_rank"),
       ("completes", "")),
    _s("s-sp-runtime-max-of-all-rows", "Muse Spark's SP prefill takes the whole prefill's rows as the runtime max, "
       "not this rank's slice", f"{S_D}.dispatch", "            runtime_max_tokens_per_rank = x.shape[0]\n",
       "            runtime_max_tokens_per_rank = x.shape[0] * self.ep_size\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "exceeds its fixed workspace")),
    _s("s-dp-list-ignored", "the dispatcher never reads the DP token list (each rank's own rows serve)",
       f"{S_D}.dispatch", "if dp_global is not None and len(dp_global) > 1:", "if False:",
       ("completes", "DP attention reached the x.shape[0] fallback")),
    _s("s-combine-step-is-capacity", "combine is told the capacity as the round's runtime max",
       f"{S_D}.combine", "                self.runtime_max_tokens_per_rank,\n                payload_in_workspace",
       "                self.max_num_tokens,\n                payload_in_workspace",
       ("runtime-max-tokens", "combine with runtime_max_tokens_per_rank"), ("completes", "")),
    # -- payloads and ids ------------------------------------------------------------------------
    _s("s-weights-before-ids", "the router weights are dispatched before the ids",
       f"{S_D}.dispatch", "        payloads.append(topk_ids)\n        payloads.append(topk_weights)\n",
       "        payloads.append(topk_weights)\n        payloads.append(topk_ids)\n", ("completes", ""),
       ("output", "x the tolerance"), ("expert-load", "lanes")),
    _s("s-ids-index-hidden", "the expert ids' payload index names the hidden states",
       f"{S_D}.dispatch", "            expert_id_payload_index = 1\n", "            expert_id_payload_index = 0\n",
       ("completes", ""), ("output", "x the tolerance"), ("expert-load", "lanes")),
    _s("s-ids-not-int32", "the router's ids go to MoeAlltoAll in their own dtype (FlashInfer's ABI is int32)",
       f"{S_D}.dispatch", "topk_ids = topk_output.topk_ids.to(torch.int32)\n        topk_weights",
       "topk_ids = topk_output.topk_ids\n        topk_weights", ("completes", "int32"), ("arguments", "")),
    # -- combine from the workspace (payload_in_workspace) -----------------------------------------
    _s("s-combine-not-in-workspace", "the cutlass runner writes into the workspace, but combine copies its payload in",
       f"{S_D}.combine", "payload_in_workspace=self.payload_in_workspace,", "payload_in_workspace=False,",
       ("expert-output", "payload_in_workspace")),
    _s("s-no-workspace-output", "the combine region is not handed to the experts, yet combine reads it",
       f"{S_D}.dispatch", "            if self.payload_in_workspace:\n", "            if False:\n",
       ("expert-output", "combine region"), ("output", "x the tolerance")),
    # -- the reduce contract (seed 002, historical bug 1) --------------------------------------------
    _s("s-reduce-after-combine", "historical bug 1: FusedMoE all-reduces the combine's already complete output",
       f"{S_MOE}.forward_impl", "if self.reduce_results and (self.moe_tp_size > 1 or self.moe_ep_size > 1):",
       "if self.moe_tp_size > 1 or self.moe_ep_size > 1:", ("reduce", "TP all_reduce"), ("output", "x the tolerance")),
)
BY_NAME = {m.name: m for m in CATALOGUE + VLLM_CATALOGUE + SGLANG_CATALOGUE}


def catalogue(integration: str) -> tuple[Mutant, ...]:
    """The mutants of ``integration``'s code."""
    return {"impl": CATALOGUE, "vllm": VLLM_CATALOGUE, "sglang": SGLANG_CATALOGUE}[integration]


def get(name: str) -> Mutant:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; `a2a-testbed mutants --list` names them") from None


def apply(name: str) -> Callable[[], None]:
    """Patch ``impl`` in this process with mutant ``name``; returns the function that undoes it."""
    m = get(name)
    module_name, _, path = m.target.partition(":")
    if m.integration != "impl":  # what the engine needs before it is imported here
        from testbed.integrations import engine

        engine(m.integration).prepare_environment()
    module = importlib.import_module(module_name)
    *owner_path, attr = path.split(".")
    owner = module
    for part in owner_path:
        owner = getattr(owner, part)
    original = inspect.getattr_static(owner, attr)
    function = original.fget if isinstance(original, property) else original  # its source has @property
    lines, first = inspect.getsourcelines(function)
    source = "".join(lines)
    count = source.count(m.old)
    if count != 1:
        raise MutantError(f"mutant {name}: {m.old!r} occurs {count} times in {m.target} (expected once)")
    mutated = textwrap.dedent(source.replace(m.old, m.new))
    if owner_path:  # a method: zero-argument super() needs the class cell a class body gives
        mutated = mutated.replace("super()", f"super({owner_path[-1]}, self)")
    namespace: dict = {}
    try:
        exec(compile("\n" * (first - 1) + mutated, inspect.getsourcefile(function), "exec"),
             module.__dict__, namespace)
        replacement = namespace[attr]
    except Exception as e:  # noqa: BLE001 - whatever it is, the mutant is broken, not killed
        raise MutantError(f"mutant {name}: the changed {m.target} does not compile: {type(e).__name__}: {e}") from e
    # Rebind every module's reference (``from impl.x import f`` copies the name), as an
    # edit of the file would reach every importer.
    # A module's own dict (what `from x import f` wrote), never its __getattr__: lazy modules
    # (transformers') import on attribute access.
    holders = [owner] + ([] if owner_path else [mod for mod in list(sys.modules.values())
                                               if mod is not owner and vars(mod).get(attr) is original])
    for holder in holders:
        setattr(holder, attr, replacement)

    def undo() -> None:
        for holder in holders:
            setattr(holder, attr, original)

    return undo
