"""``impl`` on a rank: its factory's manager and prepare/finalize, its
:class:`impl.moe_layer.MoELayer`, and the testbed's own per-layer DP token-count exchange
standing in for the engine's forward context."""

from __future__ import annotations

import contextlib

import torch

from impl.factory import make_manager, make_prepare_finalize
from impl.formats import dispatch_layout
from impl.forward_context import forward_context
from impl.moe_layer import MoELayer, MoELayerConfig
from testbed.scenario.rank import logged_token_counts, quant_config, rank_device
from testbed.scenario.reference import ACT_DTYPE, LinearMap, shared_weight


class ImplSession:
    def __init__(self, ctx, sc, api, log):
        self.ctx, self.sc, self.log = ctx, sc, log
        self.device = rank_device(ctx, sc.flashinfer_backend)
        self.parallel = sc.parallel_config()
        self.ep_group = ctx.groups["ep"]
        self.manager = make_manager(self.parallel, api, self.ep_group, None if sc.a2a_api == "auto" else sc.a2a_api)

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts):
        sc, ctx = self.sc, self.ctx
        qc = quant_config(fmt, sc.mx_alignment)
        pf = make_prepare_finalize(self.parallel, self.manager, dp_group=ctx.groups["dp"], ep_group=self.ep_group,
                                   max_num_tokens=max_num_tokens, top_k=sc.top_k, num_experts=sc.experts,
                                   hidden_size=sc.hidden, layout=dispatch_layout(sc.hidden, qc, ACT_DTYPE),
                                   invalid_expert_id=sc.invalid_id())
        moe = MoELayer(MoELayerConfig(sc.experts, sc.top_k, sc.hidden, qc, ACT_DTYPE, sc.routed_scaling,
                                      sc.router_weight_on_input, sc.expert_output),
                       self.parallel, pf, experts, tp_group=ctx.groups["tp"])
        if sc.shared_experts:  # sharded like the routed experts where the TP all-reduce completes them
            tp = (ctx.coords.tp_rank, sc.layout.tp)
            moe.shared_experts = SharedExpert(shared_weight(sc.seed, ctx.coords.pp_rank, index, sc.hidden),
                                              tp if sc.parts_partial else (0, 1))
        return _ImplLayer(moe)

    def forward_pass(self, num_tokens: int):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def layer_call(self, num_tokens: int):
        counts = logged_token_counts(self.ctx, self.log, num_tokens, "testbed: the start of a forward")
        with forward_context(counts):
            yield


class SharedExpert:
    """The shared expert ``x @ W`` in bf16; over this TP rank's slice of the hidden
    (contraction) dimension when the layer's reduce is still pending."""

    def __init__(self, weight: LinearMap, shard: tuple[int, int]):
        part = weight.hidden // shard[1]
        self.weight, self.cols = weight, slice(shard[0] * part, (shard[0] + 1) * part)

    def __call__(self, x_TH: torch.Tensor) -> torch.Tensor:
        return self.weight(x_TH[:, self.cols], self.cols).to(ACT_DTYPE)


class _ImplLayer:
    def __init__(self, moe: MoELayer):
        self.moe = moe
        self.sequence_parallel = moe.sequence_parallel
        self.reduce_pending = moe.reduce_pending
        self.output_is_reduced = moe.prepare_finalize.output_is_reduced
        self.topk_indices_dtype = moe.prepare_finalize.topk_indices_dtype

    def __call__(self, x_TH, w_TK, ids_TK):
        return self.moe(x_TH, w_TK, ids_TK)


