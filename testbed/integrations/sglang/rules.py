"""The scenarios ``--integration sglang`` runs: SGLang's start-up rules for FlashInfer MoE A2A
(0.5.23's, and where a release's differ, its own) and what its ``FlashinferDispatcher`` can run."""

from __future__ import annotations

import inspect

from testbed.cluster.layout import ParallelLayout
from testbed.integrations.sglang.environment import ENGINE, dispatcher_has_sp_prefill, runner_backend
from testbed.scenario.model import Scenario, first_given

# What SGLang 0.5.23's FlashinferDispatcher runs: MoeAlltoAll (its one-sided path) at one
# capacity and one process-wide dispatch format, and the (sentinel, expert output) pairs of the
# MoE runners SGLang allows with FlashInfer A2A (arg_groups/moe_hook.py), by
# testbed.integrations.sglang.environment.runner_backend: flashinfer_trtllm (-1), flashinfer_cutedsl
# (num_experts) and flashinfer_cutlass (num_experts, combining from the workspace); an older
# release's start-up accepts fewer (_startup_rule).
SGLANG_FORMATS = ("bf16", "nvfp4")
SGLANG_RUNNER_CHOICES = (("-1", "separate"), ("num_experts", "separate"), ("num_experts", "workspace"))
# The runners SGLang starts on an unquantized checkpoint, what --block builds (flashinfer_trtllm,
# flashinfer_cutlass; flashinfer_cutedsl needs NVFP4: arg_groups/moe_hook.py handle_moe_kernel_config).
SGLANG_BLOCK_RUNNERS = (("-1", "separate"), ("num_experts", "workspace"))
SGLANG_SP_TP = (4, 8)  # Muse Spark's layernorm SP: TP4/EP4 or TP8/EP8
_SGLANG_IMPL_ONLY = (("--combine-signature", "combine_signature", "release"), ("--a2a-api", "a2a_api", "auto"),
                     ("--expert-kernel", "expert_kernel", "reference"), ("--defer-finalize", "defer_finalize", False),
                     ("--sequence-parallel", "sequence_parallel", False),
                     ("--router-weight-on-input", "router_weight_on_input", False),
                     ("--mx-alignment", "mx_alignment", 0), ("--backend", "flashinfer_backend", "fake"))


def sglang_topology_supported(layout: ParallelLayout, sp_prefill: bool) -> bool:
    """SGLang's start-up rule for FlashInfer MoE A2A (``_flashinfer_a2a_topology_is_supported``)
    on the server arguments the adapter gives a stage of ``layout`` (TP = EP = its ranks): DP
    attention over the whole TP group (the testbed's tp 1: each rank a DP rank), or Muse
    Spark's prefill sequence parallelism on TP4/EP4 or TP8/EP8 without DP attention."""
    ranks = layout.tp * layout.dp
    if sp_prefill:
        return ranks in SGLANG_SP_TP
    return layout.dp == ranks


def sglang_rule(sc: Scenario) -> tuple[str, str] | None:
    """``(flag, rule)`` the scenario breaks under ``--integration sglang``, or None."""
    lay = sc.layout
    if sc.path != "one_sided":
        return "--path", ("--integration sglang drives SGLang's FlashinferDispatcher, which builds FlashInfer's "
                          "one-sided MoeAlltoAll (moe_a2a_backend flashinfer)")
    if lay.pp > 1:
        return "--layout", ("SGLang numbers its ranks stage-major (stage s is ranks s*W/pp .. (s+1)*W/pp - 1); the "
                            "testbed's layouts are vLLM's, DP outside PP, so a stage's ranks differ: give pp = 1")
    if sc.sp_prefill and sc.draft_layers:
        return "--draft-layers", ("Muse Spark's SP prefill runs without a draft model here (give --draft-layers with "
                                  "DP attention)")
    if sc.sp_prefill and not dispatcher_has_sp_prefill():
        return "--sp-prefill", ("this SGLang's FlashinferDispatcher has no SP-prefill all-to-all (it takes no "
                                "enable_sp_prefill_a2a=; Muse Spark's prefill sequence parallelism came with 0.5.23)")
    if not sglang_topology_supported(lay, sc.sp_prefill):
        # Muse Spark's prefill sequence parallelism joined the rule with its dispatcher (0.5.23).
        return ("--sp-prefill" if sc.sp_prefill else "--layout"), (
            f"SGLang {ENGINE.version_in_use()} refuses FlashInfer MoE A2A at start-up unless DP attention spans the TP "
            "group (attn_dp_size == tp_size: a layout W,1,W,1)" + (
                " or it is Muse Spark's TP4/EP4 or TP8/EP8 prefill sequence parallelism without DP attention "
                "(--sp-prefill on a layout of tp 4 or 8, dp 1) (arg_groups/moe_hook.py "
                "_flashinfer_a2a_topology_is_supported)" if dispatcher_has_sp_prefill() else
                " (arg_groups/moe_hook.py _handle_a2a_moe)"))
    if any(not any(counts) for counts in sc.passes):
        return "--tokens", ("SGLang's scheduler runs no forward where no DP rank has a token (it emits idle batches "
                            "only while max(global_num_tokens) > 0): give every pass a token somewhere")
    flag = first_given(sc, _SGLANG_IMPL_ONLY)
    if flag:
        return flag, ("is not driven under --integration sglang, which runs SGLang's own dispatcher on the fake "
                      "(impl's combine signatures, API choice and TRT-LLM experts have no SGLang counterpart; a "
                      "router weight on the input and vLLM's sequence parallel have no SGLang model with FlashInfer "
                      "A2A here; the GPU runner drives impl)")
    block = _block_rule(sc)
    if block:
        return block
    if (sc.invalid_expert_id, sc.expert_output) not in SGLANG_RUNNER_CHOICES:
        return "--expert-output", ("SGLang combines from the workspace with the flashinfer_cutlass runner only, whose "
                                   "sentinel is num_experts: give --invalid-expert-id num_experts")
    fmts = sorted({ly.fmt for st in sc.stages for ly in st})
    if len(fmts) > 1 or fmts[0] not in SGLANG_FORMATS:
        return "--stages", (f"SGLang's FlashInfer A2A dispatch format is process-wide (SGLANG_MOE_NVFP4_DISPATCH): "
                            f"give every layer one of {', '.join(SGLANG_FORMATS)}, got {', '.join(fmts)}")
    budgets = {ly.max_num_tokens for st in sc.stages for ly in st}
    if len(budgets) > 1:
        return "--stages", (f"SGLang sizes every layer's MoeAlltoAll at one capacity "
                            f"(SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK): give every layer one budget, got "
                            f"{sorted(budgets)}")
    if sc.sp_prefill:
        if lay.dp > 1:
            return "--sp-prefill", ("Muse Spark's SP runs without DP attention: every rank of the TP group holds the "
                                    "same rows, which the testbed's layouts give with dp = 1 (tp 4 or 8)")
        if (sc.invalid_expert_id, sc.expert_output) != ("-1", "separate") or fmts != ["bf16"]:
            return "--sp-prefill", ("Muse Spark's layernorm SP needs the flashinfer_trtllm runner (--invalid-expert-id "
                                    "-1, --expert-output separate; arg_groups/layernorm_sp_hook.py), and its SP "
                                    "dispatcher, given no quant config, dispatches bf16: give --stages bf16:B,...")
        uneven = [counts[0] for counts in sc.passes if counts[0] % lay.tp]
        if uneven:
            return "--tokens", (f"Muse Spark pads a prefill to a multiple of tp ({lay.tp}) with zero rows its router "
                                f"would route, which the testbed does not model: give multiples of {lay.tp}, got "
                                f"{uneven}")
    return _startup_rule(sc, fmts[0])


def _startup_rule(sc: Scenario, fmt: str) -> tuple[str, str] | None:
    """The release's own FlashInfer A2A start-up handler on the scenario's server arguments
    (the runners and topologies each release accepts differ)."""
    from testbed.integrations.sglang import shapes
    from testbed.integrations.sglang.adapter import server_arguments

    refused = shapes.a2a_startup_refusal(server_arguments(sc, **shapes.dispatch_format_argument(fmt)), fmt)
    if refused is None:
        return None
    runner = runner_backend(sc.invalid_expert_id, sc.expert_output)
    flag = "--invalid-expert-id" if "runner" in refused else "--layout"
    return flag, (f"SGLang {ENGINE.version_in_use()}'s start-up refuses FlashInfer MoE A2A with the MoE runner the "
                  f"scenario's sentinel and combine region ask for ({runner}) on this layout: {refused}")


def _block_rule(sc: Scenario) -> tuple[str, str] | None:
    """The rule of ``--block`` and of what only a model's block has (shared experts, a routed
    scaling factor)."""
    from testbed.integrations.sglang.blocks import FAMILIES

    if sc.block and sc.block not in FAMILIES:
        return "--block", f"must be one of {', '.join(FAMILIES)} (SGLang's model MoE blocks), got {sc.block!r}"
    shared = sc.block and FAMILIES[sc.block].shared
    if not shared:
        flag = first_given(sc, (("--shared-experts", "shared_experts", False), ("--routed-scaling", "routed_scaling",
                                                                                1.0)))
        if flag:
            return flag, ("lives in SGLang's model MoE block: give --block deepseek_v2 (" + (
                f"{sc.block}'s block has none" if sc.block else "the MoE layer alone has none") + ")")
    if not sc.block:
        return None
    unbuilt = ENGINE.unimportable(f"sglang.srt.models.{FAMILIES[sc.block].module}")
    if unbuilt:
        return "--block", (f"{unbuilt} (a CUDA package, not on the all-to-all's path): the testbed cannot build this "
                           "family's block on this release")
    if shared and not sc.shared_experts:
        return "--shared-experts", (f"{sc.block}'s block calls its shared experts on every batch with a token (the "
                                    "DeepSeek models it serves have them): give --shared-experts")
    if sc.sp_prefill:
        return "--block", "Muse Spark's SP prefill runs its own MoE block: give --block with DP attention"
    if sc.draft_layers:
        return "--draft-layers", ("a draft model's MoE block is its MTP layer (built as nextn), which --block does not "
                                  "build: give --draft-layers without --block")
    if any(ly.fmt != "bf16" for st in sc.stages for ly in st):
        return "--block", ("the block is built from an unquantized (bf16) checkpoint, whose FusedMoE dispatches bf16 "
                           "(an nvfp4 dispatch comes with ModelOpt's NVFP4 quant method): give --stages bf16:B,...")
    if (sc.invalid_expert_id, sc.expert_output) not in SGLANG_BLOCK_RUNNERS:
        return "--invalid-expert-id", ("SGLang starts the flashinfer_cutedsl runner only on an NVFP4 checkpoint "
                                       "(arg_groups/moe_hook.py handle_moe_kernel_config), and the block is built "
                                       "unquantized: give -1 (flashinfer_trtllm) or num_experts with --expert-output "
                                       "workspace (flashinfer_cutlass)")
    return None


def served_refusal(es) -> str | None:
    """Why the release cannot serve ``es`` on a CPU: its own start-up refuses FlashInfer A2A with
    its TRT-LLM runner (before 0.5.15 it takes the CUTLASS and CuTe DSL runners only), or its CPU
    platform cannot run DP attention (0.5.15 .. 0.5.18, SGL-013); None where it can."""
    refused = sglang_rule(es.scenario((tuple(1 for _ in range(es.dp)),), False))
    if refused:
        return refused[1]
    batch = ENGINE.module("sglang.srt.model_executor.forward_batch_info")
    if batch is not None and "global_num_tokens, pin_memory=True" in inspect.getsource(batch):
        return (f"SGLang {ENGINE.version_in_use()}'s CPU platform cannot run DP attention: its DP padding "
                "(prepare_mlp_sync_batch) pins the token counts' tensor, which a torch without an accelerator "
                "refuses, and asks the attention backend get_cuda_graph_seq_len_fill_value, which no CPU backend "
                "answers (SGL-013; both fixed in 0.5.19)")
    return None
