"""The rank program of a scenario: build the integration's layers, run the forward passes,
and record what ``impl`` did.

Legend: T tokens of this DP rank, K top_k, H hidden, N rows this EP rank received.
The record is an event log (:mod:`testbed.scenario.audit`) the parent reads even after a
hang or a crash, plus the returned outputs and the lanes the experts computed. The fake's
``MoeAlltoAll`` is subclassed here to log each construction (its token budget and workspace
size) and whether each combine got ``output=``; the combine signature the probe sees is the
scenario's. ``moe_ep``'s communications are recorded alike.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import itertools
from collections import Counter
from typing import Optional

import torch
import torch.distributed as dist

from fakes.flashinfer.comm import trtllm_moe_alltoall as fake_mod
from impl.experts import QuantizedWeights, TrtLlmExperts
from testbed import integrations, patch
from testbed.contract.setup_calls import COMM_METHODS
from testbed.scenario import audit, mutants
from testbed.scenario.experts import Experts
from testbed.scenario.model import Scenario
from testbed.scenario.moe import quant_config, rank_api, rank_device
from testbed.scenario.reference import (
    expert_weight,
    intermediate_size,
    lane_keys,
    layer_inputs,
    local_experts,
    swiglu_weights,
)


def _recording_moe_alltoall(base: type, log: audit.EventLog, ep_ranks: tuple[int, ...]) -> type:
    """``base`` logging its constructions and, as collectives of the EP group (which they
    are: every rank waits for every peer's flags), its dispatches and combines."""
    builds = itertools.count(1)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._testbed_build = next(builds)
        log.write(ev="build", index=self._testbed_build, max_num_tokens=self.max_num_tokens,
                  workspace_size=self.workspace_size_per_rank, top_k=self.top_k, num_experts=self.num_experts,
                  workspace=self.workspace.data_ptr())

    def _dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank, *args, **kwargs):
        log.write(ev="coll", op="moe_a2a_dispatch", group=list(ep_ranks), site=audit.integration_call_site())
        log.write(ev="dispatch", rtm=runtime_max_tokens_per_rank, tokens=token_selected_experts.size(0))
        recv = base._dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                              *args, **kwargs)
        _log_dispatched(log, self._testbed_build, self)
        return recv

    def _combine(self, payload, runtime_max_tokens_per_rank, *args, **kwargs):
        output = kwargs.get("output", args[3] if len(args) > 3 else None)
        in_workspace = kwargs.get("payload_in_workspace", args[0] if args else False)
        log.write(ev="combine", build=self._testbed_build, output=output is not None,
                  rtm=runtime_max_tokens_per_rank, in_workspace=bool(in_workspace))
        log.write(ev="coll", op="moe_a2a_combine", group=list(ep_ranks), site=audit.integration_call_site())
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
            log.write(ev="coll", op=name, group=list(ep_ranks), site=audit.integration_call_site())
            return fn(*args, **kwargs)

        return staticmethod(call)

    names = ("mnnvl_moe_alltoallv_prepare_without_allgather", "mnnvl_moe_alltoallv", "mnnvl_moe_alltoallv_combine")
    return type("MnnvlMoe", (base,), {name: logged(name) for name in names})


def _recording_communication(create, log: audit.EventLog, ep_ranks: tuple[int, ...]):
    """``moe_ep.create_communication`` whose communications log their construction (token
    capacity and workspace bytes per rank), and their dispatches and combines as ``MoeAlltoAll``'s
    do (the probe reads the real signatures through ``__wrapped__``)."""
    builds = itertools.count(1)

    def create_communication(bootstrap, params, backend, **options):
        comm = create(bootstrap, params, backend, **options)
        comm._testbed_build = next(builds)
        extra = getattr(getattr(comm, "config", None), "extra_payload_bytes_per_token", 0) or 0
        log.write(ev="ep_build", index=comm._testbed_build, kind=comm.backend_name,
                  max_num_tokens=params.max_tokens_per_rank, top_k=params.top_k, num_experts=params.num_experts,
                  workspace_size=_workspace_bytes(comm), hidden=params.hidden_size,
                  row_bytes=params.dispatch_bytes_per_token + extra)
        comm.__class__ = _recording_communication_class(type(comm), log, ep_ranks)
        return comm

    return create_communication


def _log_dispatched(log: audit.EventLog, build: int, alltoall) -> None:
    """Where the round just dispatched put its combine region in this rank's workspace row
    (the 128-aligned end of its dispatch payloads), for a fake ``MoeAlltoAll``; 0.7.4's own
    moe_ep kernels lay out no such offset and log none."""
    offset = getattr(getattr(alltoall, "_state", None), "combine_payload_offset", None)
    if offset is not None:
        log.write(ev="dispatched", build=build, combine_offset=int(offset))


def _workspace_bytes(comm) -> int:
    """Bytes per rank of the fake communication's (main) workspace: 0.7.4's one-sided layout,
    0.7.2's ``MoeAlltoAll``, or the two-sided FIFO."""
    if hasattr(comm, "metainfo"):
        return int(comm.metainfo[comm._index.WORKSPACE_SIZE_INDEX])
    if hasattr(comm, "alltoall"):
        return comm.alltoall.workspace_size_per_rank
    return comm._workspace.size(1) * comm._workspace.element_size()


def _recording_communication_class(base: type, log: audit.EventLog, ep_ranks: tuple[int, ...]) -> type:
    @functools.wraps(base.dispatch)
    def dispatch(self, hidden_states, topk_ids, *args, **kwargs):
        result_kw = kwargs.get("runtime_max_tokens_per_rank", kwargs.get("max_tokens_per_rank"))
        log.write(ev="coll", op="moe_ep_dispatch", group=list(ep_ranks), site=audit.integration_call_site())
        log.write(ev="dispatch", rtm=result_kw, tokens=topk_ids.size(0), build=self._testbed_build)
        result = base.dispatch(self, hidden_states, topk_ids, *args, **kwargs)
        _log_dispatched(log, self._testbed_build, getattr(self, "_alltoall", None))
        return result

    @functools.wraps(base.get_combine_input_buffer)
    def get_combine_input_buffer(self, dtype):
        self._testbed_buffer = base.get_combine_input_buffer(self, dtype)
        return self._testbed_buffer

    @functools.wraps(base.combine)
    def combine(self, expert_output, *args, **kwargs):
        buffer, self._testbed_buffer = getattr(self, "_testbed_buffer", None), None
        # moe_ep's combine takes no step size: it runs with its dispatch's (rtm None)
        log.write(ev="combine", build=self._testbed_build, output=kwargs.get("output") is not None, rtm=None,
                  in_workspace=buffer is not None and expert_output.data_ptr() == buffer.data_ptr())
        log.write(ev="coll", op="moe_ep_combine", group=list(ep_ranks), site=audit.integration_call_site())
        return base.combine(self, expert_output, *args, **kwargs)

    return type(base.__name__, (base,), {"dispatch": dispatch, "combine": combine,
                                         "get_combine_input_buffer": get_combine_input_buffer})


def _recording_public_moe_alltoall(base: type, log: audit.EventLog, ep_ranks: tuple[int, ...]) -> type:
    """A real ``MoeAlltoAll`` logging what :func:`_recording_moe_alltoall` logs, through its
    public ``dispatch`` and ``combine`` (the fake's hooks are its own); the probe sees their
    signatures through ``__wrapped__``."""
    builds = itertools.count(1)
    dispatch_sig, combine_sig = inspect.signature(base.dispatch), inspect.signature(base.combine)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._testbed_build = next(builds)
        log.write(ev="build", index=self._testbed_build, max_num_tokens=self.max_num_tokens,
                  workspace_size=self.workspace_size_per_rank, top_k=self.top_k, num_experts=self.num_experts,
                  workspace=self.workspace.data_ptr())

    @functools.wraps(base.dispatch)
    def dispatch(self, *args, **kwargs):
        given = dispatch_sig.bind(self, *args, **kwargs).arguments
        log.write(ev="coll", op="moe_a2a_dispatch", group=list(ep_ranks), site=audit.integration_call_site())
        log.write(ev="dispatch", rtm=given["runtime_max_tokens_per_rank"],
                  tokens=given["token_selected_experts"].size(0))
        return base.dispatch(self, *args, **kwargs)

    @functools.wraps(base.combine)
    def combine(self, *args, **kwargs):
        given = combine_sig.bind(self, *args, **kwargs).arguments
        log.write(ev="combine", build=self._testbed_build, output=given.get("output") is not None,
                  rtm=given["runtime_max_tokens_per_rank"], in_workspace=bool(given.get("payload_in_workspace")))
        log.write(ev="coll", op="moe_a2a_combine", group=list(ep_ranks), site=audit.integration_call_site())
        return base.combine(self, *args, **kwargs)

    return type("MoeAlltoAll", (base,), {"__init__": __init__, "dispatch": dispatch, "combine": combine})


def _recording_arguments(profile: str, log: audit.EventLog, cleanup) -> None:
    """Every public callable of the fake whose parameters the release annotates (or gives a
    literal default), wrapped for the scenario so that each argument the integration passes it
    directly and its release rules out is logged with its call site (``arguments``): a function
    for a count, a list for a tensor, another enum. The table is the release's own
    (:mod:`fakes.flashinfer.annotations`); calls the fake makes itself are not checked."""
    from fakes.flashinfer.annotations import table

    done: set = set()  # (holder, attribute): every path a name is exported by gets the check
    for qualname, rules in table(profile).items():
        if not any(rules.values()):
            continue
        found = _fake_callable(qualname)
        if found is None:
            continue
        module, owner, attr, raw = found
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if (id(owner), attr) in done or not callable(fn):
            continue
        done.add((id(owner), attr))
        checked = _checking(fn, qualname, module, log)
        wrapped = type(raw)(checked) if isinstance(raw, (staticmethod, classmethod)) else checked
        cleanup(patch.attribute(owner, attr, wrapped))


def _fake_callable(qualname: str):
    """``(module, owner, attribute, raw object)`` of the fake's ``qualname`` under the active
    profile (``owner``: the module or the class that holds it), or None."""
    found = _fake_module_of(qualname)
    if found is None:
        return None
    module, path = importlib.import_module(found[0]), found[1]
    owner = module
    try:
        for attr in path[:-1]:
            owner = getattr(owner, attr)
        raw = inspect.getattr_static(owner, path[-1]) if inspect.isclass(owner) else getattr(owner, path[-1])
    except AttributeError:
        return None
    return module, owner, path[-1], raw


@functools.lru_cache(maxsize=None)
def _fake_module_of(qualname: str):
    """``(the fake module's name, the path under it)`` of ``qualname``: the longest prefix that
    is a module (cached: a failed import searches every path entry)."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        name = ".".join(["fakes.flashinfer"] + parts[:cut])
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name, tuple(parts[cut:])
    return None


def _checking(fn, qualname: str, module, log: audit.EventLog):
    from fakes.flashinfer.annotations import violations

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if _Checking.depth:  # inside another checked call (a recorder's method calling its base's)
            return fn(*args, **kwargs)
        site = audit.direct_integration_call_site()
        if site is not None:
            for param, value, rule in violations(qualname, fn, args, kwargs, _Names(module)):
                log.write(ev="arguments", call=f"flashinfer.{qualname}", param=param, value=value,
                          expected=rule, site=site)
        _Checking.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _Checking.depth -= 1

    return checked


class _Checking:
    depth = 0  # a rank runs one scenario on one thread


class _Names:
    """The names an annotation of ``module`` can mean: the module's, then the package root's."""

    def __init__(self, module):
        self.module = module

    def get(self, name: str):
        import fakes.flashinfer as root

        for where in (self.module, root):
            try:
                return getattr(where, name)
            except AttributeError:
                continue
        return None


def _install(ctx, sc: Scenario, log: audit.EventLog):
    """The scenario's FlashInfer (the fake as its release, or this machine's real one) with the
    API the scenario runs on recorded until it ends. Only that API: 0.7.2's moe_ep builds the
    ``MoeAlltoAll`` its module names, which would be recorded twice."""
    if sc.flashinfer_backend == "fake":
        api = rank_api(ctx, "fake", sc.profile, sc.slot_order)  # ctx.seed is the scenario's
    else:
        from testbed.gpu_env import profile_of

        api = rank_api(ctx, sc.flashinfer_backend)
        if profile_of(api.version) != sc.profile:
            raise RuntimeError(f"--profile {sc.profile}: this machine's FlashInfer is {api.version} (profile "
                               f"{profile_of(api.version)}); the invariants hold the scenario's release to its facts")
    ep_ranks = ctx.group_ranks["ep"]

    def record(module, name: str, recording) -> None:
        ctx.add_cleanup(patch.attribute(module, name, recording))

    if sc.api == "comm" and api.has("comm"):
        if sc.flashinfer_backend != "fake":
            record(api.moe_alltoall, "MoeAlltoAll",
                   _recording_public_moe_alltoall(api.moe_alltoall.MoeAlltoAll, log, ep_ranks))
        else:
            base = fake_mod.MoeAlltoAll if sc.combine_signature == "release" else \
                fake_mod.custom_moe_alltoall(CUSTOM_COMBINES[sc.combine_signature])
            record(api.moe_alltoall, "MoeAlltoAll", _recording_moe_alltoall(base, log, ep_ranks))
    if sc.api == "comm" and api.has("comm", two_sided=True):
        record(api.alltoall, "MnnvlMoe", _recording_mnnvl_moe(api.alltoall.MnnvlMoe, log, ep_ranks))
    if sc.api == "moe_ep" and api.has("moe_ep"):
        record(api.moe_ep, "create_communication",
               _recording_communication(api.moe_ep.create_communication, log, ep_ranks))
    if sc.flashinfer_backend == "fake":
        _recording_arguments(sc.profile, log, ctx.add_cleanup)
        ctx.add_cleanup(_recording_mnnvl_setup(log))
    return api


def _recording_mnnvl_setup(log: audit.EventLog) -> callable:
    """Log the communicator calls each of the fake's MNNVL set-ups makes (``setup-calls``);
    returns what stops it."""
    from fakes.flashinfer.comm.mnnvl import _MnnvlMemory

    original = inspect.getattr_static(_MnnvlMemory, "open_mnnvl_memory").__func__

    def open_mnnvl_memory(mapping, size):
        comm = _MnnvlMemory.get_comm(mapping)
        calls: list[str] = []
        _MnnvlMemory.comm = _CallRecorder(comm, calls)
        try:
            return original(mapping, size)
        finally:
            _MnnvlMemory.comm = comm
            log.write(ev="mnnvl_setup", calls=calls)

    return patch.attribute(_MnnvlMemory, "open_mnnvl_memory", staticmethod(open_mnnvl_memory))


class _CallRecorder:
    """The integration's communicator, noting each CommBackend method FlashInfer calls on it."""

    def __init__(self, comm, calls: list):
        self._comm, self._calls = comm, calls

    def __getattr__(self, name):
        value = getattr(self._comm, name)
        if name in COMM_METHODS:
            self._calls.append(name)
        return value


class RecordingExperts:
    """The layer's experts, logging what each forward hands them: whether to defer, whether
    into the workspace, and the ``(expert, weight)`` lanes of this rank's experts."""

    def __init__(self, experts, log: audit.EventLog, own: range):
        self.experts, self.log, self.own = experts, log, own
        self.lanes: Counter = Counter()

    def supports_deferred_finalize(self) -> bool:
        return self.experts.supports_deferred_finalize()

    def __call__(self, prepared, *, defer: bool = False, output=None):
        self.lanes.update(lane_keys(prepared.topk_ids.cpu(), prepared.topk_weights.cpu(), self.own))
        self.log.write(ev="experts", defer=defer, buffer=output is not None)
        return self.experts(prepared, defer=defer, output=output)


def _record_posix_shm(log: audit.EventLog):
    """Log the name of every ``multiprocessing.shared_memory`` segment this rank creates (vLLM's
    message queues make them) until the scenario ends, so the parent can remove what a killed
    rank leaves and count what a finished one leaves; returns the function that stops it."""
    from multiprocessing import resource_tracker

    register = resource_tracker.register

    def recorded(name, rtype):
        if rtype == "shared_memory":
            log.write(ev="posix_shm", name=name)
        return register(name, rtype)

    resource_tracker.register = recorded
    return lambda: setattr(resource_tracker, "register", register)


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


def run_scenario(ctx, sc: Scenario, log_dir: str, mutant: Optional[str] = None) -> dict:
    """Rank program: this rank's stage's layers, built by the scenario's integration
    (:mod:`testbed.integrations`) around the testbed's experts, then every forward pass.

    Returns ``{"outputs": {(pass, layer): [T, H] bf16 on the CPU}, "lanes": {(pass, layer):
    Counter}}``; everything else is in the event log ``{log_dir}/rank{r}.jsonl``. On the real
    FlashInfer the layers run on this rank's GPU.
    """
    device = rank_device(ctx, sc.flashinfer_backend)
    log = audit.EventLog(f"{log_dir}/rank{ctx.rank}.jsonl")
    ctx.add_cleanup(log.close)
    if mutant:
        ctx.add_cleanup(mutants.apply(mutant))
    ctx.add_cleanup(_record_posix_shm(log))
    integration = integrations.get(sc.integration)
    api = _install(ctx, sc, log)
    session = integration.start(ctx, sc, api, log)  # the engine's own set-up is not audited
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
        log.write(ev="layer", layer=i)
        layers.append((built, recording))
    outputs, lanes = {}, {}
    for p in range(len(sc.passes)):
        with session.forward_pass(sc.tokens(p, sc.stages[stage][0], dp_rank)):
            for i, (moe, recording) in enumerate(layers):
                x_TH, ids_TK, w_TK = (t.to(device) for t in layer_inputs(sc, p, stage, i, dp_rank))
                # The router's conversion (vLLM's _convert_indices_dtype): the dtype the
                # prepare/finalize asks for, else the router's own.
                ids_TK = ids_TK.to(moe.topk_indices_dtype() or getattr(torch, sc.router_ids))
                with session.layer_call(x_TH.size(0)):
                    log.write(ev="forward", pass_=p, layer=i, reduced=bool(moe.output_is_reduced()),
                              pending=moe.reduce_pending, sp=moe.sequence_parallel)
                    recording.lanes = Counter()
                    out = moe(x_TH, w_TK, ids_TK)
                    log.write(ev="forward_end", pass_=p, layer=i)
                outputs[(p, i)] = out.cpu()
                lanes[(p, i)] = recording.lanes
    return {"outputs": outputs, "lanes": lanes}
