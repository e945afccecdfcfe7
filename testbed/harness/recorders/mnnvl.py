"""The two-sided ``MnnvlMoe``'s exchanges recorded as collectives of the EP group, and the
communicator calls each of the fake's MNNVL set-ups makes."""

from __future__ import annotations

from testbed.contract.setup_calls import COMM_METHODS
from testbed.harness import audit
from testbed.scenario.events import Collective, EventLog, MnnvlSetup


def recording_mnnvl_moe(base: type, log: EventLog, ep_ranks: tuple[int, ...]) -> type:
    """``MnnvlMoe`` logging its exchanges as collectives of the EP group."""
    def logged(name):
        fn = getattr(base, name)

        def call(*args, **kwargs):
            log.write(Collective(op=name, group=tuple(ep_ranks), site=audit.integration_call_site()))
            return fn(*args, **kwargs)

        return staticmethod(call)

    names = ("mnnvl_moe_alltoallv_prepare_without_allgather", "mnnvl_moe_alltoallv", "mnnvl_moe_alltoallv_combine")
    return type("MnnvlMoe", (base,), {name: logged(name) for name in names})


def recording_mnnvl_setup(log: EventLog) -> callable:
    """Log the communicator calls each of the fake's MNNVL set-ups makes (``setup-calls``), as
    the fake tells them (:mod:`fakes.observe`); returns what stops it."""
    from fakes import observe

    def listener(event: str, calls=(), **_) -> None:
        if event == "mnnvl_setup":
            log.write(MnnvlSetup(calls=tuple(name for name in calls if name in COMM_METHODS)))

    return observe.listen(listener)
