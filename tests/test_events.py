"""The event log's wire form: every kind reads back as the event written, and a line whose kind
or fields are not an event's fails instead of reading as None."""

from __future__ import annotations

import dataclasses
import json

import pytest

from testbed.scenario import events as ev

SAMPLES = (
    ev.Collective("barrier", (0, 2), "impl/one_sided.py:1 in f"),
    ev.AlltoallBuilt(1, 8, 1 << 20, 2, 8, 12345),
    ev.CommunicationBuilt(1, "nvlink_one_sided", 8, 2, 8, 1 << 20, 256, 520),
    ev.Dispatch(4, 3), ev.Dispatch(None, 0, build=2),
    ev.Dispatched(1, 1024),
    ev.WorkspaceWritten(1),
    ev.Combine(1, True, None, False),
    ev.ArgumentRefused("flashinfer.comm.Mapping", "gpus_per_node", "<function f>", "int", "vllm/x.py:1 in g"),
    ev.MnnvlSetup(("Get_rank", "allgather")),
    ev.ExpertsCall(False, True),
    ev.SharedMemoryCreated("/psm_1"),
    ev.LayerBuilt(0),
    ev.ForwardStart(0, 1, True, False, False),
    ev.ForwardEnd(0, 1),
)


def test_events_every_kind_round_trips_through_its_wire_form(tmp_path):
    assert {type(e) for e in SAMPLES} == set(ev.KINDS.values())
    log = ev.EventLog(str(tmp_path / "rank0.jsonl"))
    for e in SAMPLES:
        log.write(e)
    log.close()
    assert ev.LogTail(str(tmp_path / "rank0.jsonl")).events() == list(SAMPLES)


@pytest.mark.parametrize("e", SAMPLES, ids=lambda e: e.kind)
def test_events_a_renamed_field_fails_to_read(e):
    wire = json.loads(json.dumps(e.wire()))
    first = dataclasses.fields(e)[0].name
    renamed = {("renamed_" + k if k == first else k): v for k, v in wire.items()}
    with pytest.raises(ev.EventFormatError, match=e.kind):
        ev.from_wire(renamed)


def test_events_an_unknown_kind_or_a_non_event_is_refused(tmp_path):
    with pytest.raises(ev.EventFormatError, match="unknown event kind 'colll'"):
        ev.from_wire({"ev": "colll", "op": "barrier", "group": [0], "site": None})
    log = ev.EventLog(str(tmp_path / "log.jsonl"))
    try:
        with pytest.raises(TypeError, match="takes an Event"):
            log.write({"ev": "layer", "layer": 0})
    finally:
        log.close()
