"""The matrix entries of ``--integration sglang``: SGLang 0.5.23's own classes in the deployments it runs."""

from __future__ import annotations

from testbed.scenario.model import Scenario, from_text

# Every entry is validated where it runs, against the release in use (``rules.sglang_rule``): an
# SGLang without SP prefill (before 0.5.23) refuses Muse Spark's, and each release's start-up
# accepts its own MoE runners with FlashInfer A2A (0.5.9 .. 0.5.12: flashinfer_cutlass alone).
# SGLang 0.5.23's own dispatcher (--integration sglang) in the two deployments it starts FlashInfer
# A2A in: DP attention over the TP group (bf16 or nvfp4 dispatch at one capacity) and Muse
# Spark's TP4/TP8 prefill sequence parallelism; each MoE runner's sentinel and combine region
# (flashinfer_trtllm: -1; flashinfer_cutedsl: num_experts; flashinfer_cutlass: num_experts,
# experts writing into the workspace).
SGLANG_MATRIX: tuple[Scenario, ...] = (
    from_text("4,1,4,1", "bf16:8", "4,4,4,4 2,2,2,2", integration="sglang", validated=False,
       label="SGLang DP attention, every rank the same count (as SGLang's max-len DP padding gives)"),
    from_text("2,1,2,1", "bf16:16", "5,7 3,1", integration="sglang", validated=False, label="SGLang DP attention, the flashinfer_trtllm runner"),
    from_text("4,1,4,1", "bf16:16,bf16:16", "5,0,7,3 1,2,0,16", integration="sglang", validated=False, invalid_expert_id="num_experts",
       label="SGLang DP attention: uneven counts, 0-token ranks, a rank at the capacity (flashinfer_cutedsl runner)"),
    from_text("4,1,4,1", "bf16:8,bf16:8", "6,2,0,3 1,1,1,8", integration="sglang", validated=False, invalid_expert_id="num_experts",
       expert_output="workspace", routing="spread",
       label="SGLang, the flashinfer_cutlass runner: experts write into the workspace's combine region"),
    from_text("2,1,2,1", "bf16:8,bf16:8,bf16:8", "3,5 8,1", integration="sglang", validated=False, routing="hotspot",
       label="SGLang: three MoE layers on one workspace (FlashInfer's size-keyed cache)"),
    from_text("4,1,4,1", "nvfp4:16,nvfp4:16", "5,0,7,16 2,3,1,1", integration="sglang", validated=False,
       label="SGLang nvfp4 dispatch (SGLANG_MOE_NVFP4_DISPATCH, ModelOpt's input global scale)"),
    from_text("2,1,2,1", "nvfp4:8", "3,8 1,0", integration="sglang", validated=False, invalid_expert_id="num_experts", routing="local",
       label="SGLang nvfp4 dispatch, the flashinfer_cutedsl runner"),
    from_text("4,1,4,1", "nvfp4:8,nvfp4:8", "6,2,0,3 1,1,1,8", integration="sglang", validated=False,
       invalid_expert_id="num_experts", expert_output="workspace", routing="spread",
       label="SGLang nvfp4 dispatch, the flashinfer_cutlass runner: scales interleaved 128x4, experts write into "
             "the workspace (the one runner 0.5.9 .. 0.5.12 start FlashInfer A2A with)"),
    from_text("4,4,1,1", "bf16:8,bf16:8", "4 8", integration="sglang", validated=False, sp_prefill=True,
       label="SGLang Muse Spark TP4/EP4 SP prefill: decode and SP-prefill MoeAlltoAlls live at once"),
    from_text("8,8,1,1", "bf16:16", "16 8", integration="sglang", validated=False, sp_prefill=True, experts=16, top_k=4,
       label="SGLang Muse Spark TP8/EP8 SP prefill"),
    from_text("4,1,4,1", "bf16:8,bf16:8", "3,0,8,1 2,2,0,5", integration="sglang", validated=False, draft_layers=1,
       label="SGLang speculative decoding: the draft model's MTP layer beside the target's (its MoeAlltoAll padded "
             "onto a workspace of its own)"),
    from_text("2,1,2,1", "bf16:4", "4,0 4,4", integration="sglang", validated=False, router_ids="int64", top_k=4,
       label="SGLang at its capacity limit (4 tokens, SGLANG_FLASHINFER_NUM_MAX_DISPATCH_TOKENS_PER_RANK=4); "
             "a router of int64 ids"),
    from_text("8,1,8,1", "bf16:8", "0,1,2,3,4,5,6,8", integration="sglang", validated=False, experts=32, top_k=8, routing="local",
       invalid_expert_id="num_experts", expert_output="workspace", label="SGLang EP 8, top_k 8"),
    # SGLang's own model MoE blocks (--block), called as their decoder layers call them.
    from_text("4,1,4,1", "bf16:16,bf16:16", "5,0,7,3 1,2,0,16", integration="sglang", validated=False, block="qwen3_moe",
       invalid_expert_id="num_experts", expert_output="workspace",
       label="SGLang's Qwen3-MoE block: an idle DP rank's empty routing, a rank at the capacity (flashinfer_cutlass "
             "runner)"),
    from_text("2,1,2,1", "bf16:8,bf16:8", "3,5 8,1", integration="sglang", validated=False, block="qwen3_moe", routing="hotspot",
       label="SGLang's Qwen3-MoE block, the flashinfer_trtllm runner"),
    from_text("4,1,4,1", "bf16:8,bf16:8", "6,2,0,3 1,1,1,8", integration="sglang", validated=False, block="deepseek_v2",
       shared_experts=True, routed_scaling=2.5, invalid_expert_id="num_experts", expert_output="workspace",
       label="SGLang's DeepSeek-V2/V3 block: its shared expert and routed scaling, an idle DP rank, the "
             "flashinfer_cutlass runner"),
    from_text("2,1,2,1", "bf16:16", "5,7 3,1", integration="sglang", validated=False, block="deepseek_v2", shared_experts=True,
       routed_scaling=2.5, label="SGLang's DeepSeek-V2/V3 block, the flashinfer_trtllm runner"),
    from_text("4,1,4,1", "bf16:8,bf16:8", "3,0,8,1 2,2,1,0", integration="sglang", validated=False, block="gpt_oss",
       label="SGLang's gpt-oss block (its own router, biased swiglu experts), an idle DP rank"),
    from_text("2,1,2,1", "bf16:8", "3,5", integration="sglang", validated=False, block="olmoe",
       label="SGLang's OLMoE block (FusedMoE(reduce_results=True), built without top_k)"),
    from_text("2,1,2,1", "bf16:8", "4,4 2,2", integration="sglang", validated=False, block="phimoe",
       label="SGLang's PhiMoE block (FusedMoE(reduce_results=True)); every DP rank the same count"),
)
