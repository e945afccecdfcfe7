"""``flashinfer.moe_ep``'s communications recorded: their creation (capacity, workspace bytes, the
dispatch row), dispatches and combines as ``MoeAlltoAll``'s are; for the fake's, where each round
put its combine region and the writes into a workspace between rounds, from its hooks."""

from __future__ import annotations

import functools
import itertools

from testbed.harness import audit
from testbed.scenario.events import (
    Collective,
    Combine,
    CommunicationBuilt,
    Dispatch,
    Dispatched,
    EventLog,
    WorkspaceWritten,
)


def recording_communication(create, log: EventLog, ep_ranks: tuple[int, ...], cleanup):
    """``moe_ep.create_communication`` whose communications log their construction (token
    capacity and workspace bytes per rank), and their dispatches and combines as ``MoeAlltoAll``'s
    do (the probe reads the real signatures through ``__wrapped__``). The fake's tell their
    workspace bytes, combine offsets and writes between rounds through :mod:`fakes.observe`
    (listened to until ``cleanup`` runs); a real one's workspace bytes are its public
    ``workspace``'s, where it has one."""
    from fakes import observe

    builds = itertools.count(1)
    told: dict[int, int] = {}  # id(communication) -> the workspace bytes the fake told
    index: dict[int, int] = {}  # id(communication, or the MoeAlltoAll under 0.7.2's) -> its build

    def listener(event: str, communication=None, owner=None, **fields) -> None:
        if event == "communication_built":
            told[id(communication)] = fields["workspace_bytes"]
        elif event == "communication_dispatched":
            log.write(Dispatched(build=index[id(communication)], combine_offset=fields["combine_offset"]))
        elif event == "workspace_written" and id(owner) in index:
            log.write(WorkspaceWritten(build=index[id(owner)]))

    cleanup(observe.listen(listener))

    def create_communication(bootstrap, params, backend, **options):
        comm = create(bootstrap, params, backend, **options)
        comm._testbed_build = build = next(builds)
        index[id(comm)] = build
        inner = getattr(type(comm), "alltoall", None)  # 0.7.2's one-sided: the MoeAlltoAll it drives (public)
        if inner is not None:
            index[id(comm.alltoall)] = build
        extra = getattr(getattr(comm, "config", None), "extra_payload_bytes_per_token", 0) or 0
        log.write(CommunicationBuilt(index=build, backend=comm.backend_name, max_num_tokens=params.max_tokens_per_rank, top_k=params.top_k, num_experts=params.num_experts, workspace_size=told.pop(id(comm), None) or _public_workspace_bytes(comm), hidden=params.hidden_size, row_bytes=params.dispatch_bytes_per_token + extra))
        comm.__class__ = _recording_communication_class(type(comm), log, ep_ranks)
        return comm

    return create_communication


def _public_workspace_bytes(comm) -> int:
    """Bytes per rank of a real communication's public ``workspace`` (0 where it has none)."""
    workspace = getattr(comm, "workspace", None)
    return 0 if workspace is None else workspace.size(1) * workspace.element_size()


def _recording_communication_class(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    @functools.wraps(base.dispatch)
    def dispatch(self, hidden_states, topk_ids, *args, **kwargs):
        result_kw = kwargs.get("runtime_max_tokens_per_rank", kwargs.get("max_tokens_per_rank"))
        log.write(Collective(op="moe_ep_dispatch", group=tuple(ep_ranks), site=audit.integration_call_site()))
        log.write(Dispatch(runtime_max=result_kw, tokens=topk_ids.size(0), build=self._testbed_build))
        return base.dispatch(self, hidden_states, topk_ids, *args, **kwargs)

    @functools.wraps(base.get_combine_input_buffer)
    def get_combine_input_buffer(self, dtype):
        self._testbed_buffer = base.get_combine_input_buffer(self, dtype)
        return self._testbed_buffer

    @functools.wraps(base.combine)
    def combine(self, expert_output, *args, **kwargs):
        buffer, self._testbed_buffer = getattr(self, "_testbed_buffer", None), None
        # moe_ep's combine takes no step size: it runs with its dispatch's (rtm None)
        log.write(Combine(build=self._testbed_build, output=kwargs.get("output") is not None, runtime_max=None, resident=buffer is not None and expert_output.data_ptr() == buffer.data_ptr()))
        log.write(Collective(op="moe_ep_combine", group=tuple(ep_ranks), site=audit.integration_call_site()))
        return base.combine(self, expert_output, *args, **kwargs)

    return type(base.__name__, (base,), {"dispatch": dispatch, "combine": combine,
                                         "get_combine_input_buffer": get_combine_input_buffer})
