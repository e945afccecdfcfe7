"""The rank program of a scenario: build the integration's layers, run the forward passes,
and record what the integration did.

Legend: T tokens of this DP rank, K top_k, H hidden, N rows this EP rank received.
The record is an event log (:mod:`testbed.scenario.events`, with the collective audit of
:mod:`testbed.harness.audit`) the parent reads even after a hang or a crash, plus the returned
outputs and the lanes the experts computed. What is recorded of FlashInfer and of the
experts, and how, is :mod:`testbed.harness.recorders`; the combine signature the probe sees is
the scenario's.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from typing import Optional

import torch
import torch.distributed as dist

from fakes.flashinfer.comm import trtllm_moe_alltoall as fake_mod
from impl.experts import QuantizedWeights, TrtLlmExperts
from testbed import integrations, patch
from testbed.harness import audit, late_zeroing, mutants
from testbed.harness.recorders.alltoall import CUSTOM_COMBINES, recording_moe_alltoall, recording_public_moe_alltoall
from testbed.harness.recorders.arguments import recording_arguments
from testbed.harness.recorders.experts import RecordingExperts
from testbed.harness.recorders.mnnvl import recording_mnnvl_moe, recording_mnnvl_setup
from testbed.harness.recorders.moe_ep import recording_communication
from testbed.harness.recorders.shared_memory import record_posix_shm
from testbed.scenario.events import EventLog, ForwardEnd, ForwardStart, LayerBuilt
from testbed.scenario.experts import Experts
from testbed.scenario.model import Scenario
from testbed.scenario.rank import quant_config, rank_api, rank_device
from testbed.scenario.reference import (
    expert_weight,
    intermediate_size,
    layer_inputs,
    local_experts,
    swiglu_weights,
)


def _install(ctx, sc: Scenario, log: EventLog):
    """The scenario's FlashInfer (the fake as its release, or this machine's real one) with the
    API the scenario runs on recorded until it ends. Only that API: 0.7.2's moe_ep builds the
    ``MoeAlltoAll`` its module names, which would be recorded twice."""
    if sc.flashinfer_backend == "fake":
        api = rank_api(ctx, "fake", sc.profile, sc.slot_order)  # ctx.seed is the scenario's
    else:
        from fakes.flashinfer.profiles import serving

        api = rank_api(ctx, sc.flashinfer_backend)
        if serving(api.version) != serving(sc.profile):
            raise RuntimeError(f"--profile {sc.profile}: this machine's FlashInfer is {api.version} (profile "
                               f"{serving(api.version)}); the invariants hold the scenario's release to its facts")
    ep_ranks = ctx.group_ranks["ep"]

    def record(module, name: str, recording) -> None:
        ctx.add_cleanup(patch.attribute(module, name, recording))

    if sc.api == "comm" and api.has("comm"):
        if sc.flashinfer_backend != "fake":
            record(api.moe_alltoall, "MoeAlltoAll",
                   recording_public_moe_alltoall(api.moe_alltoall.MoeAlltoAll, log, ep_ranks))
        else:
            if sc.combine_signature != "release":
                record(api.moe_alltoall, "MoeAlltoAll",
                       fake_mod.custom_moe_alltoall(CUSTOM_COMBINES[sc.combine_signature]))
            ctx.add_cleanup(recording_moe_alltoall(log, ep_ranks))
    if sc.api == "comm" and api.has("comm", two_sided=True):
        record(api.alltoall, "MnnvlMoe", recording_mnnvl_moe(api.alltoall.MnnvlMoe, log, ep_ranks))
    if sc.api == "moe_ep" and api.has("moe_ep"):
        record(api.moe_ep, "create_communication",
               recording_communication(api.moe_ep.create_communication, log, ep_ranks, ctx.add_cleanup))
    if sc.flashinfer_backend == "fake":
        recording_arguments(sc.profile, log, ctx.add_cleanup)
        ctx.add_cleanup(recording_mnnvl_setup(log))
    return api


def _slice(t: torch.Tensor, logical: tuple[int, int], rows: Optional[range] = None,
           cols: Optional[range] = None) -> torch.Tensor:
    """Rows / cols of the logical ``[M, K]`` matrix ``t`` encodes (values or block scales)."""
    (M, K), (m, k) = logical, t.shape
    if rows is not None:
        t = t[rows.start * m // M: rows.stop * m // M]
    if cols is not None:
        t = t[:, cols.start * k // K: cols.stop * k // K]
    return t


def _trtllm_experts(api, sc: Scenario, stage: int, i: int, fmt: str, own: range, tp: tuple[int, int],
                    device: torch.device):
    """This rank's SwiGLU experts on the fake's TRT-LLM kernel; expert parallel off gives each
    TP rank its slice of every expert's intermediate dimension (vLLM's weight loader)."""
    H, I = sc.hidden, intermediate_size(sc)
    part = I // tp[1]
    mine = range(tp[0] * part, (tp[0] + 1) * part)
    w1_runs = (mine, range(I + mine.start, I + mine.stop))  # the linear rows, then the gate rows

    def shard(q, logical, w1: bool):
        if w1:
            return tuple(None if t is None else torch.cat([_slice(t, logical, rows=r) for r in w1_runs])
                         for t in q)
        return tuple(None if t is None else _slice(t, logical, cols=mine) for t in q)

    w = [swiglu_weights(sc.seed, stage, i, e, fmt, H, I) for e in own]
    q1 = [shard(x.q1, (2 * I, H), True) for x in w]
    q2 = [shard(x.q2, (H, I), False) for x in w]
    stack = lambda qs, j: torch.stack([q[j] for q in qs]).to(device)  # noqa: E731
    if fmt == "bf16":
        w1, w2 = stack(q1, 0), stack(q2, 0)
    else:
        nvfp4 = fmt == "nvfp4"
        gs1 = torch.tensor([x.gs1 for x in w], device=device) if nvfp4 else None
        gs2 = torch.tensor([x.gs2 for x in w], device=device) if nvfp4 else None
        w1 = QuantizedWeights(stack(q1, 0), stack(q1, 1), gs1)
        w2 = QuantizedWeights(stack(q2, 0), stack(q2, 1), gs2)
    a1_gscale = quant_config(fmt).a1_gscale
    return TrtLlmExperts(api, fmt, w1, w2, num_experts=sc.experts, top_k=sc.top_k, local_expert_offset=own.start,
                         a1_gscale=None if a1_gscale is None else a1_gscale.to(device), weighted=not sc.router_weight_on_input,
                         packed_routing=sc.expert_kernel == "trtllm-packed")


def _start_rank(ctx, sc: Scenario, log_dir: str, integration_module: str, mutant: Optional[str]):
    """What every rank program starts with: its event log, the integration registered (and
    mutated), the late zeroing where asked (before the integration builds anything), the POSIX
    shared memory it creates and its FlashInfer recorded; returns ``(log, integration, api)``."""
    log = EventLog(f"{log_dir}/rank{ctx.rank}.jsonl")
    ctx.add_cleanup(log.close)
    integrations.register(integration_module)
    if mutant:
        ctx.add_cleanup(mutants.apply(mutant))
    if sc.late_zeroing:
        ctx.add_cleanup(late_zeroing.install(ctx, sc.layout.group_of("ep", ctx.rank), log_dir))
    ctx.add_cleanup(record_posix_shm(log))
    return log, integrations.get(sc.integration), _install(ctx, sc, log)


def run_scenario(ctx, sc: Scenario, log_dir: str, mutant: Optional[str] = None,
                 integration_module: str = "testbed.integrations.impl") -> dict:
    """Rank program: this rank's stage's layers, built by the scenario's integration
    (:mod:`testbed.integrations`; ``integration_module`` registers it in this process) around
    the testbed's experts, then every forward pass.

    Returns ``{"outputs": {(pass, layer): [T, H] bf16 on the CPU}, "lanes": {(pass, layer):
    Counter}, "weights_scale": {layer: the factor its router folded into the weights},
    "phases": {"engine" | "build" | "passes": seconds this rank spent standing the integration
    up, building its layers, running the passes}, "engine_modules": the engine modules first reported here (:func:`engine_modules`)}``;
    everything else is in the event log ``{log_dir}/rank{r}.jsonl``. On the real
    FlashInfer the layers run on this rank's GPU.
    """
    began = time.monotonic()
    device = rank_device(ctx, sc.flashinfer_backend)
    log, integration, api = _start_rank(ctx, sc, log_dir, integration_module, mutant)
    session = integration.start(ctx, sc, api, log)  # the engine's own set-up is not audited
    phases = {"engine": time.monotonic() - began}
    ctx.add_cleanup(audit.install(log, ctx.world_size, integration.traits(sc).code))
    stage, dp_rank, tp = ctx.coords.pp_rank, ctx.coords.dp_rank, (ctx.coords.tp_rank, sc.layout.tp)
    ep_rank = 0 if sc.path == "none" else dist.get_rank(ctx.groups["ep"])
    own = local_experts(sc.experts, sc.ep_size, ep_rank)
    expert_shard = tp if sc.path == "none" else (0, 1)
    layers = []
    for i, layer in enumerate(sc.stages[stage]):
        if sc.expert_kernel != "reference":
            experts = _trtllm_experts(api, sc, stage, i, layer.fmt, own, expert_shard, device)
        else:
            experts = Experts(layer.fmt, sc.hidden, own,
                              functools.partial(expert_weight, sc.seed, stage, i, hidden=sc.hidden),
                              weighted=not sc.router_weight_on_input, shard=expert_shard)
        recording = RecordingExperts(experts, log, own)
        built = session.build_layer(i, layer.fmt, layer.max_num_tokens, recording)
        log.write(LayerBuilt(layer=i))
        layers.append((built, recording))
    phases["build"] = time.monotonic() - began - phases["engine"]
    outputs, lanes = {}, {}
    for p in range(len(sc.passes)):
        with session.forward_pass(sc.tokens(p, sc.stages[stage][0], dp_rank)):
            for i, (moe, recording) in enumerate(layers):
                x_TH, ids_TK, w_TK = (t.to(device) for t in layer_inputs(sc, p, stage, i, dp_rank))
                # The router's conversion (vLLM's _convert_indices_dtype): the dtype the
                # prepare/finalize asks for, else the router's own.
                ids_TK = ids_TK.to(moe.topk_indices_dtype() or getattr(torch, sc.router_ids))
                with session.layer_call(x_TH.size(0)):
                    log.write(ForwardStart(pass_index=p, layer=i, reduced=bool(moe.output_is_reduced()), pending=moe.reduce_pending, sp=moe.sequence_parallel))
                    recording.lanes = Counter()
                    out = moe(x_TH, w_TK, ids_TK)
                    log.write(ForwardEnd(pass_index=p, layer=i))
                outputs[(p, i)] = out.cpu()
                lanes[(p, i)] = recording.lanes
    # A router that folds the routed scaling factor into the weights hands the experts scaled
    # weights (SGLang's TopK where its MoE runner asks for it).
    scales = {i: getattr(moe, "weights_scale", 1.0) for i, (moe, _) in enumerate(layers)}
    phases["passes"] = time.monotonic() - began - phases["engine"] - phases["build"]
    return {"outputs": outputs, "lanes": lanes, "weights_scale": scales, "phases": phases,
            "engine_modules": engine_modules(ctx, integration)}


_REPORTED: set[str] = set()  # engine modules this process already reported


def engine_modules(ctx, integration) -> tuple[str, ...]:
    """The engine's modules this rank process loaded and has not reported yet (rank 0's; none
    for impl): the parent's union over a run is what the run imported, the identity of the
    code it judged."""
    if ctx.rank != 0 or integration.engine is None:
        return ()
    name = integration.engine.name
    new = {m for m in sys.modules if (m == name or m.startswith(name + ".")) and m not in _REPORTED}
    _REPORTED.update(new)
    return tuple(sorted(new))


def record_engine_rank(ctx, sc: Scenario, log_dir: str, integration_module: str,
                       mutant: Optional[str] = None) -> EventLog:
    """What an engine rank records, whoever runs the engine (a rank program here, or the
    engine's own process where the testbed serves it): its event log, its FlashInfer as the
    layer scenario ``sc``'s, and the collectives of the integration's engine code."""
    log, integration, _ = _start_rank(ctx, sc, log_dir, integration_module, mutant)
    ctx.add_cleanup(audit.install(log, ctx.world_size, integration.engine_code()))
    return log


def run_engine(ctx, sc: Scenario, es, model_dir: str, log_dir: str, integration_module: str,
               reference: bool = False, mutant: Optional[str] = None) -> dict:
    """Rank program of an engine scenario ``es`` (:mod:`testbed.scenario.engine`): the
    integration's engine generating from the checkpoint in ``model_dir``, its FlashInfer
    recorded as a layer scenario's is (``sc``: the run as a layer scenario) and the MoE
    layer's collectives audited; ``reference``: one rank, expert parallel off."""
    log = record_engine_rank(ctx, sc, log_dir, integration_module, mutant)
    return integrations.get(sc.integration).run_engine(ctx, sc, es, model_dir, log, reference)
