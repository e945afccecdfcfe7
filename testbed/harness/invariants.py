"""The invariants every scenario is checked against, each failing with its name and evidence.

- ``completes``: every rank finished (no raise, no death, no hang).
- ``output``: every rank's output of every layer and pass matches the dense fp32 reference.
- ``expert-load``: each EP rank's experts computed exactly the lanes routed to them (rows the
  dispatch left stale must not reach them), order-insensitive.
- ``workspace``: after each layer is built the live ``MoeAlltoAll`` covers every layer built
  so far at its own budget; sizes never shrink; builds = strict increases of the need; the
  same on every rank of the EP group. An integration of one fixed capacity (a ``MoeAlltoAll``
  per layer): every build has the one capacity; every round runs on one that covers its
  layer's budget with a workspace covering the layer at that capacity; the ``MoeAlltoAll``s
  built with one layer (a decode and a prefill one) have workspaces of their own; the same
  builds on every rank. On ``moe_ep``: one communication per distinct layer
  budget, built with the layers (not during the forwards) for the model's top_k and experts;
  every round runs on one whose token capacity covers its layer; the same builds on every
  rank of the EP group.
- ``collectives``: the integration uses the EP group (set-up, barriers, all-to-all rounds), the TP
  group for the reduce (and under sequence parallel the all-gather), and on the
  all-gather/reduce-scatter path the DP group; the ranks of a group issue the same
  sequence; every rebuild is followed by a barrier on the EP group.
- ``reduce``: ``output_is_reduced()`` is True for the FlashInfer all-to-alls (their combines
  reduce) and False for all-gather/reduce-scatter and expert parallel off; the TP all-reduce
  runs exactly when the layer's parts are TP-partial (not reduced, no sequence parallel).
- ``finalize``: the experts are asked to defer finalize exactly where vLLM's guard allows
  (expert parallel off, TP > 1, this rank has tokens, a kernel that can), once per forward.
- ``expert-output``: with ``--expert-output workspace`` the experts get the combine region
  and every combine runs with ``payload_in_workspace``; otherwise neither (for an integration
  that follows the flag; vLLM's modular kernel decides it from the release's prepare).
- ``probe``: combine receives ``output=`` exactly when the exposed combine takes it (for an
  integration that probes for it).
- ``runtime-max-tokens``: each one-sided (and each ``moe_ep``) round dispatches and combines with the max over the
  dispatching ranks of the layer's token counts (at least 1; under sequence parallel a DP
  rank's count is split over its TP ranks), the same on every rank.
- ``arguments``: every argument the integration passes straight to the fake's public API is
  what the release's annotation (or, without one, its default) allows: an int where it takes a
  count, not a function; a tensor, not a list.
- ``setup-calls`` (the fake): each MNNVL set-up makes the integration's communicator calls the
  release's ``open_mnnvl_memory`` makes, in its order (``testbed.contract.setup_calls``).
- ``round-ordering``: on one workspace, a round whose dispatch payload region reaches into the
  previous round's combine region (its combine offset is larger) comes after a collective of
  every EP rank since that combine: FlashInfer's one-sided protocol waits for peers only at
  the start of its reads, so otherwise a peer still reading its combine output can be
  overwritten (decided from the logged offsets, not from timing). And no rank writes into a
  workspace between a round's combine and the next dispatch: the experts' writes into the
  combine region are writes of their round, which FlashInfer's buffer is handed for (the fake
  tells each write it sees outside a round).
- ``no-leaks`` (checked by the runner): no process or shared-memory segment left behind.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch

from fakes.flashinfer.comm import trtllm_moe_alltoall
from fakes.flashinfer.profiles import fake_profile, resolve
from testbed import integrations
from testbed.harness import audit
from testbed.integrations.base import AdapterSetupError
from testbed.scenario.events import (
    AlltoallBuilt,
    ArgumentRefused,
    Collective,
    Combine,
    CommunicationBuilt,
    Event,
    Dispatch,
    Dispatched,
    ExpertsCall,
    ForwardEnd,
    ForwardStart,
    LayerBuilt,
    MnnvlSetup,
    WorkspaceWritten,
)
from testbed.scenario.model import Scenario, row_bytes
from testbed.scenario.reference import (
    tolerance,
    dispatch_bytes,
    expected_expert_rows,
    reference_outputs,
)

INVARIANTS = ("completes", "output", "expert-load", "workspace", "collectives", "reduce", "finalize",
              "expert-output", "probe", "runtime-max-tokens", "round-ordering", "arguments", "setup-calls",
              "no-leaks")
# The all-to-all's own rounds: the protocol whose waits are not enough on their own.
A2A_OPS = ("moe_a2a_dispatch", "moe_a2a_combine", "moe_ep_dispatch", "moe_ep_combine")
FLASHINFER_PATHS = ("one_sided", "two_sided")
MAX_EVIDENCE = 6  # findings kept per invariant


@dataclass(frozen=True)
class Failure:
    invariant: str
    evidence: str


@dataclass
class Verdict:
    """The outcome of one scenario: failures by invariant, and the figures a report shows."""

    scenario: Scenario
    failures: list[Failure] = field(default_factory=list)
    worst: float = 0.0  # worst |output - reference| as a multiple of the tolerance
    layer_errors: list[tuple[str, float]] = field(default_factory=list)  # ("s0 l1 p0", x tolerance)
    builds: list[list[tuple[int, int]]] = field(default_factory=list)  # per stage: (max tokens, bytes)
    seconds: float = 0.0
    known: list[str] = field(default_factory=list)  # the known findings it reproduced (testbed.harness.findings)
    known_failures: list[Failure] = field(default_factory=list)  # their failures, as evidence
    # The testbed could not stand the integration up (its adapter's set-up of the engine's config,
    # platform or workspace manager raised): no invariant judged it, and it is no FAIL of the engine.
    testbed_error: str = ""
    # Seconds of the scenario's parts, the slowest rank's: "engine" (standing the integration
    # up), "build", "passes", "teardown" (for the cost bench; no invariant reads them).
    phases: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures and not self.testbed_error

    @property
    def status(self) -> str:
        """``ERROR`` (the testbed's own), ``FAIL``, ``KNOWN`` or ``PASS``."""
        return "ERROR" if self.testbed_error else "FAIL" if self.failures else "KNOWN" if self.known else "PASS"

    def failed(self, invariant: str) -> list[Failure]:
        return [f for f in self.failures if f.invariant == invariant]


class _Findings:
    def __init__(self, verdict: Verdict, invariant: str):
        self.verdict, self.invariant, self.items = verdict, invariant, []

    def add(self, text: str) -> None:
        self.items.append(text)

    def close(self) -> None:
        if self.items:
            more = len(self.items) - MAX_EVIDENCE
            text = "\n".join(self.items[:MAX_EVIDENCE]) + (f"\n(+{more} more)" if more > 0 else "")
            self.verdict.failures.append(Failure(self.invariant, text))


def check(sc: Scenario, logs: dict[int, list[Event]], results: Optional[list[dict]], error) -> Verdict:
    """Every invariant of ``sc`` on what the ranks logged and returned (``results`` is None
    when the scenario did not complete; ``error`` is then the :class:`ScenarioError`)."""
    v = check_rounds(sc, logs, error)
    _finalize(sc, logs, v)
    if results is not None:
        _output(sc, results, v)
        _expert_load(sc, results, v)
    return v


def check_rounds(sc: Scenario, logs: dict[int, list[Event]], error) -> Verdict:
    """The invariants that judge what the integration did from the event log alone (an
    engine run's rounds: its outputs have no per-layer reference, and its experts are not
    the testbed's): every one but ``finalize``, ``output`` and ``expert-load``."""
    v = Verdict(sc)
    v.testbed_error = adapter_setup_error(error)
    if v.testbed_error:
        return v
    # After a failure the ranks stopped at different points: only what is certain counts.
    finished = None if error is None else set(error.finished)
    if error is not None:
        v.failures.append(Failure("completes", f"{type(error).__name__}: {error}"))
    _collectives(sc, logs, v, finished)
    _workspace(sc, logs, v, complete=error is None)
    _reduce(sc, logs, v, complete=error is None)
    _expert_output(sc, logs, v)
    _probe(sc, logs, v)
    _runtime_max_tokens(sc, logs, v)
    _round_ordering(sc, logs, v)
    _arguments(logs, v)
    _setup_calls(sc, logs, v)
    return v


def adapter_setup_error(error) -> str:
    """What stopped the adapter's own set-up on the first rank it stopped (an
    :class:`~testbed.integrations.base.AdapterSetupError`, raised before any of the engine's
    all-to-all code ran), with that rank's traceback; empty where none did."""
    raised = [rep for rep in (error.reports.values() if error is not None else ())
              if rep.status == "raised" and rep.summary.startswith(AdapterSetupError.__name__ + ":")]
    if not raised:
        return ""
    first = min(raised, key=lambda rep: rep.failed_at or 0.0)
    return f"rank {first.rank}: {first.summary}\n{first.detail.rstrip()}"


def _stage(sc: Scenario, rank: int) -> int:
    return sc.layout.coords(rank).pp_rank


def _group_text(ranks) -> str:
    return "[" + ",".join(map(str, ranks)) + "]"


def _collectives(sc: Scenario, logs, v: Verdict, finished) -> None:
    f = _Findings(v, "collectives")
    lay = sc.layout
    # FlashInfer's contract, per release: before 0.7.1 MoeAlltoAll's workspace set-up does not
    # barrier after zeroing this rank's row, so its caller must, on the EP group, before first use.
    caller_barriers = not resolve(sc.profile).init_barrier
    for rank, events in sorted(logs.items()):
        ep, tp, dp = lay.group_of("ep", rank), lay.group_of("tp", rank), lay.group_of("dp", rank)
        allowed = {(ep, None), (tp, "all_reduce")}
        if sc.sequence_parallel:
            allowed |= {(tp, "all_gather"), (tp, "all_gather_into_tensor")}
        if sc.path == "allgather_reducescatter" and not sc.sequence_parallel:
            allowed |= {(dp, "all_gather"), (dp, "all_reduce")}
        for e in events:
            group = getattr(e, "group", ())
            if isinstance(e, Collective) and (group, None) not in allowed and (group, e.op) not in allowed:
                f.add(f"rank {rank}: {e.op} on group {_group_text(group)} from {e.site}; the integration may use its "
                      f"EP group {_group_text(ep)}, its TP group {_group_text(tp)} for the reduce"
                      + (" and the sequence-parallel all-gather" if sc.sequence_parallel else "")
                      + (f", and its DP group {_group_text(dp)} to gather and reduce-scatter"
                         if sc.path == "allgather_reducescatter" and not sc.sequence_parallel else ""))
        if caller_barriers:
            _rebuild_barriers(rank, events, ep, f, sc.profile)
    for group, by_rank in sorted(audit.calls_per_group(logs).items()):
        found = audit.divergence(group, by_rank, finished)
        if found:
            f.add(found)
    f.close()


def _rebuild_barriers(rank: int, events: list[Event], ep: tuple[int, ...], f: _Findings, release: str) -> None:
    """Every ``MoeAlltoAll`` build followed by a barrier on the EP group before a layer is built
    or a forward starts (FlashInfer ``release``'s contract: its set-up leaves the barrier to
    the caller). A ``moe_ep`` communication barriers inside its own set-up on every release."""
    pending = None
    for e in events:
        if isinstance(e, AlltoallBuilt):
            pending = e
        elif isinstance(e, Collective) and pending and e.op in ("barrier", "monitored_barrier") \
                and e.group == ep:
            pending = None
        elif isinstance(e, (LayerBuilt, ForwardStart)) and pending:
            f.add(f"rank {rank}: MoeAlltoAll build {pending.index} (max_num_tokens {pending.max_num_tokens}, "
                  f"{pending.workspace_size} bytes) was not followed by a barrier on the EP group {_group_text(ep)} "
                  f"before the layer was used: FlashInfer {release}'s workspace set-up does not barrier after "
                  "zeroing this rank's row (0.7.1 on does), so a peer's first dispatch can land before the zeroing "
                  "and be erased")
            pending = None


def _workspace(sc: Scenario, logs, v: Verdict, complete: bool) -> None:
    if sc.api == "moe_ep":
        _moe_ep_workspace(sc, logs, v, complete)
        return
    if sc.path != "one_sided" or "comm.trtllm_moe_alltoall" in resolve(sc.profile).absent_modules:
        return  # (a release without MoeAlltoAll: nothing was built; completes says what failed)
    check = _fixed_capacity if integrations.get(sc.integration).traits(sc).fixed_capacity else _workspace_checks
    with fake_profile(sc.profile):  # the auxiliary region's size depends on the release's kMaxTopK
        check(sc, logs, v, complete)


def _fixed_capacity(sc: Scenario, logs, v: Verdict, complete: bool) -> None:
    f = _Findings(v, "workspace")
    ep = sc.ep_size
    v.builds = [[] for _ in sc.stages]
    seen_stage: dict[int, tuple] = {}
    for rank, events in sorted(logs.items()):
        layers = sc.stages[_stage(sc, rank)]
        builds, by_index, pending, where, per_layer = [], {}, [], None, {}
        for e in events:
            if isinstance(e, AlltoallBuilt):
                _model_mismatch(sc, f, rank, "build", e)
                if by_index and e.max_num_tokens != builds[0][0]:
                    f.add(f"rank {rank}: build {e.index} has max_num_tokens {e.max_num_tokens}, build 1 "
                          f"{builds[0][0]} (one fixed capacity for every layer)")
                by_index[e.index] = e
                pending.append(e)
                builds.append((e.max_num_tokens, e.workspace_size))
            elif isinstance(e, LayerBuilt):
                if not by_index:
                    f.add(f"rank {rank}: layer {e.layer} built without any MoeAlltoAll")
                shared = [w for w, n in Counter(b.workspace for b in pending).items() if n > 1]
                if shared:
                    f.add(f"rank {rank}: the {len(pending)} MoeAlltoAlls built with layer {e.layer} (builds "
                          f"{', '.join(str(b.index) for b in pending)}) share a workspace; they are live at once "
                          "(decode and prefill), so a round of one can overwrite the other's (FlashInfer caches "
                          "workspaces by size)")
                per_layer[e.layer] = {b.workspace for b in pending}
                pending = []
            elif isinstance(e, ForwardStart):
                where = (e.pass_index, e.layer)
            elif isinstance(e, Combine) and where is not None and e.build in by_index:
                (p, i), b = where, by_index[e.build]
                ly = layers[i]
                need = _size(ep, b.max_num_tokens, dispatch_bytes(ly, sc), 2 * sc.hidden)
                if b.max_num_tokens < ly.max_num_tokens or b.workspace_size < need:
                    f.add(f"rank {rank} pass {p} layer {i} ({ly}): its round ran on MoeAlltoAll build {b.index} of "
                          f"max_num_tokens {b.max_num_tokens} and {b.workspace_size} bytes; the layer needs "
                          f"max_num_tokens >= {ly.max_num_tokens} and, at that capacity, {need} bytes")
        _draft_apart(sc, f, rank, len(layers), per_layer)
        _same_builds_in_stage(f, seen_stage, _stage(sc, rank), rank, builds, complete)
        if not v.builds[_stage(sc, rank)]:
            v.builds[_stage(sc, rank)] = builds
    f.close()


def _draft_apart(sc: Scenario, f: "_Findings", rank: int, n: int, per_layer: dict[int, set]) -> None:
    """A speculative draft model's MoeAlltoAlls on workspaces of their own: its decode graph and
    the target's are live at once."""
    draft = range(n - sc.draft_layers, n)
    target_ws = {w for i, ws in per_layer.items() if i not in draft for w in ws}
    shared = sorted(i for i, ws in per_layer.items() if i in draft and ws & target_ws)
    if shared:
        f.add(f"rank {rank}: the draft model's MoeAlltoAlls (layers {', '.join(map(str, shared))}) and the target "
              "model's share a workspace; they are live at once (speculative decoding keeps the target's and the "
              "draft's decode graphs), so a round of one can overwrite the other's (FlashInfer caches workspaces by "
              "size)")


def _workspace_checks(sc: Scenario, logs, v: Verdict, complete: bool) -> None:
    f = _Findings(v, "workspace")
    ep = sc.ep_size
    v.builds = [[] for _ in sc.stages]
    seen_stage: dict[int, tuple] = {}
    for rank, events in sorted(logs.items()):
        stage = _stage(sc, rank)
        layers = sc.stages[stage]
        payloads = [_size(ep, ly.max_num_tokens, dispatch_bytes(ly, sc), 2 * sc.hidden) - _size(ep, ly.max_num_tokens)
                    for ly in layers]
        expected_builds = _expected_builds(ep, layers, payloads)
        builds, live = [], None
        for e in events:
            if isinstance(e, AlltoallBuilt):
                if live and (e.workspace_size < live.workspace_size
                             or e.max_num_tokens < live.max_num_tokens):
                    f.add(f"rank {rank}: build {e.index} shrinks the workspace: {live.workspace_size} -> "
                          f"{e.workspace_size} bytes, max_num_tokens {live.max_num_tokens} -> "
                          f"{e.max_num_tokens}")
                _model_mismatch(sc, f, rank, "build", e)
                live = e
                builds.append((e.max_num_tokens, e.workspace_size))
            elif isinstance(e, LayerBuilt):
                i = e.layer
                if live is None:
                    f.add(f"rank {rank}: layer {i} built without any MoeAlltoAll")
                    continue
                for j in range(i + 1):
                    ly, need = layers[j], _size(ep, live.max_num_tokens) + payloads[j]
                    if live.workspace_size < need or live.max_num_tokens < ly.max_num_tokens:
                        f.add(f"rank {rank}: after layer {i} the MoeAlltoAll does not cover layer {j} ({ly}): "
                              f"behind the auxiliary region of max_num_tokens {live.max_num_tokens} it needs "
                              f"{need} bytes and max_num_tokens >= {ly.max_num_tokens}; the live one (build "
                              f"{live.index}) has {live.workspace_size} bytes")
                if len(builds) != expected_builds[i]:
                    f.add(f"rank {rank}: {len(builds)} builds after layer {i}, expected {expected_builds[i]} "
                          f"(one, plus one per layer whose need exceeded the size so far or whose budget "
                          f"exceeded every earlier one)")
        _same_builds_in_stage(f, seen_stage, stage, rank, builds, complete)
        if not v.builds[stage]:
            v.builds[stage] = builds
    f.close()


def _moe_ep_workspace(sc: Scenario, logs, v: Verdict, complete: bool) -> None:
    if integrations.get(sc.integration).traits(sc).shared_communication:
        _shared_communication(sc, logs, v, complete)
        return
    f = _Findings(v, "workspace")
    v.builds = [[] for _ in sc.stages]
    seen_stage: dict[int, tuple] = {}
    for rank, events in sorted(logs.items()):
        stage = _stage(sc, rank)
        layers, built, layer, forwarded = sc.stages[stage], {}, None, False
        budgets = len({ly.max_num_tokens for ly in layers})
        for e in events:
            if isinstance(e, CommunicationBuilt):
                built[e.index] = e
                if forwarded:
                    f.add(f"rank {rank}: communication {e.index} built during the forwards, not with the layers")
                _model_mismatch(sc, f, rank, "communication", e)
            elif isinstance(e, ForwardStart):
                layer, forwarded = e.layer, True
            elif isinstance(e, Dispatch) and layer is not None:
                ly, comm = layers[layer], built.get(e.build)
                if comm is None:
                    f.add(f"rank {rank}: layer {layer} dispatched on a communication it never built")
                elif comm.max_num_tokens < ly.max_num_tokens:
                    f.add(f"rank {rank}: layer {layer} ({ly}) runs on communication {comm.index} sized for "
                          f"{comm.max_num_tokens} tokens")
        if complete and len(built) != budgets:
            f.add(f"rank {rank}: {len(built)} communication(s) built for {budgets} distinct layer budget(s) "
                  f"{sorted({ly.max_num_tokens for ly in layers})} (one per sizing, shared by the layers that have it)")
        builds = [(b.max_num_tokens, b.workspace_size) for _, b in sorted(built.items())]
        _same_builds_in_stage(f, seen_stage, stage, rank, builds, complete)
        if not v.builds[stage]:
            v.builds[stage] = builds
    f.close()


def _need(sc: Scenario, layer) -> tuple[int, int, int]:
    """What a layer needs of a communication: (tokens per rank, hidden, activation bytes per
    dispatched token), from the format definitions."""
    return layer.max_num_tokens, sc.hidden, sum(row_bytes(layer.fmt, sc.hidden, sc.mx_alignment).values())


NEED_NAMES = ("max_tokens_per_rank", "hidden_size", "dispatch bytes per token")


def _shared_communication(sc: Scenario, logs, v: Verdict, complete: bool) -> None:
    """One communication shared by every layer of the EP group: after each layer is built
    the live one covers every layer so far; a replacement happens exactly when a layer's need
    exceeds it (in tokens, hidden or dispatch bytes), never shrinks any of them; every round
    runs on the live one; the same on every rank of the EP group."""
    f = _Findings(v, "workspace")
    v.builds = [[] for _ in sc.stages]
    seen_stage: dict[int, tuple] = {}
    for rank, events in sorted(logs.items()):
        stage = _stage(sc, rank)
        layers = sc.stages[stage]
        live, before, builds, counted = None, None, [], 0
        for e in events:
            if isinstance(e, CommunicationBuilt):
                got = (e.max_num_tokens, e.hidden, e.row_bytes)
                if live is not None:
                    old = (live.max_num_tokens, live.hidden, live.row_bytes)
                    shrunk = [f"{n} {a} -> {b}" for n, a, b in zip(NEED_NAMES, old, got) if b < a]
                    if shrunk:
                        f.add(f"rank {rank}: communication {e.index} shrinks the shared one: {', '.join(shrunk)}")
                _model_mismatch(sc, f, rank, "communication", e)
                live = e
                builds.append((e.max_num_tokens, e.workspace_size))
            elif isinstance(e, LayerBuilt):
                i = e.layer
                need = _need(sc, layers[i])
                had = None if before is None else (before.max_num_tokens, before.hidden, before.row_bytes)
                required = had is None or any(n > h for n, h in zip(need, had))
                if len(builds) - counted != required:
                    f.add(f"rank {rank}: {len(builds) - counted} build(s) for layer {i} ({layers[i]}), expected "
                          f"{int(required)}: the shared communication is replaced exactly when a layer's need "
                          f"({', '.join(f'{n} {v}' for n, v in zip(NEED_NAMES, need))}) exceeds it")
                before, counted = live, len(builds)
                if live is None:
                    f.add(f"rank {rank}: layer {i} built without any communication")
                    continue
                have = (live.max_num_tokens, live.hidden, live.row_bytes)
                for j in range(i + 1):
                    short = [f"{n} {h} < {w}" for n, h, w in zip(NEED_NAMES, have, _need(sc, layers[j])) if h < w]
                    if short:
                        f.add(f"rank {rank}: after layer {i} the shared communication (build {live.index}) does "
                              f"not cover layer {j} ({layers[j]}): {', '.join(short)}")
            elif isinstance(e, Dispatch) and live is not None and e.build != live.index:
                f.add(f"rank {rank}: a round dispatched on communication {e.build}, but the live one is "
                      f"build {live.index} (a layer kept a replaced communication)")
        _same_builds_in_stage(f, seen_stage, stage, rank, builds, complete)
        if not v.builds[stage]:
            v.builds[stage] = builds
    f.close()


def _model_mismatch(sc: Scenario, f: _Findings, rank: int, what: str, e: dict) -> None:
    """A build for another model's top_k or number of experts."""
    if (e.top_k, e.num_experts) != (sc.top_k, sc.experts):
        f.add(f"rank {rank}: {what} {e.index} has top_k {e.top_k}, num_experts {e.num_experts}; "
              f"the model has {sc.top_k}, {sc.experts}")


def _same_builds_in_stage(f: _Findings, seen_stage: dict, stage: int, rank: int, builds: list, complete: bool) -> None:
    """Every rank of an EP group builds what the first of them built (a prefix of it when the
    scenario did not complete)."""
    if stage in seen_stage and (seen_stage[stage][1] != builds if complete else
                                seen_stage[stage][1][:len(builds)] != builds[:len(seen_stage[stage][1])]):
        f.add(f"rank {rank} built {builds} but rank {seen_stage[stage][0]} of the same EP group built "
              f"{seen_stage[stage][1]}")
    seen_stage.setdefault(stage, (rank, builds))


def _size(ep: int, max_num_tokens: int, dispatch: int = 0, combine: int = 0) -> int:
    return trtllm_moe_alltoall.moe_a2a_get_workspace_size_per_rank(ep, max_num_tokens, dispatch, combine)


def _expected_builds(ep: int, layers, payloads: list[int]) -> list[int]:
    """Builds after each layer under grow-only sizing: a rebuild exactly when the budget or
    the need (the largest payload regions behind the auxiliary region of the largest
    budget) exceeds what the live all-to-all has."""
    builds, size, budget, payload, out = 0, 0, 0, 0, []
    for ly, p in zip(layers, payloads):
        payload, new_budget = max(payload, p), max(budget, ly.max_num_tokens)
        need = _size(ep, new_budget) + payload
        if builds == 0 or need > size or new_budget > budget:
            builds, size, budget = builds + 1, max(size, need), new_budget
        out.append(builds)
    return out


def _reduce(sc: Scenario, logs, v: Verdict, complete: bool) -> None:
    f = _Findings(v, "reduce")
    tp = sc.layout.tp
    reduced = sc.path in FLASHINFER_PATHS  # the FlashInfer combines sum every rank's contribution
    # TP-partial sums to complete: the routed experts' where the path leaves them, or the
    # shared experts' where the model shards them over TP.
    shared_partial = sc.shared_experts and not sc.sequence_parallel and \
        integrations.get(sc.integration).traits(sc).shared_tp_sharded
    pending = sc.parts_partial or shared_partial
    for rank, events in sorted(logs.items()):
        tp_group = sc.layout.group_of("tp", rank)
        current, reduces = None, 0
        for e in events:
            if isinstance(e, ForwardStart):
                current, reduces = e, 0
                if e.reduced != reduced:
                    f.add(f"rank {rank} pass {e.pass_index} layer {e.layer}: output_is_reduced() is {e.reduced}, "
                          f"but the {sc.path} path's finalize " + ("already sums every expert rank's contribution"
                                                                   if reduced else "leaves TP-partial sums"))
            elif isinstance(e, Collective) and current and e.op == "all_reduce" and e.group == tp_group:
                reduces += 1
            elif isinstance(e, ForwardEnd) and current:
                expected = 1 if pending and tp > 1 else 0
                if reduces != expected:
                    f.add(f"rank {rank} pass {e.pass_index} layer {e.layer}: {reduces} TP all_reduce call(s); the "
                          f"{sc.path} path{' under sequence parallel' if sc.sequence_parallel else ''}"
                          f"{' with TP-sharded shared experts' if shared_partial else ''} needs "
                          f"{expected} (output_is_reduced() = {current.reduced})")
                current = None
    f.close()


def _finalize(sc: Scenario, logs, v: Verdict) -> None:
    f = _Findings(v, "finalize")
    for rank, events in sorted(logs.items()):
        coords = sc.layout.coords(rank)
        where, calls = None, []
        for e in events:
            if isinstance(e, ForwardStart):
                layer = sc.stages[coords.pp_rank][e.layer]
                tokens = sc.tokens(e.pass_index, layer, coords.dp_rank)
                want = sc.defers(layer.fmt, tokens)
                where, calls = f"rank {rank} pass {e.pass_index} layer {e.layer} ({tokens} tokens)", []
            elif isinstance(e, ExpertsCall) and where:
                calls.append(e.defer)
            elif isinstance(e, ForwardEnd) and where:
                # Where no DP rank has a token, nothing reaches any expert and a kernel may skip them.
                idle = not any(sc.tokens(e.pass_index, layer, d) for d in range(sc.layout.dp))
                if calls != [want] and not (idle and not calls):
                    f.add(f"{where}: the experts were asked to defer finalize {calls} (one call per forward); "
                          f"expected [{want}]: deferral needs --defer-finalize, expert parallel off, TP > 1, "
                          "tokens on the rank and a kernel that can stop after GEMM2")
                where = None
    f.close()


def _expert_output(sc: Scenario, logs, v: Verdict) -> None:
    if not integrations.get(sc.integration).traits(sc).expert_output_by_scenario:
        return
    f = _Findings(v, "expert-output")
    want = sc.expert_output == "workspace"
    for rank, events in sorted(logs.items()):
        for e in events:
            got = (e.region if isinstance(e, ExpertsCall) else e.resident if isinstance(e, Combine) else None)
            if got is not None and got != want:
                what = "the experts were handed" if isinstance(e, ExpertsCall) else "combine ran with"
                f.add(f"rank {rank}: {what} {'the combine region' if isinstance(e, ExpertsCall) else 'payload_in_workspace'}"
                      f" = {got} with --expert-output {sc.expert_output}")
                break
    f.close()


def _probe(sc: Scenario, logs, v: Verdict) -> None:
    if sc.path != "one_sided" and sc.api != "moe_ep" or not integrations.get(sc.integration).traits(sc).combine_output:
        return
    f = _Findings(v, "probe")
    takes = sc.combine_takes_output()
    for rank, events in sorted(logs.items()):
        for e in events:
            if isinstance(e, Combine) and e.output != takes:
                f.add(f"rank {rank}: combine {'got' if e.output else 'did not get'} output= although the "
                      f"combine ({sc.combine_signature} signature, FlashInfer {sc.profile}) "
                      f"{'takes' if takes else 'does not take'} it by keyword")
                break
    f.close()


def _runtime_max_tokens(sc: Scenario, logs, v: Verdict) -> None:
    if sc.path != "one_sided" and sc.api != "moe_ep":
        return
    f = _Findings(v, "runtime-max-tokens")
    for rank, events in sorted(logs.items()):
        stage = _stage(sc, rank)
        want, rounds = None, Counter()
        for e in events:
            if isinstance(e, ForwardStart):
                layer = sc.stages[stage][e.layer]
                split = sc.layout.tp if sc.splits_tokens else 1
                want = max(1, max(-(-sc.tokens(e.pass_index, layer, d) // split) for d in range(sc.layout.dp)))
                rounds = Counter()
                where = f"rank {rank} pass {e.pass_index} layer {e.layer}"
            elif isinstance(e, (Dispatch, Combine)) and want is not None:
                rounds[e.kind] += 1
                if e.runtime_max is not None and e.runtime_max != want:
                    f.add(f"{where}: {e.kind} with runtime_max_tokens_per_rank {e.runtime_max}; the dispatching ranks' "
                          f"largest token count is {want} (every EP rank must pass the same value)")
            elif isinstance(e, ForwardEnd) and rounds != Counter(dispatch=1, combine=1):
                f.add(f"{where}: {rounds['dispatch']} dispatch(es) and {rounds['combine']} combine(s) in one "
                      f"forward, expected one of each")
    f.close()


def _round_ordering(sc: Scenario, logs, v: Verdict) -> None:
    f = _Findings(v, "round-ordering")
    for rank, events in sorted(logs.items()):
        ep = set(sc.layout.group_of("ep", rank))
        last: dict = {}  # workspace -> the combine offset of its previous round
        # A MoeAlltoAll build -> its workspace (MoeAlltoAlls of one size share one); a moe_ep
        # communication logs no build and is its own.
        workspace: dict[int, tuple] = {}
        ordered, where = True, None
        for e in events:
            if isinstance(e, AlltoallBuilt):
                workspace[e.index] = ("workspace", e.workspace)
            elif isinstance(e, ForwardStart):
                where = f"pass {e.pass_index} layer {e.layer}"
            elif isinstance(e, Combine):
                ordered = False
            elif isinstance(e, Collective) and e.op not in A2A_OPS and ep <= set(e.group):
                ordered = True
            elif isinstance(e, Dispatched):
                key = workspace.get(e.build, ("communication", e.build))
                before = last.get(key)
                if before is not None and not ordered and e.combine_offset > before:
                    f.add(f"rank {rank} {where}: this round's dispatch payloads end at byte {e.combine_offset} of "
                          f"the workspace row, past byte {before} where the previous round's combine region starts, "
                          "with no collective of every EP rank between the rounds: a peer still reading its combine "
                          "output can be overwritten (the cross-round race, docs/findings.md FI-RACE)")
                last[key] = e.combine_offset
            elif isinstance(e, WorkspaceWritten):
                f.add(f"rank {rank} {where}: it wrote into the workspace of all-to-all build {e.build} after a round's "
                      "combine and before the next dispatch: FlashInfer hands its buffers for one round (valid only "
                      "between dispatch and combine), and a peer still reading that round can be overwritten")
    f.close()


def _arguments(logs, v: Verdict) -> None:
    f = _Findings(v, "arguments")
    seen = set()
    for rank, events in sorted(logs.items()):
        for e in events:
            if not isinstance(e, ArgumentRefused) or (e.call, e.param, e.site) in seen:
                continue
            seen.add((e.call, e.param, e.site))
            rule = e.expected
            said = f"{type(ast.literal_eval(rule[1:])).__name__} there (its default is {rule[1:]})" \
                if rule.startswith("=") else f"{rule} there (its annotation)"
            f.add(f"rank {rank}: {e.call}({e.param}={e.value}) from {e.site}: the release takes {said}")
    f.close()


def _setup_calls(sc: Scenario, logs, v: Verdict) -> None:
    from testbed.contract.setup_calls import expected, matches

    f = _Findings(v, "setup-calls")
    pattern = expected(sc.profile)
    for rank, events in sorted(logs.items()):
        for n, e in enumerate(ev for ev in events if isinstance(ev, MnnvlSetup)):
            if not matches(pattern, e.calls, first=n == 0):
                f.add(f"rank {rank}: MNNVL set-up {n + 1} called the communicator's {', '.join(e.calls)}; "
                      f"FlashInfer {sc.profile}'s open_mnnvl_memory calls {', '.join(pattern)}")
    f.close()


def _output(sc: Scenario, results: list[dict], v: Verdict) -> None:
    f = _Findings(v, "output")
    refs: dict[tuple, list[torch.Tensor]] = {}
    per_layer: dict[str, float] = {}
    for rank, res in enumerate(results):
        coords = sc.layout.coords(rank)
        stage = coords.pp_rank
        expected = {(p, i) for p in range(len(sc.passes)) for i in range(len(sc.stages[stage]))}
        if set(res["outputs"]) != expected or set(res["lanes"]) != expected:
            f.add(f"rank {rank} returned outputs for (pass, layer) {sorted(res['outputs'])}, expected "
                  f"{sorted(expected)}")
        for (p, i), out in sorted(res["outputs"].items()):
            key = (p, stage, i)
            if key not in refs:
                refs[key] = reference_outputs(sc, *key)
            ref = refs[key][coords.dp_rank]
            fmt = sc.stages[stage][i].fmt
            label = f"s{stage} l{i} p{p}"
            if out.shape != ref.shape:
                f.add(f"rank {rank} pass {p} layer {i} ({fmt}): output shape {tuple(out.shape)}, "
                      f"reference {tuple(ref.shape)}")
                continue
            if not ref.numel():
                continue
            scale = tolerance(sc, fmt) * max(1.0, ref.abs().max().item())
            err = (out.float() - ref).abs().max().item() / scale
            err = float("inf") if err != err else err
            per_layer[label] = max(per_layer.get(label, 0.0), err)
            v.worst = max(v.worst, err)
            if err > 1.0:
                factor = (out.float() * ref).sum().item() / max((ref * ref).sum().item(), 1e-30)
                f.add(f"rank {rank} pass {p} layer {i} ({fmt}): max |output - reference| is {err:.3g} x the "
                      f"tolerance; output ~ {factor:.3g} x the reference")
    v.layer_errors = sorted(per_layer.items())
    f.close()


def _expert_load(sc: Scenario, results: list[dict], v: Verdict) -> None:
    f = _Findings(v, "expert-load")
    pads = sc.sequence_parallel and integrations.get(sc.integration).traits(sc).sp_pads_routed
    for rank, res in enumerate(results):
        coords = sc.layout.coords(rank)
        for (p, i), got in sorted(res["lanes"].items()):
            want = expected_expert_rows(sc, p, coords.pp_rank, i, coords.ep_rank if sc.ep_size > 1 else 0,
                                        pads, res["weights_scale"][i])
            if got != want:
                extra, missing = got - want, want - got
                f.add(f"rank {rank} pass {p} layer {i}: the experts computed {sum(got.values())} lanes, "
                      f"{sum(want.values())} were routed to them ({sum(extra.values())} extra, e.g. experts "
                      f"{sorted({e for e, _ in extra})[:4]}; {sum(missing.values())} missing, e.g. experts "
                      f"{sorted({e for e, _ in missing})[:4]})")
    f.close()
