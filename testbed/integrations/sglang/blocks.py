"""SGLang's own model MoE blocks on a rank: the MoE block a model family's decoder layer holds,
built by SGLang from a tiny config of the scenario's shape and called as that decoder layer
calls it.

Legend: T this DP rank's tokens, G the rows of every DP rank gathered, K top_k, H hidden.

SGLang's, per family (:data:`FAMILIES`): the block's construction (its ``FusedMoE``, the
FlashInfer dispatcher ``FusedMoE.__init__`` creates, its router's configuration, DeepSeek's
choice of shared-expert parallelism and of its forward path under an all-to-all, FusedMoE's
``reduce_results``), its whole forward (the idle DP rank's empty routing, the routed scaling,
the shared-expert add, FusedMoE's own reduce), SGLang's decision whether a sparse FFN's input
is the DP rank's own rows (``is_moe_input_scattered_across_dp_ranks``: where it says no, the
rows of every DP rank are gathered before the block and this rank's taken back after it, as
the layer boundary's DP gather and scatter do) and, for the families whose decoder layer ends
its FFN at a stage boundary, that boundary's sum: none where the FFN ran on the DP rank's own
rows (the boundary's output contract is then complete, ``layer_boundary/factories.py``
``_resolve_ffn``), else the sum the MoE output still owes (``sum_post_experts_output``; 0.5.21's
boundary all-reduces over ``post_experts_reduction_group()``).

Stand-ins, for the maths the all-to-all does not decide: the router's top-k (its gate runs; its
``TopK`` hands the scenario's routing, with the routed scaling in the weights where SGLang's
``TopK`` configuration folds it in), the experts (the testbed's, as ``FusedMoE``'s quant method)
and DeepSeek's shared expert (the scenario's linear map over the slice of the contraction
dimension SGLang's shared MLP holds on this rank). The attention, the norms and the residual
stream are not run: the block sees the scenario's rows as its input.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Callable

import torch

from testbed.integrations.sglang import shapes
from testbed.scenario.experts import SharedLinear
from testbed.scenario.reference import ACT_DTYPE, intermediate_size, shared_weight


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family's MoE block.

    Attributes
    ----------
    module, block : str
        ``sglang.srt.models.<module>`` and the block's class there.
    build : callable
        ``build(cls, sc, index, prefix) -> block``: the block as the family's decoder layer
        constructs it, for a scenario of the family's shape.
    call : callable
        ``call(block, x_TH, forward_batch) -> [T, H]``: the decoder layer's call.
    boundary : bool
        The decoder layer ends its FFN at a stage boundary, which sums the block's output where
        the FFN ran on gathered rows; False: the layer adds the block's output to its residual
        as it is.
    shared : bool
        The block has shared experts and a routed scaling factor.
    """

    module: str
    block: str
    build: Callable
    call: Callable
    boundary: bool
    shared: bool = False


def _config(**values):
    from transformers import PretrainedConfig

    return PretrainedConfig(**values)


def _qwen3(cls, sc, index, prefix):
    return cls(layer_id=index, prefix=prefix, config=_config(
        hidden_size=sc.hidden, num_experts=sc.experts, num_experts_per_tok=sc.top_k, norm_topk_prob=True,
        moe_intermediate_size=intermediate_size(sc)))


def _deepseek(cls, sc, index, prefix):
    # DeepSeek-V3's router (sigmoid scores, grouped top-k with a correction bias); its decoder
    # layer leaves the sum to the stage boundary (reduce_results=False, from 0.5.22 on; before,
    # the block takes no such argument).
    own = {"reduce_results": False} if "reduce_results" in inspect.signature(cls.__init__).parameters else {}
    return cls(layer_id=index, prefix=prefix, **own, config=_config(
        hidden_size=sc.hidden, n_routed_experts=sc.experts, num_experts_per_tok=sc.top_k,
        n_shared_experts=1 if sc.shared_experts else 0, routed_scaling_factor=sc.routed_scaling,
        moe_intermediate_size=intermediate_size(sc), hidden_act="silu", norm_topk_prob=True, n_group=1, topk_group=1,
        scoring_func="sigmoid", topk_method="noaux_tc", vocab_size=128))


def _gpt_oss(cls, sc, index, prefix):  # its own router (TinyGemmLinear) and swiglu experts with biases
    return cls(layer_id=index, prefix=prefix, config=_config(
        hidden_size=sc.hidden, num_local_experts=sc.experts, num_experts_per_tok=sc.top_k,
        intermediate_size=intermediate_size(sc), hidden_act="swigluoai", swiglu_limit=7.0, dtype=ACT_DTYPE))


def _explicit(cls, sc, index, prefix):  # OLMoE's and PhiMoE's blocks take the shape as arguments
    return cls(num_experts=sc.experts, top_k=sc.top_k, hidden_size=sc.hidden,
               intermediate_size=intermediate_size(sc), layer_id=index, prefix=prefix)


FAMILIES = {
    "qwen3_moe": Family("qwen3_moe", "Qwen3MoeSparseMoeBlock", _qwen3, lambda b, x, fb: b(x, fb), boundary=True),
    "deepseek_v2": Family("deepseek_v2", "DeepseekV2MoE", _deepseek, lambda b, x, fb: b(x, fb, None), boundary=True,
                          shared=True),
    "gpt_oss": Family("gpt_oss", "GptOssSparseMoeBlock", _gpt_oss, lambda b, x, fb: b(x, fb), boundary=True),
    "olmoe": Family("olmoe", "OlmoeMoE", _explicit, lambda b, x, fb: b(x), boundary=False),
    "phimoe": Family("phimoe", "PhiMoE", _explicit, lambda b, x, fb: b(x, forward_batch=fb), boundary=False),
}


class HandedRouter(torch.nn.Module):
    """The block's ``TopK`` with the scenario's routing in place of its top-k: each call hands
    the routing of the rows it is given (:attr:`pending`), the routed scaling folded into the
    weights where the block's own ``TopK`` configuration folds it; an empty batch gets the
    ``TopK``'s own empty output."""

    def __init__(self, topk):
        super().__init__()
        self.topk = topk
        self.pending = None  # (w_TK, ids_TK) of the rows the block routes next

    @property
    def scale(self) -> float:
        """The routed scaling factor the ``TopK``'s configuration folds into the weights (1.0: none)."""
        config = self.topk.topk_config
        folds = getattr(config, "apply_routed_scaling_factor_on_output", False) and config.routed_scaling_factor
        return float(config.routed_scaling_factor) if folds else 1.0

    @property
    def topk_config(self):
        return self.topk.topk_config

    def empty_topk_output(self, *args, **kwargs):
        return self.topk.empty_topk_output(*args, **kwargs)

    def forward(self, hidden_states, router_logits, **_):
        from sglang.srt.layers.moe.topk import StandardTopKOutput

        w_TK, ids_TK = self.pending
        if hidden_states.size(0) != ids_TK.size(0):
            raise RuntimeError(f"SGLang's MoE block routed {hidden_states.size(0)} rows; the rows handed to it are "
                               f"{ids_TK.size(0)}")
        if self.scale != 1.0:
            w_TK = w_TK * self.scale
        return StandardTopKOutput(topk_weights=w_TK, topk_ids=ids_TK, router_logits=router_logits)


class SharedExpert(SharedLinear):
    """DeepSeek's shared MLP as the scenario's linear map, over the contraction slice SGLang's
    MLP holds on this rank (whole where SGLang replicates it)."""

    def __init__(self, mlp, weight):
        down = mlp.down_proj  # row parallel: its input is the slice of the contraction this rank holds
        if hasattr(down, "tp_group"):
            from sglang.srt.distributed.utils import get_group_rank_size

            rank = get_group_rank_size(down.tp_group)[0]
        else:
            rank = down.tp_rank
        super().__init__(weight, (rank, down.input_size // down.input_size_per_partition))

    def forward(self, x_tH, *_, **__):
        return super().forward(x_tH)


class BlockLayer:
    """A scenario MoE layer as the family's decoder layer runs its MoE block: the rows of this
    DP rank (or, where SGLang gathers the sparse FFN's input, of every DP rank), the block's
    forward, the boundary's sum where the family has one."""

    sequence_parallel = False
    reduce_pending = False

    def __init__(self, session, family: Family, index: int, method, experts):
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
        from sglang.srt.model_loader.utils import set_default_torch_dtype

        self.session, self.family, sc = session, family, session.sc
        cls = getattr(importlib.import_module(f"sglang.srt.models.{family.module}"), family.block)
        default = torch.get_default_dtype()
        try:
            with set_default_torch_dtype(ACT_DTYPE):  # as SGLang's model loader builds a checkpoint's model
                self.block = family.build(cls, sc, index, f"model.layers.{index}.mlp")
        finally:  # an older SGLang's context manager restores it only when the build returns
            torch.set_default_dtype(default)
        fused = self.block.experts
        if not isinstance(fused, FusedMoE) or fused.dispatcher.__class__.__name__ != "FlashinferDispatcher":
            raise RuntimeError(f"SGLang's {family.block} built {type(fused).__name__} with "
                               f"{type(getattr(fused, 'dispatcher', None)).__name__}, not FusedMoE with the "
                               "FlashinferDispatcher its server arguments ask for")
        fused.quant_method = method(experts)
        self.router = HandedRouter(self.block.topk)
        self.block.topk = self.router
        shared = getattr(self.block, "shared_experts", None)
        if shared is not None:
            self.block.shared_experts = SharedExpert(shared, shared_weight(sc.seed, session.ctx.coords.pp_rank, index,
                                                                           sc.hidden))

    def output_is_reduced(self) -> bool:
        return shapes.output_is_complete()

    def topk_indices_dtype(self):
        return None

    @property
    def weights_scale(self) -> float:
        return self.router.scale

    def __call__(self, x_TH, w_TK, ids_TK):
        from sglang.srt.layers.moe import utils

        T = x_TH.size(0)
        own = shapes.moe_input_is_own_rows()
        x, w, ids = (x_TH, w_TK, ids_TK) if own else self.session.gather_dp_rows(x_TH, w_TK, ids_TK)
        self.router.pending = (w, ids)
        try:
            out = self.family.call(self.block, x, self.session.forward_batch())
        finally:
            self.router.pending = None
        if own:
            return out
        if self.family.boundary:
            out = _boundary_sum(utils, out)
        return out[self.session.dp_row_start():][:T]


def _boundary_sum(utils, out_GH):
    """The stage boundary's sum of a sparse FFN's output computed on gathered rows, as the
    release's boundary makes it (0.5.22 on: ``sum_post_experts_output``; 0.5.21: an all-reduce
    over the MoE output's group)."""
    if hasattr(utils, "sum_post_experts_output"):
        return utils.sum_post_experts_output(out_GH)
    return utils.post_experts_reduction_group().all_reduce(out_GH)
