"""The scenarios ``--integration vllm`` runs: what vLLM 0.33.0's own classes can run on the
CPU, and what only impl has."""

from __future__ import annotations

from testbed.scenario.model import Scenario, first_given

# The paths vLLM 0.33.0 drives through a FlashInfer manager that run on the CPU (its
# all-gather/reduce-scatter fallback needs all_gatherv, which vLLM's CpuCommunicator lacks),
# and the activation formats its quantize step (moe_kernel_quantize_input) runs on the CPU:
# nvfp4 and the fp8 formats call CUDA custom ops or Triton (ops.scaled_fp4_quant,
# per_token_group_quant_fp8), which vLLM's CPU build lacks.
VLLM_PATHS = ("one_sided", "two_sided")
VLLM_FORMATS = ("bf16", "mxfp8")


# What only impl has: the scenario flags vLLM's classes have no counterpart for.
_VLLM_IMPL_ONLY = (("--combine-signature", "combine_signature", "release"), ("--a2a-api", "a2a_api", "auto"),
                   ("--expert-kernel", "expert_kernel", "reference"), ("--expert-output", "expert_output", "separate"),
                   ("--invalid-expert-id", "invalid_expert_id", "-1"), ("--defer-finalize", "defer_finalize", False),
                   ("--sequence-parallel", "sequence_parallel", False), ("--shared-experts", "shared_experts", False),
                   ("--routed-scaling", "routed_scaling", 1.0), ("--backend", "flashinfer_backend", "fake"))


def vllm_rule(sc: Scenario) -> tuple[str, str] | None:
    """``(flag, rule)`` the scenario breaks under ``--integration vllm``, or None."""
    if sc.path not in VLLM_PATHS:
        return "--path", (f"--integration vllm drives {', '.join(VLLM_PATHS)}: vLLM's all-gather/reduce-scatter "
                          "needs all_gatherv, which its CpuCommunicator does not implement, and expert parallel "
                          "off has no all-to-all")
    if sc.layout.dp < 2:
        return "--layout", ("vLLM runs its all-to-all kernels only with DP > 1 (FusedMoEParallelConfig."
                            f"use_all2all_kernels); with dp={sc.layout.dp} its layers dispatch nothing")
    flag = first_given(sc, _VLLM_IMPL_ONLY)
    if flag:
        return flag, ("is not driven under --integration vllm, which runs vLLM's own classes on the fake "
                      "(impl's combine signatures, API choice, TRT-LLM experts, workspace output and sentinel "
                      "have no vLLM counterpart; its shared experts, scaling, deferral and sequence parallel "
                      "live in vLLM's MoERunner, which the adapter does not drive yet)")
    fmts = sorted({ly.fmt for st in sc.stages for ly in st} - set(VLLM_FORMATS))
    if fmts:
        return "--stages", (f"vLLM 0.33.0 quantizes {', '.join(fmts)} with CUDA custom ops or Triton "
                            f"(moe_kernel_quantize_input), absent on the CPU; --integration vllm runs "
                            f"{', '.join(VLLM_FORMATS)}")
    budgets = {ly.max_num_tokens for st in sc.stages for ly in st}
    if len(budgets) > 1:
        return "--stages", (f"vLLM builds every MoE layer's prepare/finalize with "
                            f"scheduler_config.max_num_batched_tokens: give every layer one budget, got "
                            f"{sorted(budgets)}")
    return None
