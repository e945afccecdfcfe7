"""What a scenario's rank runs on, whichever integration drives it: its FlashInfer (the fake
as a release, or this machine's real one), its device, a layer's activation quantization as
vLLM configures it, and the testbed's per-forward DP token-count exchange."""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from impl import backend as impl_backend
from impl.backend import FlashInferAPI
from impl.formats import FP8_BLOCK, FP8_DTYPE, QuantConfig
from testbed.scenario.events import Collective
from testbed.scenario.reference import NVFP4_GLOBAL_SCALE


BACKENDS = ("fake", "flashinfer")


def resolve_backend(name: str, *, profile: str | None = None) -> FlashInferAPI:
    """impl's FlashInfer API of ``name``: ``"fake"`` (the CPU fake, as release ``profile``; None
    keeps its active profile) or ``"flashinfer"`` (the installed package); ValueError otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "flashinfer":
        if profile is not None:
            raise ValueError(f"profile={profile!r} applies to the fake backend only; "
                             "the real FlashInfer is whatever release is installed")
        return impl_backend.resolve_backend("flashinfer")
    import fakes.flashinfer

    if profile is not None:
        fakes.flashinfer.set_profile(profile)
    return impl_backend.resolve_backend("fake", root=fakes.flashinfer)


def quant_config(fmt: str, mx_alignment: int = 0) -> QuantConfig:
    """A layer's activation quantization as vLLM configures it (nvfp4: the calibrated global
    scale of the testbed's inputs)."""
    if fmt == "bf16":
        return QuantConfig()
    if fmt == "nvfp4":
        return QuantConfig("nvfp4", a1_gscale=torch.tensor(NVFP4_GLOBAL_SCALE))
    if fmt == "mxfp8":
        return QuantConfig("mxfp8", mx_alignment=mx_alignment)
    return QuantConfig(FP8_DTYPE, block_shape=(FP8_BLOCK, FP8_BLOCK))


def logged_token_counts(ctx, log, num_tokens: int, site: str) -> list[int]:
    """:func:`forward_pass_token_counts` on this rank's EP group, logged as a collective of it
    at ``site`` (a rank that skipped an all-to-all is then out of step with its peers at once,
    not at the timeout)."""
    log.write(Collective("forward_token_counts", tuple(ctx.group_ranks["ep"]), site))
    return forward_pass_token_counts(ctx.groups["ep"], ctx.coords.dp_rank, ctx.layout.dp, num_tokens)


def forward_pass_token_counts(ep_group: dist.ProcessGroup, dp_rank: int, dp_size: int, num_tokens: int) -> list[int]:
    """Start a forward pass: every EP rank shares its token count; returns one per DP rank.

    This stands in for vLLM's per-forward DP metadata exchange (plus the TP collectives of
    attention), which orders every rank's previous forward before this one. It matters:
    FlashInfer's protocol has no completion wait after combine, and the next dispatch's
    payload region can reach into the previous round's combine region when the payload
    per token grows (nvfp4 layer, then bf16 layer), so back-to-back rounds of different
    sizes with nothing between them race (the fake shows it under CPU timing).
    """
    # As vLLM's DP metadata: each rank fills its DP rank's slot and an all-reduce (MAX: the TP
    # ranks of a DP rank write the same count) fills the rest; gloo's all-reduce of a small
    # tensor takes log(ranks) steps where its all-gather takes a ring of them.
    counts = torch.zeros(dp_size, dtype=torch.long)
    counts[dp_rank] = num_tokens
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=ep_group)
    return counts.tolist()


def rank_api(ctx, backend: str, profile: str = "0.7.2", slot_order: str = "shuffled"):
    """The FlashInfer ``backend`` names, on this rank; for the fake, release ``profile`` and
    ``slot_order`` (seeded with the scenario's seed) until the scenario ends."""
    if backend != "fake":
        return resolve_backend(backend)
    scenario = contextlib.ExitStack()
    ctx.add_cleanup(scenario.close)
    return scenario.enter_context(fake_release(profile, slot_order, ctx.seed))


@contextlib.contextmanager
def fake_release(profile: str, slot_order: str, seed: int):
    """The fake's API imitating release ``profile``, its slots in ``slot_order`` seeded with
    ``seed``, inside the block; the profile and slot order set before, after it."""
    from fakes.flashinfer.comm import moe_a2a_kernels as kernels
    from fakes.flashinfer.profiles import fake_profile

    before = kernels.SlotOrder.mode, kernels.SlotOrder.seed
    with fake_profile(profile):
        kernels.SlotOrder.mode, kernels.SlotOrder.seed = slot_order, seed
        try:
            yield resolve_backend("fake", profile=profile)
        finally:
            kernels.SlotOrder.mode, kernels.SlotOrder.seed = before


def rank_device(ctx, backend: str) -> torch.device:
    """Where this rank's tensors live: the CPU for the fake, else this rank's GPU (made current);
    the CPU on a machine without CUDA, where ``flashinfer`` can only be the fake under its real
    name (``fakes.flashinfer.install``)."""
    if backend == "fake" or not torch.cuda.is_available():
        return torch.device("cpu")
    # A launched rank (torchrun, possibly one of several nodes) has its node's LOCAL_RANK.
    index = int(os.environ.get("LOCAL_RANK", ctx.rank)) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
