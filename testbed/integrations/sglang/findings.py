"""What the testbed found in SGLang 0.5.23's code, each written up in ``docs/findings.md``
under its id; they apply to scenarios of ``--integration sglang``."""

from __future__ import annotations

from fakes.flashinfer.profiles import resolve
from testbed.integrations.base import Finding

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
)
