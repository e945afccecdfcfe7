"""The fake's EP mapping and communicator for tests and benchmarks that drive the fake
directly (the communicator is the integration's own, from ``impl``)."""

from __future__ import annotations

from fakes.flashinfer.comm.mapping import Mapping
from fakes.flashinfer.comm.mnnvl import MnnvlConfig
from testbed.scenario.rank import resolve_backend
from impl.communicator import make_communicator


def ep_mapping_and_config(ctx) -> tuple[Mapping, MnnvlConfig]:
    """FlashInfer's view of this rank's EP group, built as vLLM builds it
    (``tp_size = moe_ep_size = ep_size``), with a communicator over that group."""
    R, me = ctx.layout.ep_size, ctx.coords.ep_rank
    mapping = Mapping(world_size=R, rank=me, tp_size=R, moe_ep_size=R)
    return mapping, MnnvlConfig(comm_backend=make_communicator(resolve_backend("fake"), ctx.groups["ep"]))
