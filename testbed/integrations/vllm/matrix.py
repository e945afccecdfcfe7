"""The matrix entries of ``--integration vllm``: vLLM 0.33.0's own MoE layer in the deployments
it runs, on the passes its engine makes."""

from __future__ import annotations

from testbed.scenario.engine import EngineScenario
from testbed.scenario.model import Scenario, from_text

# vLLM's own layer (FusedMoEFactory -> MoERunner from 0.24; the FusedMoE module before): one budget
# per model (scheduler_config's max_num_batched_tokens), sequence parallel wherever vLLM turns it on
# (0.29 on: one-sided, TP > 1, DP > 1), and the engine's step rule on every pass (an idle DP rank
# runs the 1-token dummy batch; a step where every DP rank is idle runs no forward). Every entry is
# validated where it runs, against the release in use (``rules.vllm_rule``): before 0.29 the
# one-sided backend is not sequence parallel and its prepare builder refuses fp8, 0.20.0's refuses
# all but nvfp4, 0.24's experts oracle has no Triton mxfp8 backend and 0.18/0.19's no nvfp4
# emulation backend.
VLLM_MATRIX: tuple[Scenario, ...] = (
    from_text("2,1,2,1", "bf16:16", "5,7 3,0", integration="vllm", validated=False, label="vLLM one-sided; an idle DP rank's dummy batch"),
    # An mxfp8 layer then a bf16 one grows the shared communication, and in one forward its bf16
    # dispatch reaches into the mxfp8 round's combine region with nothing between (FI-RACE).
    from_text("2,1,2,1", "mxfp8:16,bf16:16", "4,6 1,3", integration="vllm", validated=False,
       label="vLLM: an mxfp8 model with a bf16 MTP layer: the shared communication grows"),
    from_text("2,1,2,1", "bf16:16,mxfp8:16", "4,6 1,3", integration="vllm", validated=False,
       label="vLLM: a bf16 layer then an mxfp8 one: the shared communication is kept"),
    from_text("4,2,2,1", "bf16:16,mxfp8:16", "5,2 9,3", integration="vllm", validated=False, routing="spread", sequence_parallel=True,
       label="vLLM TP 2 (sequence parallel); bf16 then mxfp8 (kept)"),
    from_text("4,2,2,1", "bf16:16", "5,0 0,3", integration="vllm", validated=False, sequence_parallel=True,
       label="vLLM TP 2 (sequence parallel), idle DP ranks' dummy batches"),
    from_text("4,2,2,1", "bf16:16", "5,3 0,4", integration="vllm", validated=False, sequence_parallel=True, shared_experts=True,
       routed_scaling=2.5, label="vLLM's MoERunner: sequence parallel, replicated shared experts, routed scaling"),
    from_text("4,2,2,1", "fp8_block:16", "5,1 2,6", integration="vllm", validated=False, sequence_parallel=True, shared_experts=True,
       routed_scaling=2.5, label="DeepSeek-V3 style: blockwise FP8 under sequence parallel, shared experts, scaling"),
    from_text("2,1,2,1", "bf16:16,fp8_block:16", "4,6 0,3", integration="vllm", validated=False, shared_experts=True,
       label="vLLM: a bf16 layer then a blockwise FP8 one, shared experts (kept)"),
    from_text("2,1,2,1", "mxfp8:8", "0,3", integration="vllm", validated=False, label="vLLM mxfp8, an idle DP rank's dummy batch"),
    from_text("2,1,2,1", "nvfp4:16", "5,7 3,1", integration="vllm", validated=False,
       label="vLLM ModelOpt nvfp4 alone, one-sided: the workspace sized by the first layer's scales"),
    # Routed scaling where no release is sequence parallel (TP 1): the runner's scale on every release.
    # nvfp4, the format every release's one-sided path dispatches (0.20.0's alone).
    from_text("4,1,4,1", "nvfp4:8", "2,5,1,3", integration="vllm", validated=False, shared_experts=True, routed_scaling=2.5,
       label="vLLM's MoERunner at TP 1: shared experts and routed scaling, nvfp4"),
    from_text("4,1,4,1", "bf16:16,nvfp4:16", "3,0,7,1 2,2,0,5", integration="vllm", validated=False, shared_experts=True,
       label="vLLM ModelOpt nvfp4 after a bf16 layer (kept), shared experts, DP 4"),
    # nvfp4 then bf16: the bf16 dispatch (2H bytes a token) reaches past nvfp4's (H/2 + H/16) (FI-RACE).
    from_text("4,2,2,1", "nvfp4:16,bf16:16", "5,1 2,6", integration="vllm", validated=False, sequence_parallel=True, shared_experts=True,
       routed_scaling=2.5, label="vLLM ModelOpt nvfp4 then bf16 under sequence parallel: the shared communication grows"),
    from_text("8,2,2,2", "mxfp8:8,bf16:8;bf16:8", "4,2 7,8", integration="vllm", validated=False, sequence_parallel=True,
       label="vLLM PP 2 with TP 2 (sequence parallel): the stages replace 1 and 0 times"),
    # PP 2 and blockwise FP8 on formats 0.24 on build (0.24's oracle has no mxfp8 backend; 0.18/0.19's
# nvfp4 oracle has no emulation backend, and the others swizzle the weights on the GPU).
    from_text("4,1,2,2", "nvfp4:8,bf16:8;bf16:8", "3,5 1,2", integration="vllm", validated=False,
       label="vLLM PP 2 without sequence parallel: the stages replace 1 and 0 times"),
    from_text("4,1,2,2", "nvfp4:8;nvfp4:8", "2,5 4,1", integration="vllm", validated=False,
       label="vLLM PP 2, nvfp4 in both stages: each stage's EP group set up apart"),
    from_text("4,1,2,2", "nvfp4:8;fp8_block:8", "2,1 4,4", integration="vllm", validated=False, path="two_sided",
       hidden=512, top_k=4, label="vLLM two-sided PP 2: an nvfp4 stage and a blockwise FP8 stage"),
    from_text("4,1,4,1", "bf16:8", "0,0,0,0 2,0,0,1", integration="vllm", validated=False,
       label="vLLM DP 4: an all-idle step (no forward), then idle ranks' dummy batches"),
    # nvfp4: the format every release's one-sided path dispatches (0.18/0.19's is written for it alone).
    from_text("4,1,4,1", "nvfp4:8", "3,1,0,6", integration="vllm", validated=False, top_k=1, router_weight_on_input=True,
       routing="hotspot", label="vLLM router weight on input (top_k 1), nvfp4"),
    from_text("8,1,8,1", "bf16:8", "0,1,2,3,4,5,6,8", integration="vllm", validated=False, experts=32, top_k=8, routing="local",
       label="vLLM EP 8, top_k 8"),
    from_text("4,2,2,1", "bf16:8", "0,5 3,3", integration="vllm", validated=False, path="two_sided", hidden=512,
       label="vLLM two-sided, TP 2"),
    from_text("4,2,2,1", "bf16:8", "4,1 2,6", integration="vllm", validated=False, path="two_sided", hidden=512, shared_experts=True,
       label="vLLM two-sided, TP 2: TP-sharded shared experts reduced apart from the reduced routed output"),
    from_text("4,1,4,1", "mxfp8:8,bf16:8", "2,1,1,3", integration="vllm", validated=False, path="two_sided", hidden=512,
       label="vLLM two-sided, mxfp8 then bf16"),
    # One level down: the prepare/finalize and kernel alone, fed what a router left.
    from_text("4,2,2,1", "bf16:16,mxfp8:16", "5,2 9,3", integration="vllm", validated=False, level="kernel",
       label="vLLM's prepare/finalize and kernel alone (--level kernel), TP 2 without sequence parallel"),
)


# vLLM 0.33.0's own engine (``LLM`` with the external launcher), the engine level. Each DP rank
# has its own prompts of uneven lengths and generation lengths, so DP ranks go idle (and run
# the dummy batch) at different steps.
ENGINE_MATRIX: tuple[EngineScenario, ...] = (
    EngineScenario(dp=2, prompts=((5, 11), (7,)), max_tokens=(4, 1), label="vLLM's engine DP 2 + EP, one-sided"),
    EngineScenario(dp=4, prompts=((5, 9), (6,), (), (12,)), max_tokens=(3, 1, 1, 2),
                   label="vLLM's engine DP 4 + EP, one-sided; a DP rank with no prompts"),
    EngineScenario(dp=2, tp=2, prompts=((5, 9), (6,)), max_tokens=(3, 1),
                   label="vLLM's engine TP 2 x DP 2 + EP, one-sided, sequence parallel"),
    EngineScenario(dp=2, prompts=((6, 10), (5,)), max_tokens=(3, 1), path="two_sided",
                   label="vLLM's engine DP 2 + EP, two-sided"),
    EngineScenario(dp=2, prompts=((5, 11), (7,)), max_tokens=(3, 1), arch="deepseek-v2",
                   label="vLLM's engine DP 2 + EP, one-sided, DeepSeek-V2 block: grouped top-k, shared expert"),
    # vLLM's model builds the shared expert itself: replicated under sequence parallel.
    EngineScenario(dp=2, tp=2, prompts=((9,), (4, 6)), max_tokens=(1, 3), arch="deepseek-v2",
                   label="vLLM's engine TP 2 x DP 2 + EP, sequence parallel, DeepSeek-V2 block's shared expert"),
)
