"""FlashInfer's ``MoeAlltoAll`` recorded: each construction (capacity, workspace), each dispatch and
combine as a collective of the EP group (which they are: every rank waits for every peer's flags),
where each round put its combine region; and the combine signatures no release has, which a
scenario can give the fake's."""

from __future__ import annotations

import functools
import inspect
import itertools

from testbed.harness import audit
from testbed.scenario.events import AlltoallBuilt, Collective, Combine, Dispatch, Dispatched, EventLog


def recording_moe_alltoall(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    """``base`` logging its constructions and, as collectives of the EP group (which they
    are: every rank waits for every peer's flags), its dispatches and combines."""
    builds = itertools.count(1)

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **kwargs)
        self._testbed_build = next(builds)
        log.write(AlltoallBuilt(index=self._testbed_build, max_num_tokens=self.max_num_tokens, workspace_size=self.workspace_size_per_rank, top_k=self.top_k, num_experts=self.num_experts, workspace=self.workspace.data_ptr()))

    def _dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank, *args, **kwargs):
        log.write(Collective(op="moe_a2a_dispatch", group=tuple(ep_ranks), site=audit.integration_call_site()))
        log.write(Dispatch(runtime_max=runtime_max_tokens_per_rank, tokens=token_selected_experts.size(0)))
        recv = base._dispatch(self, token_selected_experts, input_payloads, runtime_max_tokens_per_rank,
                              *args, **kwargs)
        log_dispatched(log, self._testbed_build, self)
        return recv

    def _combine(self, payload, runtime_max_tokens_per_rank, *args, **kwargs):
        output = kwargs.get("output", args[3] if len(args) > 3 else None)
        in_workspace = kwargs.get("payload_in_workspace", args[0] if args else False)
        log.write(Combine(build=self._testbed_build, output=output is not None, runtime_max=runtime_max_tokens_per_rank, in_workspace=bool(in_workspace)))
        log.write(Collective(op="moe_a2a_combine", group=tuple(ep_ranks), site=audit.integration_call_site()))
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


def log_dispatched(log: EventLog, build: int, alltoall) -> None:
    """Where the round just dispatched put its combine region in this rank's workspace row
    (the 128-aligned end of its dispatch payloads), for a fake ``MoeAlltoAll``; 0.7.4's own
    moe_ep kernels lay out no such offset and log none."""
    offset = getattr(getattr(alltoall, "_state", None), "combine_payload_offset", None)
    if offset is not None:
        log.write(Dispatched(build=build, combine_offset=int(offset)))


def recording_public_moe_alltoall(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    """A real ``MoeAlltoAll`` logging what :func:`recording_moe_alltoall` logs, through its
    public ``dispatch`` and ``combine`` (the fake's hooks are its own); the probe sees their
    signatures through ``__wrapped__``."""
    builds = itertools.count(1)
    dispatch_sig, combine_sig = inspect.signature(base.dispatch), inspect.signature(base.combine)

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
        log.write(Combine(build=self._testbed_build, output=given.get("output") is not None, runtime_max=given["runtime_max_tokens_per_rank"], in_workspace=bool(given.get("payload_in_workspace"))))
        log.write(Collective(op="moe_a2a_combine", group=tuple(ep_ranks), site=audit.integration_call_site()))
        return base.combine(self, *args, **kwargs)

    return type("MoeAlltoAll", (base,), {"__init__": __init__, "dispatch": dispatch, "combine": combine})
