"""FlashInfer's ``MoeAlltoAll`` recorded: each construction (capacity, workspace), each dispatch and
combine as a collective of the EP group (which they are: every rank waits for every peer's flags),
where each round put its combine region and the writes into a workspace between rounds (the
fake's, from its hooks; a real one's through its public methods); and the combine signatures no
release has, which a scenario can give the fake's."""

from __future__ import annotations

import functools
import inspect
import itertools

from testbed.harness import audit
from testbed.scenario.events import (
    AlltoallBuilt,
    Collective,
    Combine,
    Dispatch,
    Dispatched,
    EventLog,
    WorkspaceWritten,
)


def recording_moe_alltoall(log: EventLog, ep_ranks: tuple[int, ...]):
    """Log the fake's ``MoeAlltoAll`` constructions and, as collectives of the EP group, its
    dispatches and combines, where each round put its combine region, and the writes into a
    workspace between rounds (from the fake's own hooks, :mod:`fakes.observe`); returns what
    stops it."""
    from fakes import observe

    builds: dict[int, int] = {}  # id(alltoall) -> its build number (an alltoall lives for the scenario)

    def listener(event: str, alltoall=None, owner=None, **fields) -> None:
        if event == "moe_alltoall_built":
            builds[id(alltoall)] = index = len(builds) + 1
            log.write(AlltoallBuilt(index=index, max_num_tokens=alltoall.max_num_tokens,
                                    workspace_size=alltoall.workspace_size_per_rank, top_k=alltoall.top_k,
                                    num_experts=alltoall.num_experts, workspace=alltoall.workspace.data_ptr()))
        elif event == "moe_alltoall_dispatch":
            log.write(Collective(op="moe_a2a_dispatch", group=tuple(ep_ranks), site=audit.integration_call_site()))
            log.write(Dispatch(runtime_max=fields["runtime_max"], tokens=fields["tokens"]))
        elif event == "moe_alltoall_dispatched":
            log.write(Dispatched(build=builds[id(alltoall)], combine_offset=fields["combine_offset"]))
        elif event == "moe_alltoall_combine":
            log.write(Combine(build=builds[id(alltoall)], output=fields["output"], runtime_max=fields["runtime_max"],
                              resident=fields["resident"]))
            log.write(Collective(op="moe_a2a_combine", group=tuple(ep_ranks), site=audit.integration_call_site()))
        elif event == "workspace_written" and id(owner) in builds:
            log.write(WorkspaceWritten(build=builds[id(owner)]))

    return observe.listen(listener)


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


def recording_public_moe_alltoall(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    """A real ``MoeAlltoAll`` logging what :func:`recording_moe_alltoall` logs of the fake's,
    through its public ``dispatch`` and ``combine`` (the real one has no hooks, so no combine
    offsets and no writes between rounds); the probe sees their signatures through
    ``__wrapped__``."""
    builds = itertools.count(1)
    dispatch_sig, combine_sig = inspect.signature(base.dispatch), inspect.signature(base.combine)
    # The payload's residency flag: in every release, combine's parameter after the step size.
    names = list(combine_sig.parameters)
    resident_flag = names[names.index("runtime_max_tokens_per_rank") + 1]

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._testbed_build = next(builds)
        log.write(AlltoallBuilt(index=self._testbed_build, max_num_tokens=self.max_num_tokens, workspace_size=self.workspace_size_per_rank, top_k=self.top_k, num_experts=self.num_experts, workspace=self.workspace.data_ptr()))

    @functools.wraps(base.dispatch)
    def dispatch(self, *args, **kwargs):
        given = dispatch_sig.bind(self, *args, **kwargs).arguments
        log.write(Collective(op="moe_a2a_dispatch", group=tuple(ep_ranks), site=audit.integration_call_site()))
        log.write(Dispatch(runtime_max=given["runtime_max_tokens_per_rank"], tokens=given["token_selected_experts"].size(0)))
        return base.dispatch(self, *args, **kwargs)

    @functools.wraps(base.combine)
    def combine(self, *args, **kwargs):
        given = combine_sig.bind(self, *args, **kwargs).arguments
        log.write(Combine(build=self._testbed_build, output=given.get("output") is not None, runtime_max=given["runtime_max_tokens_per_rank"], resident=bool(given.get(resident_flag))))
        log.write(Collective(op="moe_a2a_combine", group=tuple(ep_ranks), site=audit.integration_call_site()))
        return base.combine(self, *args, **kwargs)

    return type("MoeAlltoAll", (base,), {"__init__": __init__, "dispatch": dispatch, "combine": combine})
