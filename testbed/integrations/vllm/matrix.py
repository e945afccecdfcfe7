"""The matrix entries of ``--integration vllm``: vLLM 0.33.0's own classes in the deployments it runs."""

from __future__ import annotations

from testbed.scenario.model import Scenario, from_text

# vLLM 0.33.0's own classes (--integration vllm): one budget per model (scheduler_config's
# max_num_batched_tokens), the formats its quantize step runs on the CPU (bf16, mxfp8).
VLLM_MATRIX: tuple[Scenario, ...] = (
    from_text("2,1,2,1", "bf16:16", "5,7 3,0", integration="vllm", label="vLLM one-sided; a 0-token rank"),
    # An mxfp8 layer then a bf16 one grows the shared communication, and in one forward its bf16
    # dispatch reaches into the mxfp8 round's combine region with nothing between (FI-RACE).
    from_text("2,1,2,1", "mxfp8:16,bf16:16", "4,6 1,3", integration="vllm",
       label="vLLM: an mxfp8 model with a bf16 MTP layer: the shared communication grows"),
    from_text("2,1,2,1", "bf16:16,mxfp8:16", "4,6 1,3", integration="vllm",
       label="vLLM: a bf16 layer then an mxfp8 one: the shared communication is kept"),
    from_text("4,2,2,1", "bf16:16,mxfp8:16", "5,2 9,3", integration="vllm", routing="spread",
       label="vLLM TP 2; bf16 then mxfp8 (kept)"),
    from_text("4,2,2,1", "bf16:16", "5,0 0,3", integration="vllm", label="vLLM TP 2, 0-token ranks"),
    from_text("2,1,2,1", "mxfp8:8", "0,3", integration="vllm", label="vLLM mxfp8 on a 0-token rank"),
    from_text("8,2,2,2", "mxfp8:8,bf16:8;bf16:8", "4,2 7,8", integration="vllm",
       label="vLLM PP 2 with TP 2: the stages replace 1 and 0 times"),
    from_text("4,1,4,1", "bf16:8", "0,0,0,0", integration="vllm", label="vLLM: a forward where no DP rank has a token"),
    from_text("4,1,4,1", "bf16:8", "3,1,0,6", integration="vllm", top_k=1, router_weight_on_input=True,
       routing="hotspot", label="vLLM router weight on input (top_k 1)"),
    from_text("8,1,8,1", "bf16:8", "0,1,2,3,4,5,6,8", integration="vllm", experts=32, top_k=8, routing="local",
       label="vLLM EP 8, top_k 8"),
    from_text("4,2,2,1", "bf16:8", "0,5 3,3", integration="vllm", path="two_sided", hidden=512,
       label="vLLM two-sided, TP 2"),
    from_text("4,1,4,1", "mxfp8:8,bf16:8", "2,1,1,3", integration="vllm", path="two_sided", hidden=512,
       label="vLLM two-sided, mxfp8 then bf16"),
)
