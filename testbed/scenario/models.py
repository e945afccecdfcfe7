"""Real models by name: the MoE shape of each model people deploy on NVLink all-to-all, as its
published configuration gives it, and the dispatch formats its deployments use.

A preset fills the scenario flags a user leaves out (``a2a-testbed run --model deepseek-v3``);
any flag given overrides it. The numbers are the models' own ``config.json`` (the Hugging Face
repository each entry names); where the installed ``transformers`` carries the model's
configuration class with the model's numbers as its defaults, ``tests/test_models.py`` holds the
entry to them.

What a preset sets: hidden, routed experts, top_k, a shared expert, the routed scaling factor,
the router weight on the input (Llama 4's top-1 sigmoid gate), and one MoE layer per pipeline
stage in the model's first dispatch format, plus the MTP layers on the last stage (DeepSeek-V3's
and GLM-4.5's next-token predictors are MoE layers; they run as the drafter of speculative
decoding with one token per request where the base model verifies two, hence half the budget).
"""

from __future__ import annotations

from dataclasses import dataclass

# A stage's MoE layer budget, and the MTP layer's: the drafter proposes one token per request
# where the base model verifies the request's token and the draft.
BASE_BUDGET = 16
MTP_BUDGET = BASE_BUDGET // 2
# vLLM's TRT-LLM MXFP4 x MXFP8 MoE rounds gpt-oss's hidden up to 256 and quantizes the dispatched
# activations with mx_alignment 256 (vllm 0.33.0 fused_moe/oracle/mxfp4.py, the TRTLLM branch of
# the hidden rounding and of the quant config): 2880 values carry 3072 / 32 = 96 scale bytes.
GPT_OSS_MX_ALIGNMENT = 256


@dataclass(frozen=True)
class ModelShape:
    """One model's MoE shape.

    Attributes
    ----------
    name : str
        What ``--model`` takes.
    repo : str
        The Hugging Face repository whose ``config.json`` gives the numbers.
    hidden, experts, top_k : int
        ``hidden_size``, the routed experts (``n_routed_experts`` / ``num_experts`` /
        ``num_local_experts``) and ``num_experts_per_tok`` (``experts_per_token``).
    shared : int
        Shared experts (``n_shared_experts``; Llama 4's ``shared_expert``); the testbed models
        any number as one shared map.
    routed_scaling : float
        ``routed_scaling_factor`` (1.0 where the model has none).
    weight_on_input : bool
        The router weight multiplies the expert's input (Llama 4: top-1 sigmoid gate).
    moe_layers : int
        MoE layers of the base model (``num_hidden_layers`` less the dense ones).
    mtp_layers : int
        MoE next-token-prediction layers (``num_nextn_predict_layers``).
    formats : tuple[str, ...]
        The dispatch formats its deployments use, the native checkpoint's first.
    formats_source : str
        Where each format comes from (the checkpoints that carry it).
    mx_alignment : int
        What an mxfp8 dispatch pads its scale columns to (vLLM's ``mx_alignment``).
    checkpoint_arch : str or None
        The architecture of the tiny checkpoint ``a2a-testbed engine --model`` writes at this
        shape (:mod:`testbed.scenario.checkpoint`), so the engine's own MoE block of the family
        runs it; None where the testbed writes none for the family.
    """

    name: str
    repo: str
    hidden: int
    experts: int
    top_k: int
    shared: int
    routed_scaling: float
    weight_on_input: bool
    moe_layers: int
    mtp_layers: int
    formats: tuple[str, ...]
    formats_source: str
    mx_alignment: int = 0
    checkpoint_arch: str | None = None

    def fields(self, fmt: str | None = None) -> dict:
        """The :class:`testbed.scenario.model.Scenario` fields of this model's MoE layers
        dispatched in ``fmt`` (the model's first format by default): the mxfp8 padding only
        with mxfp8."""
        return {"experts": self.experts, "top_k": self.top_k, "hidden": self.hidden,
                "shared_experts": self.shared > 0, "routed_scaling": self.routed_scaling,
                "router_weight_on_input": self.weight_on_input,
                "mx_alignment": self.mx_alignment if (fmt or self.formats[0]) == "mxfp8" else 0}

    def stages(self, pp: int, fmt: str | None = None) -> str:
        """``--stages`` of a ``pp``-stage deployment: one ``fmt`` MoE layer per stage (the
        model's first format by default), the MTP layers on the last."""
        fmt = fmt or self.formats[0]
        stages = [f"{fmt}:{BASE_BUDGET}"] * pp
        stages[-1] += "".join(f",{fmt}:{MTP_BUDGET}" for _ in range(self.mtp_layers))
        return ";".join(stages)


MODELS: dict[str, ModelShape] = {m.name: m for m in (
    # config.json: hidden_size 7168, n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8,
    # routed_scaling_factor 2.5, num_hidden_layers 61, first_k_dense_replace 3, num_nextn_predict_layers 1;
    # quantization_config fp8 weight_block_size [128, 128]. NVFP4: nvidia/DeepSeek-V3-0324-FP4.
    ModelShape("deepseek-v3", "deepseek-ai/DeepSeek-V3", 7168, 256, 8, 1, 2.5, False, 58, 1,
               ("fp8_block", "nvfp4", "bf16"), "fp8_block: the checkpoint; nvfp4: nvidia/DeepSeek-V3-0324-FP4",
               checkpoint_arch="deepseek-v2"),
    # DeepSeek-R1 is DeepSeek-V3's architecture and config.json. NVFP4: nvidia/DeepSeek-R1-FP4.
    ModelShape("deepseek-r1", "deepseek-ai/DeepSeek-R1", 7168, 256, 8, 1, 2.5, False, 58, 1,
               ("fp8_block", "nvfp4", "bf16"), "fp8_block: the checkpoint; nvfp4: nvidia/DeepSeek-R1-FP4",
               checkpoint_arch="deepseek-v2"),
    # config.json: hidden_size 7168, n_routed_experts 384, n_shared_experts 1, num_experts_per_tok 8,
    # routed_scaling_factor 2.827, num_hidden_layers 61, first_k_dense_replace 1, num_nextn_predict_layers 0;
    # fp8 weight_block_size [128, 128].
    ModelShape("kimi-k2", "moonshotai/Kimi-K2-Instruct", 7168, 384, 8, 1, 2.827, False, 60, 0,
               ("fp8_block", "bf16"), "fp8_block: the checkpoint", checkpoint_arch="deepseek-v2"),
    # config.json: hidden_size 4096, num_experts 128, num_experts_per_tok 8, num_hidden_layers 94,
    # decoder_sparse_step 1, mlp_only_layers []. FP8: Qwen/Qwen3-235B-A22B-FP8 (weight_block_size
    # [128, 128]); NVFP4: nvidia/Qwen3-235B-A22B-FP4.
    ModelShape("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 4096, 128, 8, 0, 1.0, False, 94, 0,
               ("bf16", "fp8_block", "nvfp4"),
               "bf16: the checkpoint; fp8_block: Qwen/Qwen3-235B-A22B-FP8; nvfp4: nvidia/Qwen3-235B-A22B-FP4",
               checkpoint_arch="qwen3-moe"),
    # config.json: hidden_size 2048, num_experts 128, num_experts_per_tok 8, num_hidden_layers 48.
    # FP8: Qwen/Qwen3-30B-A3B-FP8 (weight_block_size [128, 128]); NVFP4: nvidia/Qwen3-30B-A3B-FP4.
    ModelShape("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 2048, 128, 8, 0, 1.0, False, 48, 0,
               ("bf16", "fp8_block", "nvfp4"),
               "bf16: the checkpoint; fp8_block: Qwen/Qwen3-30B-A3B-FP8; nvfp4: nvidia/Qwen3-30B-A3B-FP4",
               checkpoint_arch="qwen3-moe"),
    # config.json: hidden_size 2880, num_local_experts 128, experts_per_token 4, num_hidden_layers 36.
    # MXFP4 weights; the engines' FlashInfer TRT-LLM MoE takes them with bf16 or mxfp8 activations.
    ModelShape("gpt-oss-120b", "openai/gpt-oss-120b", 2880, 128, 4, 0, 1.0, False, 36, 0,
               ("mxfp8", "bf16"), "mxfp4 weights: the checkpoint; activations mxfp8 or bf16 (the engines' "
               "FlashInfer MXFP4 MoE backends)", GPT_OSS_MX_ALIGNMENT),
    # config.json: hidden_size 2880, num_local_experts 32, experts_per_token 4, num_hidden_layers 24.
    ModelShape("gpt-oss-20b", "openai/gpt-oss-20b", 2880, 32, 4, 0, 1.0, False, 24, 0,
               ("mxfp8", "bf16"), "as gpt-oss-120b", GPT_OSS_MX_ALIGNMENT),
    # config.json (text_config): hidden_size 5120, num_local_experts 128, num_experts_per_tok 1,
    # interleave_moe_layer_step 2 of num_hidden_layers 48, a shared expert per MoE layer; the top-1
    # sigmoid router weight scales the expert's input. NVFP4: nvidia/Llama-4-Maverick-17B-128E-Instruct-FP4.
    ModelShape("llama4-maverick", "meta-llama/Llama-4-Maverick-17B-128E-Instruct", 5120, 128, 1, 1, 1.0, True,
               24, 0, ("bf16", "nvfp4"), "bf16: the checkpoint; nvfp4: nvidia/Llama-4-Maverick-17B-128E-Instruct-FP4"),
    # config.json: hidden_size 5120, n_routed_experts 160, n_shared_experts 1, num_experts_per_tok 8,
    # routed_scaling_factor 2.5, num_hidden_layers 92, first_k_dense_replace 3, num_nextn_predict_layers 1.
    # FP8: zai-org/GLM-4.5-FP8 (its block size not read from its config here).
    ModelShape("glm-4.5", "zai-org/GLM-4.5", 5120, 160, 8, 1, 2.5, False, 89, 1,
               ("bf16", "fp8_block"), "bf16: the checkpoint; fp8_block: zai-org/GLM-4.5-FP8"),
)}


def model(name: str) -> ModelShape:
    """The preset ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"must be one of {', '.join(MODELS)}; got {name!r}") from None
