"""Rank programs for the ``impl`` tests (module level, so the rank processes can import them)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import impl
from testbed.scenario.rank import resolve_backend
from impl.communicator import make_communicator
from impl.formats import dispatch_layout
from impl.forward_context import forward_context
from impl.one_sided import OneSidedManager, OneSidedPrepareFinalize
from testbed.integrations.impl.cases import (
    ACT_DTYPE,
    MoECase,
    case_experts,
    case_layer,
    forward_layer,
    rank_inputs,
    run_layers,
)
from testbed.harness import mutants


def _layer(mgr, case: MoECase, cls=OneSidedPrepareFinalize):
    return cls(mgr, max_num_tokens=case.max_tokens, top_k=case.top_k, num_experts=case.num_experts,
               hidden_size=case.hidden, layout=dispatch_layout(case.hidden, case.quant_config(), ACT_DTYPE))


def _one_layer(ctx, case: MoECase, profile: str = "0.7.2", mutant: str | None = None):
    """``(manager, prepare/finalize)`` of one layer on this rank's EP group (optionally
    against a mutant of impl)."""
    if mutant:
        ctx.add_cleanup(mutants.apply(mutant))
    mgr = OneSidedManager(resolve_backend("fake", profile=profile), ctx.groups["ep"])
    return mgr, _layer(mgr, case)


def _prepared(ctx, pf, case: MoECase):
    """``(prepare's result, x, ids, weights)`` of this rank's DP tokens."""
    x_TH, ids_TK, w_TK = rank_inputs(case, ctx.coords.dp_rank)
    with forward_context(case.tokens_per_dp):
        return pf.prepare(x_TH, w_TK, ids_TK, case.num_experts, None, False, case.quant_config()), x_TH, ids_TK, w_TK


class ImplOps(TorchDispatchMode):
    """Records the non-view aten ops that code under ``impl/`` issues itself (not FlashInfer,
    not torch internals): a temporary or an extra copy made by the integration shows here."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and _caller_file().startswith(IMPL_DIR):
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


IMPL_DIR = os.path.dirname(impl.__file__) + os.sep
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _caller_file() -> str:
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


def finalize_ops(ctx, case: MoECase, profile: str) -> dict:
    """One forward whose finalize runs under :class:`ImplOps`."""
    mgr, pf = _one_layer(ctx, case, profile)
    prep, x_TH, ids_TK, w_TK = _prepared(ctx, pf, case)
    ep = ctx.groups["ep"]
    fused = case_experts(case, dist.get_world_size(ep), dist.get_rank(ep))(prep)
    output = torch.empty(x_TH.shape, dtype=ACT_DTYPE)
    storage = output.untyped_storage().data_ptr()
    with ImplOps() as recorder:
        pf.finalize(output, fused, w_TK, ids_TK, False, None)
    return {"ops": recorder.ops, "probe": mgr.combine_supports_output,
            "same_storage": output.untyped_storage().data_ptr() == storage, "out": output}


def _kwargs_only_combine(self, payload, runtime_max_tokens_per_rank, **kwargs):
    return self._combine(payload, runtime_max_tokens_per_rank, **kwargs)


def _uninspectable_combine(self, payload, runtime_max_tokens_per_rank, output=None):
    return self._combine(payload, runtime_max_tokens_per_rank, output=output)


_uninspectable_combine.__signature__ = "not a Signature"  # inspect.signature raises TypeError


def custom_combine(ctx, case: MoECase, variant: str) -> dict:
    """A FlashInfer whose ``combine`` takes ``**kwargs`` only, or has no inspectable signature:
    the probe must say no (the second through its TypeError), and the numbers must not change."""
    from fakes.flashinfer.comm import trtllm_moe_alltoall as fake_mod

    api = resolve_backend("fake", profile="0.7.2")
    combine = {"kwargs_only": _kwargs_only_combine, "uninspectable": _uninspectable_combine}[variant]
    fake_mod.MoeAlltoAll = fake_mod.custom_moe_alltoall(combine)
    ctx.add_cleanup(lambda: delattr(fake_mod, "MoeAlltoAll"))
    mgr = OneSidedManager(api, ctx.groups["ep"])
    pf = _layer(mgr, case)
    return {"probe": mgr.combine_supports_output, "out": forward_layer(ctx, pf, case)}


def heterogeneous(ctx, what: str) -> None:
    """Layers that disagree on top_k or num_experts on one manager."""
    mgr = OneSidedManager(resolve_backend("fake", profile="0.7.2"), ctx.groups["ep"])
    R = ctx.layout.ep_size
    _layer(mgr, MoECase(num_experts=4 * R, top_k=2, hidden=64, tokens_per_dp=(2,) * R))
    other = dict(top_k=4) if what == "top_k" else dict(num_experts=8 * R)
    _layer(mgr, MoECase(**{**dict(num_experts=4 * R, top_k=2, hidden=64, tokens_per_dp=(2,) * R), **other}))


def bad_initialize(ctx, kwargs: dict) -> None:
    mgr = OneSidedManager(resolve_backend("fake", profile="0.7.2"), ctx.groups["ep"])
    mgr.initialize(**kwargs)


def checkpoint_cycle(ctx, case: MoECase, profile: str) -> dict:
    """checkpoint_prepare, a dispatch while unmapped, checkpoint_restore, a forward."""
    mgr, pf = _one_layer(ctx, case, profile)
    before = forward_layer(ctx, pf, case)
    mgr.checkpoint_prepare()
    try:
        forward_layer(ctx, pf, case)
        unmapped_error = None
    except RuntimeError as e:
        unmapped_error = str(e)
    mgr.checkpoint_restore()
    return {"before": before, "unmapped_error": unmapped_error, "after": forward_layer(ctx, pf, case)}


def split_colors(ctx) -> None:
    """A Split whose colors differ across the group (a mapping wider than the EP group)."""
    comm = make_communicator(resolve_backend("fake"), ctx.groups["ep"])
    comm.Split(color=ctx.coords.ep_rank % 2, key=0)


def wrong_layout(ctx, case: MoECase, layout_fmt: str) -> None:
    """A layer whose workspace layout was computed for another format than it quantizes to."""
    mgr = OneSidedManager(resolve_backend("fake", profile="0.7.2"), ctx.groups["ep"])
    other = MoECase(case.num_experts, case.top_k, case.hidden, case.tokens_per_dp, fmt=layout_fmt)
    pf = OneSidedPrepareFinalize(mgr, max_num_tokens=case.max_tokens, top_k=case.top_k,
                                 num_experts=case.num_experts, hidden_size=case.hidden,
                                 layout=dispatch_layout(case.hidden, other.quant_config(), ACT_DTYPE))
    forward_layer(ctx, pf, case)


def back_to_back_rounds(ctx, layers: tuple[MoECase, ...]) -> list[torch.Tensor]:
    """Two layers' forwards with nothing between the rounds, EP rank 1 slow in its first
    combine: it reads its results only after rank 0 has written the next dispatch."""
    from fakes.flashinfer.comm import moe_a2a_kernels as k

    k.SlotOrder.mode = "deterministic"
    ctx.add_cleanup(lambda: setattr(k.SlotOrder, "mode", "shuffled"))
    mgr = OneSidedManager(resolve_backend("fake", profile="0.7.2"), ctx.groups["ep"])
    pfs = [_layer(mgr, case) for case in layers]
    if ctx.coords.ep_rank == 1:
        k.Hooks.before_combine_read = k.stall_until_next_dispatch(peer=0)
        ctx.add_cleanup(lambda: setattr(k.Hooks, "before_combine_read", None))
    outs = []
    for case, pf in zip(layers, pfs):
        x_TH, ids_TK, w_TK = rank_inputs(case, ctx.coords.dp_rank)
        with forward_context(case.tokens_per_dp):
            outs.append(case_layer(ctx, pf, case)(x_TH, w_TK, ids_TK))
    return outs


def short_expert_output(ctx, case: MoECase) -> None:
    """Experts that return fewer rows than prepare handed them."""
    _, pf = _one_layer(ctx, case)
    prep, x_TH, ids_TK, w_TK = _prepared(ctx, pf, case)
    pf.finalize(torch.empty_like(x_TH), torch.zeros(prep.a1q.size(0) - 1, case.hidden, dtype=ACT_DTYPE),
                w_TK, ids_TK, False, None)


def bad_prepare(ctx, case: MoECase, what: str) -> None:
    """prepare with one input that breaks the layer's contract."""
    _, pf = _one_layer(ctx, case)
    x_TH, ids_TK, w_TK = rank_inputs(case, ctx.coords.dp_rank)
    args = {"x": x_TH, "w": w_TK, "ids": ids_TK, "E": case.num_experts, "on_input": False}
    args.update({
        "weights_bf16": {"w": w_TK.bfloat16()},
        "ids_int64": {"ids": ids_TK.long()},
        "hidden": {"x": x_TH[:, :-16].contiguous()},
        "num_experts": {"E": case.num_experts * 2},
        "router_weight_top_k_2": {"on_input": True},
    }[what])
    with forward_context(case.tokens_per_dp):
        pf.prepare(args["x"], args["w"], args["ids"], args["E"], None, args["on_input"], case.quant_config())


def wrong_workspace_output(ctx, case: MoECase, how: str) -> None:
    """The experts are handed the combine region but return something else."""
    _, pf = _one_layer(ctx, case)
    prep, x_TH, ids_TK, w_TK = _prepared(ctx, pf, case)
    buf_NH = pf.expert_output_buffer(ACT_DTYPE)
    out = {"copy": buf_NH.clone(), "dtype": buf_NH.half(), "shape": buf_NH[:, :128],
           "strided": buf_NH.t().contiguous().t(), "region": buf_NH}[how]
    pf.finalize(torch.empty_like(x_TH), out, w_TK, ids_TK, False, None)


def late_initialize(ctx, case: MoECase, profile: str, mutant: str | None, signals: str) -> None:
    """EP rank 1 zeroes its workspace row late (:mod:`testbed.harness.late_zeroing`), then one
    round with known counts and no collective before it (which would order the ranks by
    itself). ``signals`` is a directory both ranks see."""
    from testbed.harness import late_zeroing

    ctx.add_cleanup(late_zeroing.install(ctx, tuple(range(ctx.world_size)), signals, flag_timeout_s=2.0))
    _, pf = _one_layer(ctx, case, profile, mutant)
    prep, x_TH, ids_TK, w_TK = _prepared(ctx, pf, case)
    ep = ctx.groups["ep"]
    fused = case_experts(case, dist.get_world_size(ep), dist.get_rank(ep))(prep)
    pf.finalize(torch.empty_like(x_TH), fused, w_TK, ids_TK, False, None)


def moe_ep_layers_then_cleanup(ctx, cases: tuple[MoECase, ...], profile: str, kind: str):
    """``moe_ep`` layers of ``cases`` (one manager), a forward of each, then the manager's
    cleanup: returns the builds, the outputs, and what a dispatch after the cleanup raises."""
    from impl.moe_ep import MoeEpManager, MoeEpPrepareFinalize

    mgr = MoeEpManager(resolve_backend("fake", profile=profile), ctx.groups["ep"], kind)
    pfs = [MoeEpPrepareFinalize(mgr, max_num_tokens=c.max_tokens, top_k=c.top_k, num_experts=c.num_experts,
                                hidden_size=c.hidden, layout=dispatch_layout(c.hidden, c.quant_config(), ACT_DTYPE),
                                invalid_expert_id=-1 if kind == "one_sided" else c.num_experts) for c in cases]
    builds = mgr.builds
    outputs = [forward_layer(ctx, pf, case) for case, pf in zip(cases, pfs)]
    mgr.cleanup()
    x_TH, ids_TK, w_TK = rank_inputs(cases[0], ctx.coords.dp_rank)
    try:
        with forward_context(cases[0].tokens_per_dp):
            pfs[0].prepare(x_TH, w_TK, ids_TK, cases[0].num_experts, None, False, cases[0].quant_config())
        after = None
    except RuntimeError as e:
        after = str(e)
    return builds, outputs, mgr.communications, after


def run_layers_mutated(ctx, mutant: str, *args, **kwargs):
    """:func:`run_layers` against ``mutant`` of impl, in this rank until the scenario ends."""
    ctx.add_cleanup(mutants.apply(mutant))
    return run_layers(ctx, *args, **kwargs)
