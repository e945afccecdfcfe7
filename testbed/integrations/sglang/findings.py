"""What the testbed found in SGLang's code (0.5.23's latent ones, SGL-002 .. SGL-005; the bugs
0.5.9 .. 0.5.19 shipped and later releases fixed, SGL-006 .. SGL-012), each written up in
``docs/findings.md`` under its id; they apply to scenarios of ``--integration sglang`` on a
release whose code still holds them (``Finding.code``)."""

from __future__ import annotations

from fakes.flashinfer.profiles import resolve
from testbed.integrations.base import Finding
from testbed.scenario.model import Scenario

# Where each lives in SGLang's code, relative to the release's root.
_DISPATCHER = "sglang/srt/layers/moe/token_dispatcher/flashinfer.py"
_MOE_UTILS = "sglang/srt/layers/moe/utils.py"


def _format(sc: Scenario) -> str:
    return sc.stages[0][0].fmt


def _unequal_dp_counts(sc: Scenario) -> bool:
    return any(len(set(counts)) > 1 for counts in sc.passes)


FINDINGS: tuple[Finding, ...] = (
    Finding("SGL-002", "SGLang 0.5.23's dispatcher imports flashinfer.comm.MoeAlltoAll, which FlashInfer 0.7.4 "
                       "removed: its guarded import sets use_flashinfer False and every FlashinferDispatcher "
                       "raises ImportError",
            lambda sc: sc.profile == "0.7.4",
            (("completes", "Flashinfer is not installed or does not support A2A"),)),
    Finding("SGL-003", "SGLang's FlashinferDispatcher builds MoeAlltoAll on a FlashInfer before 0.7.1 without the "
                       "barrier on the EP group that those releases leave to the caller",
            lambda sc: not resolve(sc.profile).init_barrier,
            (("collectives", "was not followed by a barrier"),),
            reachable="no",
            evidence="SGLang's ModelRunner.load_model ends with dist_barrier_after_load, a monitored_barrier on "
                     "the TP group's CPU group, after the whole model (every dispatcher's MoeAlltoAll) is built and "
                     "before any forward; the FlashInfer A2A backend runs only where DP attention spans the TP "
                     "group, whose ranks are the EP group's; and run: with the last EP rank's zeroing held until "
                     "rank 0 moves on (--late-zeroing), the scheduler's token-count all-gather on that group before "
                     "every forward orders the two, and the round completes",
            code=(("sglang/srt/layers/moe/token_dispatcher/flashinfer.py", r"MoeAlltoAll\("),)),
    Finding("SGL-004", "SGLang's OLMoE block builds its FusedMoE without top_k; under the FlashInfer A2A backend "
                       "FusedMoE creates a FlashinferDispatcher with router_topk None, whose workspace sizing "
                       "raises TypeError (None * 4) while the model is built",
            lambda sc: sc.block == "olmoe",
            (("completes", "unsupported operand type(s) for *: 'NoneType' and 'int'"),),
            reachable="yes",
            evidence="the model is built at start-up (ModelRunner.load_model) with the server's MoE configuration; "
                     "SGLang's start-up rule for --moe-a2a-backend flashinfer asks only for DP attention over the "
                     "TP group (arg_groups/moe_hook.py), not for a model that supports it, so OLMoE started so "
                     "stops at load with this TypeError instead of a refusal naming the model",
            # OLMoE's FusedMoE(...) call without a top_k= before its closing parenthesis.
            code=(("sglang/srt/models/olmoe.py", r"self\.experts = FusedMoE\((?:(?!top_k=)[^\n]|\n(?!        \)))*"
                                                 r"\n        \)"),)),
    Finding("SGL-005", "SGLang's PhiMoE block builds FusedMoE(reduce_results=True): under the FlashInfer A2A backend "
                       "forward_impl all-reduces the combine's complete output over the TP group, summing the "
                       "outputs of every DP rank's own tokens (historical bug 1's double reduce)",
            # Its silent form, where SGLang's max-len DP padding gives every DP rank the same count;
            # unequal counts make the all-reduce's shapes differ, and a rank dies (a FAIL, the same bug).
            lambda sc: sc.block == "phimoe" and all(len(set(counts)) == 1 for counts in sc.passes),
            (("output", "x the tolerance"),),
            reachable="no",
            evidence="masked, read from source: the FlashInfer A2A backend runs only under DP attention over the "
                     "whole TP group, and PhiMoE's embedding is a VocabParallelEmbedding over the full TP group "
                     "(enable_tp, all-reducing over it, models/phimoe.py PhiMoEModel): served so, the model starts "
                     "and its embedding already sums the DP ranks' rows (equal counts), or its all-reduce's shapes "
                     "differ, or an idle rank skips it, before the first MoE block; the block's double reduce adds "
                     "to an output that is wrong already (that embedding bug, reachable, is not run here)",
            code=(("sglang/srt/models/phimoe.py", r"reduce_results=True"),
                  ("sglang/srt/layers/moe/fused_moe_triton/layer.py",
                   r"if self\.reduce_results and \(self\.moe_tp_size > 1 or self\.moe_ep_size > 1\)"))),
    Finding("SGL-006", "SGLang 0.5.9/0.5.10's FlashinferDispatcher.dispatch reads self.quant_config.get("
                       "'input_global_scale'), while BaseDispatcher leaves quant_config None until a quant method "
                       "sets it: every layer of an unquantized checkpoint raises AttributeError on its first dispatch",
            lambda sc: _format(sc) == "bf16",
            (("completes", "'NoneType' object has no attribute 'get'"),),
            reachable="yes",
            evidence="every forward of an unquantized (bf16) checkpoint served with --moe-a2a-backend flashinfer: "
                     "only ModelOpt's NVFP4 method calls set_quant_config, and the dispatch reads it for every "
                     "batch, the idle DP rank's dummy token included. Fixed in 0.5.11 (BaseDispatcher.quant_config "
                     "defaults to {}; no pull request found that names it)",
            code=(("sglang/srt/layers/moe/token_dispatcher/base.py", r"self\.quant_config: Optional\[dict\] = None"),
                  (_DISPATCHER, r"self\.quant_config\.get\("))),
    Finding("SGL-007", "SGLang 0.5.9 .. 0.5.14 size the MoeAlltoAll workspace for NVFP4 payloads whenever "
                       "SGLANG_MOE_NVFP4_DISPATCH is on, which their start-up turns on for FlashInfer A2A whatever "
                       "the checkpoint, while a layer without an input global scale dispatches BF16 rows, 3.6x "
                       "larger: the dispatch overruns its region into the combine region",
            lambda sc: _format(sc) == "bf16",
            (("workspace", "the layer needs"), ("completes", "workspace insufficient for combine payload region"),
             ("completes", "slice must fall within the workspace size per rank")),
            reachable="yes",
            evidence="an unquantized checkpoint served with --moe-a2a-backend flashinfer: _handle_a2a_moe sets "
                     "SGLANG_MOE_NVFP4_DISPATCH=1 where the user left it unset, the dispatcher sizes "
                     "hidden/2 + hidden/16 bytes a row, and dispatch sends the bf16 rows (no global scale). "
                     "Overruns once a rank's runtime max passes about a quarter of the capacity. 0.5.15 sets the "
                     "variable only for an NVFP4 checkpoint (SGLang PR #22394); the dispatcher sized the larger of "
                     "the two formats from 0.5.20 on (PR #31470), which also covers an NVFP4 checkpoint's bf16 "
                     "layers",
            code=((_DISPATCHER, r"if MOE_NVFP4_DISPATCH and not speculative_algo\.is_eagle\(\)"),
                  ("sglang/srt/server_args.py", r"if (?:os\.environ\.get\(\"SGLANG_MOE_NVFP4_DISPATCH\"\) is None|not "
                                                r"envs\.SGLANG_MOE_NVFP4_DISPATCH\.is_set\(\)):\s*\n\s*envs\."
                                                r"SGLANG_MOE_NVFP4_DISPATCH\.set\(True\)")),
            signatures=3),
    Finding("SGL-008", "SGLang 0.5.9 .. 0.5.14's Qwen3-MoE block all-reduces the combine's complete output under "
                       "FlashInfer A2A (0.5.9/0.5.10 over the TP group, inline; 0.5.11 .. 0.5.14 over the EP group "
                       "and then the TP group, as should_skip_post_experts_all_reduce, which does not know the A2A "
                       "backend, says): under DP attention it sums the outputs of different DP ranks' tokens, or "
                       "its shapes differ",
            lambda sc: sc.block == "qwen3_moe",
            (("output", "x the tolerance"), ("completes", "_all_reduce(final_hidden_states)")),
            reachable="yes",
            evidence="every forward of a Qwen3-MoE model served with FlashInfer A2A: its decoder layer passes no "
                     "fusion or reduce-scatter on this path, and the TP group is the EP group. Fixed in 0.5.15 "
                     "(should_skip_post_experts_all_reduce skips for the FlashInfer backend, SGLang PR #26255)",
            code=((_MOE_UTILS, r"\A(?![\s\S]*def (?:should_skip_post_experts_all_reduce|post_experts_output_is_"
                               r"complete)\([\s\S]*?\.is_flashinfer\(\))"),),
            signatures=2),
    Finding("SGL-009", "SGLang 0.5.9 .. 0.5.19's gpt-oss block (forward_normal) all-reduces the combine's complete "
                       "output over the TP group whatever the A2A backend: under DP attention it sums the outputs "
                       "of different DP ranks' tokens, or its shapes differ",
            lambda sc: sc.block == "gpt_oss",
            (("output", "x the tolerance"), ("completes", "tensor_model_parallel_all_reduce(final_hidden_states)")),
            reachable="yes",
            evidence="every forward of gpt-oss served with FlashInfer A2A (its start-up accepts the model's "
                     "runners); the TP group is the EP group. Fixed in 0.5.20 (the block asks "
                     "should_skip_post_experts_all_reduce, SGLang PR #37199 'avoid duplicate MoE reduction with "
                     "DP attention')",
            code=(("sglang/srt/models/gpt_oss.py", r"if self\.tp_size > 1(?: and not [\w.()]+)?:\s*\n\s*"
                                                   r"final_hidden_states = tensor_model_parallel_all_reduce"),),
            signatures=2),
    Finding("SGL-010", "SGLang 0.5.9 .. 0.5.18 build the speculative draft model's MoeAlltoAll at the target's "
                       "size, so FlashInfer's size-keyed cache hands both one workspace",
            lambda sc: sc.draft_layers > 0,
            (("workspace", "the draft model's MoeAlltoAlls"),),
            reachable="yes",
            evidence="speculative decoding (EAGLE/MTP) with FlashInfer A2A: the draft's nextn layer builds its "
                     "dispatcher with the target's arguments, and the target's and the draft's decode rounds are "
                     "both live (each keeps its decode graph). Fixed in 0.5.19 (each dispatcher's workspace padded "
                     "by its namespace, _workspace_size_for_namespace; no pull request found that names it)",
            code=((_DISPATCHER, r"\A(?![\s\S]*_workspace_size_for_namespace)"),)),
    Finding("SGL-011", "SGLang 0.5.9 .. 0.5.15's dispatcher hands the router's top-k ids to MoeAlltoAll.dispatch "
                       "as they come; int64 ids fail FlashInfer's int32 check",
            lambda sc: sc.router_ids == "int64",
            (("completes", "token_selected_experts must be int32"),),
            evidence="not checked: SGLang's CUDA top-k kernels return int32 ids; which of its routers hand int64 "
                     "on this path was not traced. 0.5.16 casts them (topk_ids.to(torch.int32), 'FlashInfer "
                     "MoeAlltoAll's expert-ID ABI is int32')",
            code=((_DISPATCHER, r"\A(?![\s\S]*topk_ids\.to\(torch\.int32\))"),)),
    Finding("SGL-012", "SGLang 0.5.9 .. 0.5.11's dispatch passes MoeAlltoAll no invalid_token_expert_id: the "
                       "receive slots behind a DP rank with fewer tokens than the runtime max keep what was there, "
                       "and the experts compute them as routed rows",
            lambda sc: _unequal_dp_counts(sc),
            (("expert-load", "lanes"),),
            reachable="yes",
            evidence="every forward where the DP ranks' counts differ (the runtime max is the largest count); the "
                     "combine reads only the real rows, so the cost is the experts' work and stale ids reaching "
                     "them. Fixed in 0.5.12 (invalid_token_expert_id=-1, SGLang PR #24850 'Fix NaN in flashinfer "
                     "TRT-LLM A2A dispatch by sanitizing padding slots'; num_experts from 0.5.13)",
            code=((_DISPATCHER, r"self\.moe_a2a\.dispatch\((?:(?!invalid_token_expert_id)[^()]|\([^()]*\))*\)"),)),
)
