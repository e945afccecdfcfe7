"""The invariants on hand-made event logs: each failure names itself and its evidence."""

from __future__ import annotations

import pytest
import torch

from fakes.flashinfer.comm import moe_a2a_kernels
from testbed.cluster.layout import ParallelLayout
from testbed.harness import invariants
from testbed.scenario.events import AlltoallBuilt, Combine, Dispatch, Dispatched, ForwardStart, from_wire
from testbed.scenario.model import Layer, Scenario

SC = Scenario.make(layout=ParallelLayout(4, 1, 2, 2), stages=((Layer("bf16", 8),), (Layer("bf16", 8),)),
                   passes=((1, 1),))


def _coll(op, group, site="impl/one_sided.py:1 in f"):
    return {"ev": "coll", "op": op, "group": list(group), "site": site}


def _check(logs):
    """The invariants on ``logs``, whose events may be given in their wire form (a log line's object)."""
    typed = {r: [from_wire(e) if isinstance(e, dict) else e for e in events] for r, events in logs.items()}
    return invariants.check(SC, typed, None, None)


def test_invariant_collectives_names_wrong_group_and_call_site():
    logs = {r: [] for r in range(4)}
    for r in (0, 2):  # stage 0 is ranks 0 and 2; its EP group is (0, 2)
        logs[r] = [_coll("barrier", range(4), "impl/one_sided.py:120 in _barrier_after_build")]
    (f,) = _check(logs).failed("collectives")
    assert "barrier on group [0,1,2,3] from impl/one_sided.py:120 in _barrier_after_build" in f.evidence
    assert "EP group [0,2]" in f.evidence
    assert "collective #1 differs" in f.evidence and "rank 1: nothing more" in f.evidence


def test_invariant_collectives_sequence_mismatch_within_group():
    logs = {0: [_coll("barrier", (0, 2))], 2: [_coll("all_gather_object", (0, 2))], 1: [], 3: []}
    (f,) = _check(logs).failed("collectives")
    assert "group [0,2]: the ranks' collective #1 differs" in f.evidence


@pytest.mark.parametrize("integration", ["impl", "vllm", "sglang"])
def test_invariant_rebuild_must_be_followed_by_ep_barrier(integration):
    """FlashInfer's contract binds every integration alike: before 0.7.1 the caller barriers on
    the EP group after building a MoeAlltoAll; from 0.7.1 the set-up barriers itself."""
    import dataclasses

    build = {"ev": "build", "index": 1, "max_num_tokens": 8, "workspace_size": 1 << 20, "top_k": 2,
             "num_experts": 8, "workspace": 1}
    logs = {0: [build, {"ev": "layer", "layer": 0}], 1: [], 2: [], 3: []}
    typed = {r: [from_wire(e) if isinstance(e, dict) else e for e in events] for r, events in logs.items()}
    for release, needed in (("0.6.18", True), ("0.7.0.post1", True), ("0.7.1", False), ("0.7.2.post1", False)):
        sc = dataclasses.replace(SC, profile=release, integration=integration)
        failed = [f for f in invariants.check(sc, typed, None, None).failed("collectives")
                  if "not followed by a barrier" in f.evidence]
        assert bool(failed) == needed, (release, failed)
    (f,) = invariants.check(dataclasses.replace(SC, profile="0.7.0"), typed, None, None).failed("collectives")
    assert "not followed by a barrier on the EP group [0,2]" in f.evidence and "FlashInfer 0.7.0's" in f.evidence
    logs[0].insert(1, _coll("barrier", (0, 2)))
    logs[2] = [_coll("barrier", (0, 2))]
    typed = {r: [from_wire(e) if isinstance(e, dict) else e for e in events] for r, events in logs.items()}
    assert not invariants.check(dataclasses.replace(SC, profile="0.7.0"), typed, None, None).failed("collectives")


def test_invariant_workspace_reports_cover_shrink_and_builds():
    small = {"ev": "build", "index": 1, "max_num_tokens": 4, "workspace_size": 100, "top_k": 2, "num_experts": 8,
             "workspace": 1}
    logs = {0: [small, _coll("barrier", (0, 2)), {"ev": "layer", "layer": 0}], 1: [], 2: [], 3: []}
    (f,) = _check(logs).failed("workspace")
    assert "does not cover layer 0 (bf16:8)" in f.evidence
    assert "rank 2 built [] but rank 0 of the same EP group built [(4, 100)]" in f.evidence


@pytest.mark.parametrize("budgets, bytes_, expected", [
    ([8, 8, 8], [100, 100, 100], [1, 1, 1]),
    ([8, 16, 4], [100, 10, 100], [1, 2, 2]),  # a larger budget rebuilds even with fewer bytes
    ([8, 8], [100, 400], [1, 2]),
])
def test_invariant_expected_builds_count_strict_increases(budgets, bytes_, expected):
    layers = [Layer("bf16", b) for b in budgets]
    payloads = [b * n * 2 for b, n in zip(budgets, bytes_)]
    assert invariants._expected_builds(2, layers, payloads) == expected


def test_invariant_reduce_and_probe():
    logs = {r: [] for r in range(4)}
    logs[0] = [{"ev": "forward", "pass_index": 0, "layer": 0, "reduced": False, "pending": False, "sp": False},
               {"ev": "forward_end", "pass_index": 0, "layer": 0},
               {"ev": "combine", "build": 1, "output": False, "runtime_max": 1, "resident": False}]
    v = _check(logs)
    (r,) = v.failed("reduce")
    assert "output_is_reduced() is False" in r.evidence
    (p,) = v.failed("probe")  # 0.7.2's combine takes output=
    assert "did not get output=" in p.evidence


def test_slot_order_is_reproducible_and_differs_per_target():
    k = moe_a2a_kernels
    mode, seed = k.SlotOrder.mode, k.SlotOrder.seed
    dest = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(5))
    counts = torch.bincount(dest, minlength=4)

    def per_target(slots):
        return [slots[dest == t].tolist() for t in range(4)]

    try:
        k.SlotOrder.mode, k.SlotOrder.seed = "shuffled", 11
        first = per_target(k.send_slots(dest, counts, 0, 1))
        assert [sorted(s) for s in first] == [list(range(int(n))) for n in counts]
        assert per_target(k.send_slots(dest, counts, 0, 1)) == first
        assert len({tuple(s) for s in first}) == 4  # each target its own order
        assert all(s != sorted(s) for s in first)
        assert per_target(k.send_slots(dest, counts, 0, 2)) != first  # and each round
        assert per_target(k.send_slots(dest, counts, 1, 1)) != first  # and each source
        k.SlotOrder.seed = 12
        assert per_target(k.send_slots(dest, counts, 0, 1)) != first
        k.SlotOrder.mode = "deterministic"
        assert per_target(k.send_slots(dest, counts, 0, 1)) == [list(range(int(n))) for n in counts]
    finally:
        k.SlotOrder.mode, k.SlotOrder.seed = mode, seed


def _rounds(offsets, between=None):
    """Rank 0's rounds on build 1 with these combine offsets; ``between`` an event after each combine."""
    events = [{"ev": "forward", "pass_index": 0, "layer": 0, "reduced": True, "pending": False, "sp": False}]
    for offset in offsets:
        events += [{"ev": "dispatch", "runtime_max": 1, "tokens": 1}, {"ev": "dispatched", "build": 1, "combine_offset": offset},
                   {"ev": "combine", "build": 1, "output": False, "runtime_max": 1, "resident": False}]
        if between:
            events.append(between)
    return {0: events, 1: [], 2: [], 3: []}


def test_invariant_round_ordering_flags_a_growing_round_with_nothing_between():
    (f,) = _check(_rounds([1024, 2048])).failed("round-ordering")
    assert "end at byte 2048" in f.evidence and "past byte 1024" in f.evidence and "FI-RACE" in f.evidence
    assert not _check(_rounds([2048, 1024])).failed("round-ordering")  # a smaller round stays before it
    assert not _check(_rounds([1024, 1024])).failed("round-ordering")
    assert not _check(_rounds([1024, 2048], _coll("all_reduce", (0, 2), "testbed"))).failed("round-ordering")
    # the all-to-all's own rounds and a collective of part of the EP group order nothing
    assert _check(_rounds([1024, 2048], _coll("moe_ep_combine", (0, 2)))).failed("round-ordering")
    assert _check(_rounds([1024, 2048], _coll("barrier", (0,)))).failed("round-ordering")


@pytest.mark.parametrize("profile, calls, first, ok", [
    ("0.7.2", ["Get_rank", "Get_size", "allgather", "allgather", "Get_size", "Get_rank", "Get_size", "allgather"],
     True, True),
    ("0.7.2", ["Get_rank", "Get_size", "allgather", "Get_rank", "Get_size", "allgather"], False, True),
    ("0.7.2", ["Get_rank", "Get_size", "allgather", "Get_rank", "Get_size", "allgather"], True, False),  # no vote
    ("0.7.2", ["Get_rank", "Get_size", "allgather", "allgather", "Get_rank", "Get_size", "allgather"], False, False),
    ("0.6.8", ["Get_rank", "Get_size", "allgather", "allgather"], True, True),
    ("0.6.8", ["Get_rank", "Get_size", "bcast", "barrier", "allgather", "barrier"], True, False),  # the old fake's
    ("0.7.4", ["Get_rank", "Get_size", "allgather", "allgather", "Get_rank", "Get_size", "allgather", "allgather",
               "allgather"], False, True),
])
def test_setup_calls_match_the_release_pattern(profile, calls, first, ok):
    from testbed.contract.setup_calls import expected, matches

    assert matches(expected(profile), calls, first) is ok


def test_invariant_setup_calls_names_rank_and_calls():
    good = ["Get_rank", "Get_size", "allgather", "allgather", "Get_size", "Get_rank", "Get_size", "allgather"]
    logs = {0: [{"ev": "mnnvl_setup", "calls": good}],
            1: [{"ev": "mnnvl_setup", "calls": good[:3] + ["barrier"] + good[3:]}]}
    v = _check(logs)
    failures = [f for f in v.failures if f.invariant == "setup-calls"]
    assert len(failures) == 1 and "rank 1: MNNVL set-up 1 called the communicator's Get_rank, Get_size, allgather, " \
                                   "barrier" in failures[0].evidence, v.failures
    assert "FlashInfer 0.7.2's open_mnnvl_memory calls Get_rank, Get_size, allgather, allgather (once)" in \
        failures[0].evidence


def test_invariant_setup_calls_holds_the_fake_to_the_release(cluster, monkeypatch):
    """Every fake scenario logs its set-ups: a release recorded with one more step fails them."""
    from testbed.contract import setup_calls
    from testbed.harness import runner

    sc = Scenario.make(layout=ParallelLayout(2, 1, 2, 1), stages=((Layer("bf16", 4),),), passes=((1, 2),))
    # (that it passes as recorded, every scenario of the suite shows)
    monkeypatch.setitem(setup_calls.SETUP_CALLS, "0.7.2", setup_calls.expected("0.7.2") + ("barrier",))
    v = runner.run(cluster, sc, timeout_s=60)
    assert [f.invariant for f in v.failures] == ["setup-calls"], v.failures


@pytest.mark.parametrize("qualname, call, bad", [
    ("comm.mapping.Mapping.__init__", dict(self=None, world_size=2, rank=0, gpus_per_node=len), ["gpus_per_node"]),
    ("comm.mapping.Mapping.__init__", dict(self=None, world_size=2, rank=0, gpus_per_node=8), []),
    ("comm.trtllm_moe_alltoall.moe_a2a_initialize", dict(workspace=[0], ep_rank=0, ep_size=2, max_num_tokens=4),
     ["workspace"]),  # a list for a tensor
    ("comm.trtllm_moe_alltoall.MoeAlltoAll.dispatch",
     dict(self=None, token_selected_experts=torch.zeros(1, 1), input_payloads=(torch.zeros(1),),
          runtime_max_tokens_per_rank=1, invalid_token_expert_id=None), ["input_payloads"]),
    ("comm.trtllm_moe_alltoall.moe_a2a_combine",
     dict(payload=torch.zeros(1), local_num_tokens=1, workspace=torch.zeros(1), metainfo=torch.zeros(1),
          runtime_max_tokens_per_rank=1, ep_rank=0, ep_size=2, top_k=1, combine_payload_offset=0,
          sf_layout="linear"), ["sf_layout"]),  # another kind for an enum
])
def test_annotations_rule_out_what_the_release_does(qualname, call, bad):
    import inspect

    from fakes.flashinfer import install
    from fakes.flashinfer.annotations import violations
    from testbed.harness.recorders.arguments import _Names, _fake_callable

    with install("0.7.2"):
        module, _, _, raw = _fake_callable(qualname)
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        names = list(inspect.signature(fn).parameters)
        args = [call.pop(n) for n in names if n in call and n == "self"]
        found = violations(qualname, fn, tuple(args), call, _Names(module))
    assert [p for p, _, _ in found] == bad


def test_arguments_checked_on_every_path_a_name_is_exported_by(monkeypatch):
    """The integration's call is checked whether it reaches the quantizer through the root,
    the stub or its home module (each is a path a consumer imports it by)."""
    import os

    from fakes.flashinfer import install
    from testbed.harness import audit
    from testbed.harness.recorders.arguments import recording_arguments

    events, cleanups = [], []

    class Log:
        def write(self, event):
            events.append(event)

    here = os.path.realpath(os.path.dirname(__file__)) + os.sep
    monkeypatch.setattr(audit, "_code", ((here, "tests/"),))  # this file stands for the integration's code
    x = torch.ones(2, 32, dtype=torch.bfloat16)
    with install("0.7.2"):
        recording_arguments("0.7.2", Log(), cleanups.append)
        try:
            import flashinfer
            import flashinfer.fp8_quantization as stub
            from flashinfer.quantization import fp8_quantization as home

            for fn in (flashinfer.mxfp8_quantize, stub.mxfp8_quantize, home.mxfp8_quantize):
                fn(x, is_sf_swizzled_layout="no")  # a str where the release annotates bool
        finally:
            for undo in reversed(cleanups):
                undo()
    assert [(e.param, e.expected) for e in events] == [("is_sf_swizzled_layout", "bool")] * 3, events
    assert all(e.site.startswith("tests/test_invariants.py:") for e in events)


def _two_builds(workspaces):
    """Rank 0: two MoeAlltoAll builds on these workspaces, a round on each, the second larger."""
    events = [AlltoallBuilt(index=i, max_num_tokens=8, workspace_size=1 << 20, top_k=2, num_experts=8, workspace=w)
              for i, w in enumerate(workspaces, 1)]
    events.append(ForwardStart(pass_index=0, layer=0, reduced=True, pending=False, sp=False))
    for build, offset in ((1, 1024), (2, 2048)):
        events += [Dispatch(runtime_max=1, tokens=1), Dispatched(build=build, combine_offset=offset),
                   Combine(build=build, output=False, runtime_max=1, resident=False)]
    return {0: events, 1: [], 2: [], 3: []}


def test_invariant_round_ordering_follows_the_workspace_not_the_build():
    # Two MoeAlltoAlls of one size share FlashInfer's cached workspace (SGLang's layers): the race
    # is between their rounds; on workspaces of their own there is none.
    assert _check(_two_builds([7, 7])).failed("round-ordering")
    assert not _check(_two_builds([7, 8])).failed("round-ordering")


def test_invariant_adapter_setup_error_is_the_testbeds_not_a_failure():
    """A rank whose adapter could not stand the engine up makes the verdict a testbed error:
    no invariant judges it, the report says whose trouble it is, and it is neither PASS nor FAIL."""
    from testbed.cluster.pool import RankFailedError, RankReport
    from testbed.harness import report
    from testbed.integrations.base import AdapterSetupError, adapter_setup

    with pytest.raises(AdapterSetupError, match=r"^building the config: RuntimeError: Failed to infer device type$"):
        with adapter_setup("building the config"):
            raise RuntimeError("Failed to infer device type")
    reports = {0: RankReport(0, 1, "raised", "AdapterSetupError: building the config: RuntimeError: no device (in run)",
                             "Traceback ...", failed_at=2.0),
               1: RankReport(1, 2, "raised", "RuntimeError: connection reset (in run)", "Traceback ...", failed_at=1.0),
               2: RankReport(2, 3, "ok"), 3: RankReport(3, 4, "ok")}
    v = invariants.check(SC, {r: [] for r in range(4)}, None, RankFailedError("rank 1 raised first", reports))
    assert v.status == "ERROR" and not v.passed and not v.failures
    assert v.testbed_error.startswith("rank 0: AdapterSetupError: building the config")
    assert "[testbed error, not a failure of impl]" in report.failure_text(v)
    assert report.counts([v, invariants.Verdict(SC)], 3) == "1 passed, 0 failed, 1 testbed error, 3 not run"
    # A rank that raised anything else is the integration's: a completes failure, as before.
    reports[0] = RankReport(0, 1, "raised", "RuntimeError: boom (in run)", "Traceback ...", failed_at=2.0)
    v = invariants.check(SC, {r: [] for r in range(4)}, None, RankFailedError("rank 1 raised first", reports))
    assert v.status == "FAIL" and v.failed("completes") and not v.testbed_error
