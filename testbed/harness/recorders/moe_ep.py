"""``flashinfer.moe_ep``'s communications recorded: their creation (capacity, workspace bytes, the
dispatch row), dispatches and combines as ``MoeAlltoAll``'s are."""

from __future__ import annotations

import functools
import itertools

from testbed.harness import audit
from testbed.harness.recorders.alltoall import log_dispatched
from testbed.scenario.events import Collective, Combine, CommunicationBuilt, Dispatch, EventLog


def recording_communication(create, log: EventLog, ep_ranks: tuple[int, ...]):
    """``moe_ep.create_communication`` whose communications log their construction (token
    capacity and workspace bytes per rank), and their dispatches and combines as ``MoeAlltoAll``'s
    do (the probe reads the real signatures through ``__wrapped__``)."""
    builds = itertools.count(1)

    def create_communication(bootstrap, params, backend, **options):
        comm = create(bootstrap, params, backend, **options)
        comm._testbed_build = next(builds)
        extra = getattr(getattr(comm, "config", None), "extra_payload_bytes_per_token", 0) or 0
        log.write(CommunicationBuilt(index=comm._testbed_build, backend=comm.backend_name, max_num_tokens=params.max_tokens_per_rank, top_k=params.top_k, num_experts=params.num_experts, workspace_size=_workspace_bytes(comm), hidden=params.hidden_size, row_bytes=params.dispatch_bytes_per_token + extra))
        comm.__class__ = _recording_communication_class(type(comm), log, ep_ranks)
        return comm

    return create_communication


def _workspace_bytes(comm) -> int:
    """Bytes per rank of the fake communication's (main) workspace: 0.7.4's one-sided layout,
    0.7.2's ``MoeAlltoAll``, or the two-sided FIFO."""
    if hasattr(comm, "metainfo"):
        return int(comm.metainfo[comm._index.WORKSPACE_SIZE_INDEX])
    if hasattr(comm, "alltoall"):
        return comm.alltoall.workspace_size_per_rank
    return comm._workspace.size(1) * comm._workspace.element_size()


def _recording_communication_class(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    @functools.wraps(base.dispatch)
    def dispatch(self, hidden_states, topk_ids, *args, **kwargs):
        result_kw = kwargs.get("runtime_max_tokens_per_rank", kwargs.get("max_tokens_per_rank"))
        log.write(Collective(op="moe_ep_dispatch", group=tuple(ep_ranks), site=audit.integration_call_site()))
        log.write(Dispatch(runtime_max=result_kw, tokens=topk_ids.size(0), build=self._testbed_build))
        result = base.dispatch(self, hidden_states, topk_ids, *args, **kwargs)
        log_dispatched(log, self._testbed_build, getattr(self, "_alltoall", None))
        return result

    @functools.wraps(base.get_combine_input_buffer)
    def get_combine_input_buffer(self, dtype):
        self._testbed_buffer = base.get_combine_input_buffer(self, dtype)
        return self._testbed_buffer

    @functools.wraps(base.combine)
    def combine(self, expert_output, *args, **kwargs):
        buffer, self._testbed_buffer = getattr(self, "_testbed_buffer", None), None
        # moe_ep's combine takes no step size: it runs with its dispatch's (rtm None)
        log.write(Combine(build=self._testbed_build, output=kwargs.get("output") is not None, runtime_max=None, in_workspace=buffer is not None and expert_output.data_ptr() == buffer.data_ptr()))
        log.write(Collective(op="moe_ep_combine", group=tuple(ep_ranks), site=audit.integration_call_site()))
        return base.combine(self, expert_output, *args, **kwargs)

    return type(base.__name__, (base,), {"dispatch": dispatch, "combine": combine,
                                         "get_combine_input_buffer": get_combine_input_buffer})
