"""Mutants of the installed SGLang's own source (targets under ``sglang.``): small, realistic
wrong changes the invariants must catch (applied at run time in the rank processes by
:mod:`testbed.harness.mutants`). Written against 0.5.23; ``forms`` give the same change where an
older release (0.5.9 .. 0.5.22) writes the code otherwise, and a target's alternatives name
where it lived before (``a|b:F|G``). Where a release already is the mutant, or a finding of
its own fails every deployment the mutant reaches the same way, the probes say so
(``equivalent``, ``masked``: SGL-006 .. SGL-011 on 0.5.9 .. 0.5.19)."""

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


def _holds(finding_id: str) -> bool:
    """Whether the SGLang release in use still has finding ``finding_id``'s code."""
    from testbed.integrations.sglang.environment import ENGINE
    from testbed.integrations.sglang.findings import FINDINGS

    finding = next(f for f in FINDINGS if f.id == finding_id)
    return ENGINE.missing_code(finding.code) is None


def _bf16_deployments_fail():
    """Where every bf16 deployment already fails the same way: SGL-006 (0.5.9/0.5.10: the
    dispatch raises) or SGL-007 (0.5.9 .. 0.5.14: the workspace is sized for nvfp4 rows). A
    mutant reaching bf16 layers only (the model blocks, built from an unquantized checkpoint;
    the bf16 payload's index) is masked there."""
    for finding_id, what in (("SGL-006", "every bf16 dispatch raises (quant_config None)"),
                             ("SGL-007", "every bf16 layer's workspace is sized for nvfp4 rows")):
        if _holds(finding_id):
            return (f"{finding_id}: on this SGLang {what}, the one way every deployment the mutant reaches (bf16 "
                    "layers only) already fails")
    return None


def _ids_cast_to_int32():
    """Before 0.5.16 the dispatcher hands the ids as they come (SGL-011): the release is the
    mutant."""
    return "SGL-011: this SGLang hands the router's ids as they come, as the mutant does" if _holds("SGL-011") else None


def _skip_predicate_knows_a2a():
    """Before 0.5.15 the post-experts skip predicate does not know the A2A backend (SGL-008):
    the release is the mutant."""
    return ("SGL-008: this SGLang's post-experts skip predicate does not know the FlashInfer A2A backend, as the "
            "mutant's does not") if _holds("SGL-008") else None


def _qwen3_idle_branch():
    """Whether this SGLang's Qwen3-MoE ``forward_normal`` (what FlashInfer A2A runs) has an
    idle-rank branch; before 0.5.19 it routes the empty batch like any other."""
    import inspect

    from testbed.integrations.sglang.environment import ENGINE

    module = ENGINE.module("sglang.srt.models.qwen3_moe")
    if module is None or "empty_topk_output" in inspect.getsource(module.Qwen3MoeSparseMoeBlock.forward_normal):
        return None
    return ("this SGLang's Qwen3-MoE forward_normal, which FlashInfer A2A runs, has no idle-rank branch (its router "
            "routes the empty batch); the one the mutant changes is forward_deepep's, never run here")


def _capacity_times_ep():
    """Before 0.5.13 the capacity is the configured tokens per rank times the EP size: half of
    it still holds every rank's budget wherever there is an EP group to dispatch over."""
    import inspect

    from testbed.integrations.sglang.environment import DISPATCHER, ENGINE

    module = ENGINE.module(DISPATCHER)
    if module is None or "* self.ep_size" not in inspect.getsource(module.FlashinferDispatcher.__init__):
        return None
    return ("this SGLang's capacity is SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK x ep_size: half of it still "
            "holds the configured tokens per rank at every EP size >= 2")


# The scheduler's DP-attention MLP sync: scheduler_components/dp_attn.py from 0.5.13, before in
# the scheduler's DP-attention mixin.
S_DP_SYNC = ("sglang.srt.managers.scheduler_components.dp_attn|sglang.srt.managers.scheduler_dp_attn_mixin"
             ":prepare_mlp_sync_batch_raw")


SGLANG_CATALOGUE: tuple[Mutant, ...] = (
    # -- the served engine's DP-attention scheduling: every DP rank steps while any has tokens --------
    _m("s-dp-idle-decided-locally", "a scheduler decides alone whether its DP rank runs an idle batch (its own "
       "token count, not every rank's gathered one): an idle DP rank runs no forward while a peer runs one, whose "
       "all-to-all then waits for it", S_DP_SYNC, "need_idle_batch = max(mlp_sync_info.global_num_tokens) > 0",
       "need_idle_batch = mlp_sync_info.num_tokens > 0", ("completes", "no answer within"),
       forms=(("need_idle_batch = skip_all_gather or max(mlp_sync_info.global_num_tokens) > 0",
               "need_idle_batch = skip_all_gather or mlp_sync_info.num_tokens > 0"),),
       served="SGLang's scheduler, one per DP rank of its server with DP attention"),
    # -- capacity and workspace sizing (seed 001's class in SGLang's fixed-capacity sizing) ----------
    _m("s-capacity-halved", "the MoeAlltoAll capacity is half the configured dispatch tokens per rank",
       f"{S_D}.__init__", "            max_prefill_buffer_tokens()\n        )\n",
       "            max_prefill_buffer_tokens()\n        ) // 2\n", ("workspace", "needs max_num_tokens"),
       ("completes", "exceeds its fixed workspace"),
       ("completes", "runtime_max_tokens_per_rank exceeds max_num_tokens"),  # MoeAlltoAll's own check before 0.7
       # 0.5.21 takes the configured tokens or its default, without the prefill buffer's ceiling.
       forms=(("            else default_max_tokens\n        )\n", "            else default_max_tokens\n        ) // 2\n"),
              # 0.5.13 .. 0.5.16: the configured tokens or the default; before, 1024 x ep_size.
              ("            default_max_tokens,\n        )\n", "            default_max_tokens,\n        ) // 2\n"),
              ("            * self.ep_size\n        )\n", "            * self.ep_size\n        ) // 2\n")),
       equivalent=_capacity_times_ep),
    _m("s-workspace-without-weights", "the dispatch payload size leaves out the router weights' bytes",
       f"{S_D}.__init__", "topk_id_and_weight_bytes = self.router_topk * 4 + self.router_topk * 4",
       "topk_id_and_weight_bytes = self.router_topk * 4", ("workspace", "bytes"), ("completes", ""),
       # Before 0.5.20 each format's row is summed apart: the nvfp4 row, the one 0.5.9 .. 0.5.14 size
       # every layer for (their start-up turns NVFP4 dispatch on).
       forms=(("                + hidden_size // 16  # fp8 scaling factors\n"
               "                + self.router_topk * 4  # int32 topks ids\n"
               "                + self.router_topk * 4  # float32 topk weights\n",
               "                + hidden_size // 16  # fp8 scaling factors\n"
               "                + self.router_topk * 4  # int32 topks ids\n"),)),
    _m("s-combine-region-fp8", "the combine payload is sized at one byte per value, not bf16's two",
       f"{S_D}.__init__", "combine_payload_size_per_token = hidden_size * 2", "combine_payload_size_per_token = hidden_size",
       ("workspace", "bytes"), ("completes", "")),
    _m("s-no-namespace-padding", "the workspace sizes are not padded apart: decode and SP prefill share one workspace",
       f"{S_MOD}:_workspace_size_for_namespace", "return workspace_size + int(namespace) * _WORKSPACE_NAMESPACE_ALIGNMENT",
       "return workspace_size", ("workspace", "share a workspace"),
       forms=(("return workspace_size + slot * _WORKSPACE_NAMESPACE_ALIGNMENT", "return workspace_size"),)),
    # -- the runtime max tokens per rank (issue #30242's class) ---------------------------------
    _m("s-runtime-max-of-smallest", "DP attention's runtime max is the smallest DP rank's count",
       f"{S_MOD}:_max_tokens_per_scattered_source|FlashinferDispatcher.dispatch",
       "max_dp_tokens = max(dp_global_num_tokens)",
       "max_dp_tokens = min(dp_global_num_tokens)", ("runtime-max-tokens", "runtime_max_tokens_per_rank"),
       ("completes", ""),
       # In the dispatch before 0.5.21 (0.5.9 .. 0.5.12: the DP list read twice, inline).
       forms=(("self.runtime_max_tokens_per_rank = max(dp_global)", "self.runtime_max_tokens_per_rank = min(dp_global)"),
              ("            max(get_dp_global_num_tokens())\n", "            min(get_dp_global_num_tokens())\n"))),
    _m("s-sp-runtime-max-of-all-rows", "Muse Spark's SP prefill takes the whole prefill's rows as the runtime max, "
       "not this rank's slice", f"{S_D}.dispatch", "            runtime_max_tokens_per_rank = x.shape[0]\n",
       "            runtime_max_tokens_per_rank = x.shape[0] * self.ep_size\n",
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", "exceeds its fixed workspace"),
       requires=_sp_prefill),
    _m("s-dp-list-ignored", "the dispatcher never reads the DP token list (each rank's own rows serve)",
       f"{S_D}.dispatch", "if dp_global is not None and len(dp_global) > 1:", "if False:",
       ("completes", "DP attention reached the x.shape[0] fallback"),
       ("runtime-max-tokens", "runtime_max_tokens_per_rank"), ("completes", ""),
       # 0.5.9 .. 0.5.12 take the DP list's max inline, else this rank's rows (no assert after).
       forms=(("            max(get_dp_global_num_tokens())\n            if get_dp_global_num_tokens() is not None\n"
               "            else x.shape[0]\n", "            x.shape[0]\n"),)),
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
       ("completes", ""), ("output", "x the tolerance"), ("expert-load", "lanes"),
       masked=_bf16_deployments_fail),
    _m("s-ids-not-int32", "the router's ids go to MoeAlltoAll in their own dtype (FlashInfer's ABI is int32)",
       f"{S_D}.dispatch", "topk_ids = topk_output.topk_ids.to(torch.int32)\n        topk_weights",
       "topk_ids = topk_output.topk_ids\n        topk_weights", ("completes", "int32"), ("arguments", ""),
       equivalent=_ids_cast_to_int32),
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
       "if self.moe_tp_size > 1 or self.moe_ep_size > 1:", ("reduce", "TP all_reduce"), ("output", "x the tolerance"),
       # SGLang's TP group is the EP group: at unequal DP counts the all-reduce's shapes differ.
       ("completes", "tensor_model_parallel_all_reduce(final_hidden_states)")),
    # -- the model blocks (--block): their DP rows, the stage boundary's sum, shared experts, scaling ----
    _m("s-moe-input-gathered", "SGLang takes a sparse FFN's input under FlashInfer A2A for the DP ranks' gathered "
       "rows, not each DP rank's own", f"{S_UTILS}|sglang.srt.layers.communicator:is_moe_input_scattered_across_dp_ranks|"
       "LayerScatterModes._compute_mlp_mode",
       "not get_moe_a2a_backend().is_none()", "get_moe_a2a_backend().is_none()",
       ("expert-load", "lanes"), ("completes", ""), ("output", "x the tolerance"),
       masked=_bf16_deployments_fail),
    _m("s-post-experts-reduce-of-combined-output", "the MoE block's post-experts reduce (reduce_moe_output, as "
       "Qwen2-MoE's block calls it) still owes the combine's complete output the TP sum (historical bug 1's double "
       "reduce, one level up)", f"{S_UTILS}:post_experts_output_is_complete|should_skip_post_experts_all_reduce",
       "return a2a.is_flashinfer() or a2a.is_pplx()", "return a2a.is_pplx()",
       # 0.5.15 .. 0.5.20: a reason of the skip predicate the model blocks ask.
       ("reduce", ""), ("output", "x the tolerance"), ("completes", ""),
       # 0.5.15 .. 0.5.20: a reason of the skip predicate the model blocks ask.
       forms=(("    if get_moe_a2a_backend().is_flashinfer():\n        return True\n", ""),),
       equivalent=_skip_predicate_knows_a2a, masked=_bf16_deployments_fail),
    _m("s-shared-expert-tp-sharded", "DeepSeek's shared expert is sharded over TP under FlashInfer A2A, its partial "
       "sums never summed", f"{S_DSV2}.__init__",
       "                or get_moe_a2a_backend().is_flashinfer()\n                or get_moe_a2a_backend().is_megamoe()\n",
       "                or get_moe_a2a_backend().is_megamoe()\n", ("output", "x the tolerance"), ("completes", ""),
       masked=_bf16_deployments_fail),
    _m("s-shared-output-dropped", "DeepSeek's block under an all-to-all returns the routed output without its shared "
       "expert's", f"{S_DSV2}.forward_deepep", "            final_hidden_states,\n            shared_output,\n",
       "            final_hidden_states,\n            None,\n", ("output", "x the tolerance"),
       forms=(("        if shared_output is not None:\n            x = shared_output",
               "        if False:\n            x = shared_output"),),
       masked=_bf16_deployments_fail),
    _m("s-routed-scale-twice", "DeepSeek's block scales the routed output although its TopK folded the routed "
       "scaling factor into the weights", f"{S_DSV2}.forward_deepep",
       "            fused_in_topk=self.routed_scaling_factor_fused_in_topk,\n        )",
       "            fused_in_topk=False,\n        )", ("output", "x the tolerance"),
       forms=(("            if self.experts.should_fuse_routed_scaling_factor_in_topk or _use_aiter:\n",
               "            if _use_aiter:\n"),), equivalent=_scale_folds_for_bf16,
       masked=_bf16_deployments_fail),
    _m("s-idle-rank-skips-experts", "Qwen3-MoE's block on an idle DP rank returns at once, never joining the "
       "all-to-all its peers run", "sglang.srt.models.qwen3_moe:Qwen3MoeSparseMoeBlock.forward_normal",
       "        else:\n            topk_output = self.topk.empty_topk_output(hidden_states.device)\n",
       "        else:\n            return hidden_states\n", ("completes", ""),
       equivalent=_qwen3_idle_branch, masked=_bf16_deployments_fail),
)
