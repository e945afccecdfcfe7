"""Mutants of the installed SGLang's own source (targets under ``sglang.``): small, realistic
wrong changes the invariants must catch (applied at run time in the rank processes by
:mod:`testbed.harness.mutants`). Written against 0.5.23; ``forms`` give the same change where
0.5.22 writes the code otherwise."""

from __future__ import annotations

from testbed.integrations.base import Mutant

_m = Mutant.of
S_MOD = "sglang.srt.layers.moe.token_dispatcher.flashinfer"
S_D = f"{S_MOD}:FlashinferDispatcher"
S_MOE = "sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE"
S_UTILS = "sglang.srt.layers.moe.utils"
S_DSV2 = "sglang.srt.models.deepseek_v2:DeepseekV2MoE"


def _sp_prefill():
    from testbed.integrations.sglang.environment import dispatcher_has_sp_prefill

    return None if dispatcher_has_sp_prefill() else ("this SGLang has no SP-prefill all-to-all (its dispatcher "
                                                     "takes no enable_sp_prefill_a2a=)")


def _scale_folds_for_bf16():
    """Whether this SGLang ever folds the routed scaling factor into the top-k of an
    unquantized FusedMoE under the runners a block runs with (its own answer,
    ``_fuses_routed_scaling_factor_in_topk``); None where it does (or SGLang is not here)."""
    import inspect

    from testbed.integrations.sglang.environment import ENGINE

    layer = ENGINE.module("sglang.srt.layers.moe.fused_moe_triton.layer")
    if layer is None:
        return None
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    fuses = getattr(layer, "_fuses_routed_scaling_factor_in_topk", None)
    if fuses is None:  # before 0.5.19 FusedMoE.__init__ answers inline, for the unquantized method or not
        if "isinstance(self.quant_method, UnquantizedFusedMoEMethod)" in inspect.getsource(layer.FusedMoE.__init__):
            return None
        return ("this SGLang never folds the routed scaling factor into the top-k of an unquantized FusedMoE "
                "(FusedMoE.__init__'s should_fuse_routed_scaling_factor_in_topk names no unquantized method): a block "
                "never takes the folded branch")
    method = object.__new__(UnquantizedFusedMoEMethod)  # the answer reads its type and class attributes only
    if "runner_backend" in inspect.signature(fuses).parameters:
        answers = [fuses(method, MoeRunnerBackend(r)) for r in ("flashinfer_trtllm", "flashinfer_cutlass")]
    else:
        answers = [fuses(method)]
    if any(answers):
        return None
    return ("this SGLang never folds the routed scaling factor into the top-k of an unquantized FusedMoE under the "
            "flashinfer_trtllm or flashinfer_cutlass runner (_fuses_routed_scaling_factor_in_topk answers False): "
            "a block never takes the folded branch")


SGLANG_CATALOGUE: tuple[Mutant, ...] = (
    # -- capacity and workspace sizing (seed 001's class in SGLang's fixed-capacity sizing) ----------
    _m("s-capacity-halved", "the MoeAlltoAll capacity is half the configured dispatch tokens per rank",
       f"{S_D}.__init__", "            max_prefill_buffer_tokens()\n        )\n",
       "            max_prefill_buffer_tokens()\n        ) // 2\n", ("workspace", "needs max_num_tokens"),
       ("completes", "exceeds its fixed workspace"),
       # 0.5.21 takes the configured tokens or its default, without the prefill buffer's ceiling.
       forms=(("            else default_max_tokens\n        )\n", "            else default_max_tokens\n        ) // 2\n"),)),
    _m("s-workspace-without-weights", "the dispatch payload size leaves out the router weights' bytes",
       f"{S_D}.__init__", "topk_id_and_weight_bytes = self.router_topk * 4 + self.router_topk * 4",
       "topk_id_and_weight_bytes = self.router_topk * 4", ("workspace", "bytes"), ("completes", "")),
    _m("s-combine-region-fp8", "the combine payload is sized at one byte per value, not bf16's two",
       f"{S_D}.__init__", "combine_payload_size_per_token = hidden_size * 2", "combine_payload_size_per_token = hidden_size",
       ("workspace", "bytes"), ("completes", "")),
    _m("s-no-namespace-padding", "the workspace sizes are not padded apart: decode and SP prefill share one workspace",
       f"{S_MOD}:_workspace_size_for_namespace", "return workspace_size + int(namespace) * _WORKSPACE_NAMESPACE_ALIGNMENT",
       "return workspace_size", ("workspace", "share a workspace"),
       forms=(("return workspace_size + slot * _WORKSPACE_NAMESPACE_ALIGNMENT", "return workspace_size"),)),
    # -- the runtime max tokens per rank (issue #30242's class) ---------------------------------
    _m("s-runtime-max-of-smallest", "DP attention's runtime max is the smallest DP rank's count",
       f"{S_MOD}:_max_tokens_per_scattered_source", "max_dp_tokens = max(dp_global_num_tokens)",
       "max_dp_tokens = min(dp_global_num_tokens)", ("runtime-max-tokens", "runtime_max_tokens_per_rank"),
       ("completes", "")),
    _m("s-sp-runtime-max-of-all-rows", "Muse Spark's SP prefill takes the whole prefill's rows as the runtime max, "
       "not this rank's slice", f"{S_D}.dispatch", "            runtime_max_tokens_per_rank = x.shape[0]\n",
       "            runtime_max_tokens_per_rank = x.shape[0] * self.ep_size\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "exceeds its fixed workspace"),
       requires=_sp_prefill),
    _m("s-dp-list-ignored", "the dispatcher never reads the DP token list (each rank's own rows serve)",
       f"{S_D}.dispatch", "if dp_global is not None and len(dp_global) > 1:", "if False:",
       ("completes", "DP attention reached the x.shape[0] fallback")),
    _m("s-combine-step-is-capacity", "combine is told the capacity as the round's runtime max",
       f"{S_D}.combine", "                self.runtime_max_tokens_per_rank,\n                payload_in_workspace",
       "                self.max_num_tokens,\n                payload_in_workspace",
       ("runtime-max-tokens", "combine with runtime_max_tokens_per_rank"), ("completes", ""),
       forms=(("            self.runtime_max_tokens_per_rank,\n            payload_in_workspace",
               "            self.max_num_tokens,\n            payload_in_workspace"),)),
    # -- payloads and ids ------------------------------------------------------------------------
    _m("s-weights-before-ids", "the router weights are dispatched before the ids",
       f"{S_D}.dispatch", "        payloads.append(topk_ids)\n        payloads.append(topk_weights)\n",
       "        payloads.append(topk_weights)\n        payloads.append(topk_ids)\n", ("completes", ""),
       ("output", "x the tolerance"), ("expert-load", "lanes")),
    _m("s-ids-index-hidden", "the expert ids' payload index names the hidden states",
       f"{S_D}.dispatch", "            expert_id_payload_index = 1\n", "            expert_id_payload_index = 0\n",
       ("completes", ""), ("output", "x the tolerance"), ("expert-load", "lanes")),
    _m("s-ids-not-int32", "the router's ids go to MoeAlltoAll in their own dtype (FlashInfer's ABI is int32)",
       f"{S_D}.dispatch", "topk_ids = topk_output.topk_ids.to(torch.int32)\n        topk_weights",
       "topk_ids = topk_output.topk_ids\n        topk_weights", ("completes", "int32"), ("arguments", "")),
    # -- combine from the workspace (payload_in_workspace) -----------------------------------------
    _m("s-combine-not-in-workspace", "the cutlass runner writes into the workspace, but combine copies its payload in",
       f"{S_D}.combine", "payload_in_workspace=self.payload_in_workspace,", "payload_in_workspace=False,",
       ("expert-output", "payload_in_workspace")),
    _m("s-no-workspace-output", "the combine region is not handed to the experts, yet combine reads it",
       f"{S_D}.dispatch", "            if self.payload_in_workspace:\n", "            if False:\n",
       ("expert-output", "combine region"), ("output", "x the tolerance"),
       forms=(("        if self.payload_in_workspace:\n", "        if False:\n"),)),
    # -- the reduce contract (seed 002, historical bug 1) --------------------------------------------
    _m("s-reduce-after-combine", "historical bug 1: FusedMoE all-reduces the combine's already complete output",
       f"{S_MOE}.forward_impl", "if self.reduce_results and (self.moe_tp_size > 1 or self.moe_ep_size > 1):",
       "if self.moe_tp_size > 1 or self.moe_ep_size > 1:", ("reduce", "TP all_reduce"), ("output", "x the tolerance")),
    # -- the model blocks (--block): their DP rows, the stage boundary's sum, shared experts, scaling ----
    _m("s-moe-input-gathered", "SGLang takes a sparse FFN's input under FlashInfer A2A for the DP ranks' gathered "
       "rows, not each DP rank's own", f"{S_UTILS}:is_moe_input_scattered_across_dp_ranks",
       "not get_moe_a2a_backend().is_none()", "get_moe_a2a_backend().is_none()",
       ("expert-load", "lanes"), ("completes", ""), ("output", "x the tolerance")),
    _m("s-post-experts-reduce-of-combined-output", "the MoE block's post-experts reduce (reduce_moe_output, as "
       "Qwen2-MoE's block calls it) still owes the combine's complete output the TP sum (historical bug 1's double "
       "reduce, one level up)", f"{S_UTILS}:post_experts_output_is_complete",
       "return a2a.is_flashinfer() or a2a.is_pplx()", "return a2a.is_pplx()",
       ("reduce", ""), ("output", "x the tolerance"), ("completes", "")),
    _m("s-shared-expert-tp-sharded", "DeepSeek's shared expert is sharded over TP under FlashInfer A2A, its partial "
       "sums never summed", f"{S_DSV2}.__init__",
       "                or get_moe_a2a_backend().is_flashinfer()\n                or get_moe_a2a_backend().is_megamoe()\n",
       "                or get_moe_a2a_backend().is_megamoe()\n", ("output", "x the tolerance"), ("completes", "")),
    _m("s-shared-output-dropped", "DeepSeek's block under an all-to-all returns the routed output without its shared "
       "expert's", f"{S_DSV2}.forward_deepep", "            final_hidden_states,\n            shared_output,\n",
       "            final_hidden_states,\n            None,\n", ("output", "x the tolerance"),
       forms=(("        if shared_output is not None:\n            x = shared_output",
               "        if False:\n            x = shared_output"),)),
    _m("s-routed-scale-twice", "DeepSeek's block scales the routed output although its TopK folded the routed "
       "scaling factor into the weights", f"{S_DSV2}.forward_deepep",
       "            fused_in_topk=self.routed_scaling_factor_fused_in_topk,\n        )",
       "            fused_in_topk=False,\n        )", ("output", "x the tolerance"),
       forms=(("            if self.experts.should_fuse_routed_scaling_factor_in_topk or _use_aiter:\n",
               "            if _use_aiter:\n"),), equivalent=_scale_folds_for_bf16),
    _m("s-idle-rank-skips-experts", "Qwen3-MoE's block on an idle DP rank returns at once, never joining the "
       "all-to-all its peers run", "sglang.srt.models.qwen3_moe:Qwen3MoeSparseMoeBlock.forward_normal",
       "        else:\n            topk_output = self.topk.empty_topk_output(hidden_states.device)\n",
       "        else:\n            return hidden_states\n", ("completes", "")),
)
