"""Tiny MoE checkpoints the testbed writes itself (a ``config.json`` and random weights as
``model.safetensors``; no hub, no download) for vLLM's engine to load, and where it is served,
a tokenizer of the vocabulary's ids as words (:func:`write_tokenizer`).

Two architectures, the MoE blocks NVLink all-to-all deployments run:

- ``qwen3-moe``: ``Qwen3MoeForCausalLM`` (Qwen3-30B-A3B's block: softmax top-k, renormalized,
  no shared experts);
- ``deepseek-v2``: ``DeepseekV2ForCausalLM`` with DeepSeek's MoE block (grouped top-k over
  expert groups, ``routed_scaling_factor``, a shared expert), multi-head attention (no
  latent projection: vLLM's MLA needs CPU kernels this testbed does not stand in for).

Every weight is drawn from one seeded generator, so every rank writes (or reads) the same
checkpoint; a DP 1 run of it is the reference of an expert-parallel run.

:func:`at_model_shape` gives a real model's MoE shape (hidden, experts, top_k, its shared expert
and scaling through the family's block) on one layer with 128-wide heads, a small vocabulary and
a small expert intermediate size: what the all-to-all moves is the model's, the rest is as small
as the engine takes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

ARCHITECTURES = ("qwen3-moe", "deepseek-v2")


@dataclass(frozen=True)
class Checkpoint:
    """The shape of a tiny checkpoint: ``arch`` one of :data:`ARCHITECTURES`."""

    arch: str = "qwen3-moe"
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    experts: int = 8
    top_k: int = 2
    moe_intermediate: int = 256
    vocab: int = 512
    seed: int = 0
    routed_scaling_factor: float | None = None  # deepseek-v2: the family's 2.5 unless a model gives its own

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden {self.hidden} must divide by heads {self.heads}, heads by kv_heads "
                             f"{self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def shared_experts(self) -> int:
        return 1 if self.arch == "deepseek-v2" else 0

    @property
    def routed_scaling(self) -> float:
        if self.arch != "deepseek-v2":
            return 1.0
        return 2.5 if self.routed_scaling_factor is None else self.routed_scaling_factor


HEAD_DIM = 128  # a real model's attention head width
MODEL_SHAPE_INTERMEDIATE = 64  # the experts' width at a model's shape (the all-to-all never sees it)


def at_model_shape(shape, seed: int = 0) -> Checkpoint:
    """One MoE layer of ``shape`` (a :class:`testbed.scenario.models.ModelShape` whose family
    has a ``checkpoint_arch``): its hidden, routed experts, top_k and scaling, 128-wide heads."""
    heads = shape.hidden // HEAD_DIM
    return Checkpoint(arch=shape.checkpoint_arch, layers=1, hidden=shape.hidden, heads=heads,
                      kv_heads=4 if heads % 4 == 0 else 1, experts=shape.experts, top_k=shape.top_k,
                      moe_intermediate=MODEL_SHAPE_INTERMEDIATE, seed=seed,
                      routed_scaling_factor=shape.routed_scaling if shape.checkpoint_arch == "deepseek-v2" else None)


def config(ck: Checkpoint) -> dict:
    """The model's ``config.json``."""
    common = {"hidden_size": ck.hidden, "num_hidden_layers": ck.layers, "num_attention_heads": ck.heads,
              "num_key_value_heads": ck.kv_heads, "vocab_size": ck.vocab, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
              "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "num_experts_per_tok": ck.top_k,
              "moe_intermediate_size": ck.moe_intermediate, "intermediate_size": 2 * ck.moe_intermediate}
    if ck.arch == "qwen3-moe":
        return common | {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "head_dim": ck.head_dim,
                         "num_experts": ck.experts, "norm_topk_prob": True, "decoder_sparse_step": 1,
                         "mlp_only_layers": [], "attention_bias": False}
    return common | {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                     "n_routed_experts": ck.experts, "n_shared_experts": ck.shared_experts,
                     "routed_scaling_factor": ck.routed_scaling,
                     "n_group": 2, "topk_group": 1, "topk_method": "group_limited_greedy", "scoring_func": "softmax",
                     "norm_topk_prob": False, "first_k_dense_replace": 0, "moe_layer_freq": 1,
                     "kv_lora_rank": 0, "q_lora_rank": None, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0,
                     "v_head_dim": 0, "attention_bias": False}


def shapes(ck: Checkpoint) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, by its Hugging Face name."""
    H, D, I = ck.hidden, ck.head_dim, ck.moe_intermediate
    kv = ck.kv_heads if ck.arch == "qwen3-moe" else ck.heads
    out = {"model.embed_tokens.weight": (ck.vocab, H), "model.norm.weight": (H,), "lm_head.weight": (ck.vocab, H)}
    for layer in range(ck.layers):
        p = f"model.layers.{layer}"
        out |= {f"{p}.input_layernorm.weight": (H,), f"{p}.post_attention_layernorm.weight": (H,),
                f"{p}.self_attn.q_proj.weight": (ck.heads * D, H), f"{p}.self_attn.k_proj.weight": (kv * D, H),
                f"{p}.self_attn.v_proj.weight": (kv * D, H), f"{p}.self_attn.o_proj.weight": (H, ck.heads * D),
                f"{p}.mlp.gate.weight": (ck.experts, H)}
        if ck.arch == "qwen3-moe":
            out |= {f"{p}.self_attn.q_norm.weight": (D,), f"{p}.self_attn.k_norm.weight": (D,)}
        experts = [f"{p}.mlp.experts.{e}" for e in range(ck.experts)]
        if ck.shared_experts:
            experts.append(f"{p}.mlp.shared_experts")
        for e in experts:
            out |= {f"{e}.gate_proj.weight": (I, H), f"{e}.up_proj.weight": (I, H), f"{e}.down_proj.weight": (H, I)}
    return out


def weights(ck: Checkpoint) -> dict[str, torch.Tensor]:
    """Random bf16 weights, norms at 1: a matrix's entries ~ N(0, 1 / fan_in), so activations
    keep their size through the layers and every expert moves the logits."""
    g = torch.Generator().manual_seed(ck.seed)
    out = {}
    for name, shape in shapes(ck).items():
        if name.endswith("norm.weight"):
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            scale = 1.0 if name.startswith("model.embed_tokens") else shape[-1] ** -0.5
            out[name] = (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)
    return out


def write(ck: Checkpoint, directory: str) -> str:
    """Write ``ck`` into ``directory`` (created); returns it."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config(ck), f, indent=1)
    save_file(weights(ck), os.path.join(directory, "model.safetensors"))
    return directory


def token_word(i: int) -> str:
    """Token ``i``'s text in :func:`write_tokenizer`'s vocabulary."""
    return f"t{i}"


def write_tokenizer(ck: Checkpoint, directory: str) -> None:
    """A tokenizer for ``ck`` in ``directory``, which a server loads as Hugging Face's fast
    tokenizer: one word per id (``t0`` .. ``t{vocab-1}``, :func:`token_word`), split on
    whitespace, so a client reads each generated id back from the text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(vocab={token_word(i): i for i in range(ck.vocab)}, unk_token=token_word(0)))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": token_word(0), "bos_token": token_word(1),
                   "eos_token": token_word(2), "model_max_length": 4096}, f, indent=1)
