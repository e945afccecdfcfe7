"""The rank program of a scenario: build the integration's layers, run the forward passes,
and record what ``impl`` did.

Legend: T tokens of this DP rank, K top_k, H hidden, N rows this EP rank received.
The record is an event log (:mod:`testbed.scenario.audit`) the parent reads even after a
hang or a crash, plus the returned outputs and the lanes the experts computed. The fake's
``MoeAlltoAll`` is subclassed here to log each construction (its token budget and workspace
size) and whether each combine got ``output=``; the combine signature the probe sees is the
scenario's.
"""

from __future__ import annotations

import functools
import itertools
from typing import Optional

import torch.distributed as dist

from impl.backend import resolve_backend
from impl.formats import dispatch_layout
from impl.forward_context import forward_context
from impl.moe_layer import moe_forward
from impl.one_sided import OneSidedManager, OneSidedPrepareFinalize
from impl.two_sided import TwoSidedManager, TwoSidedPrepareFinalize
from testbed.scenario import audit, mutants
from testbed.scenario.experts import Experts
from testbed.scenario.model import Scenario
from testbed.scenario.moe import forward_pass_token_counts, quant_config
from testbed.scenario.reference import (
    ACT_DTYPE,
    expert_weight,
    layer_inputs,
    local_experts,
)


def _recording_moe_alltoall(base: type, log: audit.EventLog, ep_ranks: tuple[int, ...]) -> type:
    """``base`` logging its constructions and, as collectives of the EP group (which they
    are: every rank waits for every peer's flags), its dispatches and combines."""
    builds = itertools.count(1)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._testbed_build = next(builds)
        log.write(ev="build", index=self._testbed_build, max_num_tokens=self.max_num_tokens,
                  workspace_size=self.workspace_size_per_rank, top_k=self.top_k, num_experts=self.num_experts)

    def _dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank, *args, **kwargs):
        log.write(ev="coll", op="moe_a2a_dispatch", group=list(ep_ranks), site=audit.impl_call_site())
        log.write(ev="dispatch", rtm=runtime_max_tokens_per_rank, tokens=token_selected_experts.size(0))
        return base._dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                              *args, **kwargs)

    def _combine(self, payload, runtime_max_tokens_per_rank, *args, **kwargs):
        output = kwargs.get("output", args[3] if len(args) > 3 else None)
        log.write(ev="combine", build=self._testbed_build, output=output is not None,
                  rtm=runtime_max_tokens_per_rank)
        log.write(ev="coll", op="moe_a2a_combine", group=list(ep_ranks), site=audit.impl_call_site())
        return base._combine(self, payload, runtime_max_tokens_per_rank, *args, **kwargs)

    return type("MoeAlltoAll", (base,), {"__init__": __init__, "_dispatch": _dispatch, "_combine": _combine})


# The combine signatures no release has (model.COMBINE_SIGNATURES), over the release's data path.
def _combine_kw_only(self, payload, runtime_max_tokens_per_rank, *, output=None):
    return self._combine(payload, runtime_max_tokens_per_rank, output=output)


def _combine_kwargs_only(self, payload, runtime_max_tokens_per_rank, **kwargs):
    return self._combine(payload, runtime_max_tokens_per_rank, **kwargs)


def _combine_positional_only(self, output=None, /, payload=None, runtime_max_tokens_per_rank=None):
    return self._combine(payload, runtime_max_tokens_per_rank, output=output)


def _combine_opaque(self, payload, runtime_max_tokens_per_rank, output=None):
    return self._combine(payload, runtime_max_tokens_per_rank, output=output)


_combine_opaque.__signature__ = "not a Signature"  # inspect.signature raises, as for a C function
CUSTOM_COMBINES = {"kw-only": _combine_kw_only, "kwargs-only": _combine_kwargs_only,
                   "positional-only": _combine_positional_only, "opaque": _combine_opaque}


def _recording_mnnvl_moe(base: type, log: audit.EventLog, ep_ranks: tuple[int, ...]) -> type:
    """``MnnvlMoe`` logging its exchanges as collectives of the EP group."""
    def logged(name):
        fn = getattr(base, name)

        def call(*args, **kwargs):
            log.write(ev="coll", op=name, group=list(ep_ranks), site=audit.impl_call_site())
            return fn(*args, **kwargs)

        return staticmethod(call)

    names = ("mnnvl_moe_alltoallv_prepare_without_allgather", "mnnvl_moe_alltoallv", "mnnvl_moe_alltoallv_combine")
    return type("MnnvlMoe", (base,), {name: logged(name) for name in names})


def _install_fake(ctx, sc: Scenario, log: audit.EventLog):
    from fakes.flashinfer import profiles
    from fakes.flashinfer.comm import moe_a2a_kernels
    from fakes.flashinfer.comm import trtllm_alltoall as two_sided_mod
    from fakes.flashinfer.comm import trtllm_moe_alltoall as fake_mod

    profile_before, slot_before = profiles.active().name, (moe_a2a_kernels.SlotOrder.mode,
                                                           moe_a2a_kernels.SlotOrder.seed)
    api = resolve_backend("fake", profile=sc.profile)
    moe_a2a_kernels.SlotOrder.mode = sc.slot_order
    moe_a2a_kernels.SlotOrder.seed = sc.seed
    base = fake_mod.MoeAlltoAll if sc.combine_signature == "release" else \
        fake_mod.custom_moe_alltoall(CUSTOM_COMBINES[sc.combine_signature])
    fake_mod.MoeAlltoAll = _recording_moe_alltoall(base, log, ctx.group_ranks["ep"])
    mnnvl_moe = two_sided_mod.MnnvlMoe
    two_sided_mod.MnnvlMoe = _recording_mnnvl_moe(mnnvl_moe, log, ctx.group_ranks["ep"])

    def restore():
        del fake_mod.MoeAlltoAll  # back to the module's per-profile lookup
        two_sided_mod.MnnvlMoe = mnnvl_moe
        moe_a2a_kernels.SlotOrder.mode, moe_a2a_kernels.SlotOrder.seed = slot_before
        profiles.set_profile(profile_before)

    ctx.add_cleanup(restore)
    return api


def run_scenario(ctx, sc: Scenario, log_dir: str, mutant: Optional[str] = None) -> dict:
    """Rank program: this rank's stage's layers on one manager, then every forward pass.

    Returns ``{"outputs": {(pass, layer): [T, H] bf16}, "lanes": {(pass, layer): Counter}}``;
    everything else is in the event log ``{log_dir}/rank{r}.jsonl``.
    """
    log = audit.EventLog(f"{log_dir}/rank{ctx.rank}.jsonl")
    ctx.add_cleanup(log.close)
    if mutant:
        ctx.add_cleanup(mutants.apply(mutant))
    ctx.add_cleanup(audit.install(log, ctx.world_size))
    api = _install_fake(ctx, sc, log)
    stage, ep_group = ctx.coords.pp_rank, ctx.groups["ep"]
    ep_rank, dp_rank = dist.get_rank(ep_group), ctx.coords.dp_rank
    layers = sc.stages[stage]
    if sc.path == "one_sided":
        manager = OneSidedManager(api, ep_group)
        pfs = []
        for i, layer in enumerate(layers):
            pfs.append(OneSidedPrepareFinalize(
                manager, max_num_tokens=layer.max_num_tokens, top_k=sc.top_k, num_experts=sc.experts,
                hidden_size=sc.hidden, layout=dispatch_layout(sc.hidden, quant_config(layer.fmt), ACT_DTYPE)))
            log.write(ev="layer", layer=i)
    else:
        manager = TwoSidedManager(api, ep_group)
        pfs = [TwoSidedPrepareFinalize(manager) for _ in layers]
    outputs, lanes = {}, {}
    for p in range(len(sc.passes)):
        for i, (layer, pf) in enumerate(zip(layers, pfs)):
            x_TH, ids_TK, w_TK = layer_inputs(sc, p, stage, i, dp_rank)
            experts = Experts(layer.fmt, sc.hidden, local_experts(sc.experts, sc.ep_size, ep_rank),
                              functools.partial(expert_weight, sc.seed, stage, i, hidden=sc.hidden),
                              weighted=not sc.router_weight_on_input)
            # The testbed's own collective is logged too: a rank that skipped an all-to-all
            # is then out of step with its peers at once, not at the timeout.
            log.write(ev="coll", op="forward_token_counts", group=list(ctx.group_ranks["ep"]),
                      site="testbed: the start of a forward")
            counts = forward_pass_token_counts(ep_group, dp_rank, x_TH.size(0))
            log.write(ev="forward", pass_=p, layer=i, reduced=bool(pf.output_is_reduced()))
            with forward_context(counts):
                out = moe_forward(pf, x_TH, w_TK, ids_TK, experts, quant_config(layer.fmt),
                                  num_experts=sc.experts, tp_group=ctx.groups["tp"],
                                  apply_router_weight_on_input=sc.router_weight_on_input)
            log.write(ev="forward_end", pass_=p, layer=i)
            outputs[(p, i)] = out
            lanes[(p, i)] = experts.lanes
    return {"outputs": outputs, "lanes": lanes}
