"""Version profiles: what differs between FlashInfer releases that the integration meets.

The active profile decides which signatures ``fakes.flashinfer.comm.trtllm_moe_alltoall``
exposes (so ``inspect.signature`` sees the real shape), the limits the kernels check and
the return forms. Choose it with :func:`set_profile` or ``A2A_FAKE_FLASHINFER_PROFILE``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Profile:
    name: str
    k_max_top_k: int
    k_max_payloads: int
    k_max_ranks: int
    experts_divisible: bool  # num_experts % ep_size == 0 required (E // (E / ep) routing)
    combine_quant_kws: bool  # combine(output_dtype, output_scales, output_scalar_scale, sf_layout)
    combine_output_kw: bool  # combine(output=...), kw-only use_low_precision / active_rank_mask
    eplb_and_rank_mask: bool  # eplb_stats_num_experts, enable_rank_mask; dispatch fn 3-tuple
    backend_kw: bool  # backend="trtllm" keyword (0.7.x)
    top_k_kernels: tuple[int, ...]  # the top_k values SWITCH_TOP_K instantiates (moeAlltoAllKernels.cu)
    init_barrier: bool  # MoeAlltoAll barriers after zeroing its workspace row (0.7.x); before, the caller must
    rank_mask_words: int  # uint64 words of an active-rank mask (kRankMaskWords)
    # Modules under flashinfer the fake does not provide for this release: not shipped, or not
    # imitated (0.6.14/0.6.16's moe_ep is the NCCL-EP/NIXL-EP API, which holds no NVLink class).
    absent_modules: tuple[str, ...]
    # moe_ep's NVLink backends run their own JIT kernels (nvlink_one_sided_alltoall.cu, 0.7.4)
    # instead of wrapping MoeAlltoAll / MnnvlMoe (0.7.2).
    moe_ep_kernels: bool = False


_TOP_K_0_6_8 = (1, 2, 4, 6, 8, 10, 16, 22)
_TOP_K_0_6_16 = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22)
_TOP_K_0_7_4 = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 22)
# 0.7.4 removed the one-sided MoeAlltoAll and the two-sided MnnvlMoe: flashinfer.moe_ep's NVLink
# backends are the only way in, with their own kernels (nvlink_one_sided_alltoall.cu).
_REMOVED_0_7_4 = ("comm.trtllm_moe_alltoall", "comm.trtllm_alltoall")
PROFILES = {
    p.name: p
    for p in (
        Profile("0.6.8", 22, 4, 64, True, False, False, False, False, _TOP_K_0_6_8, False, 1,
                ("moe_ep", "fused_moe.api", "comm.comm_backend")),
        Profile("0.6.14", 22, 6, 64, True, True, False, False, False, _TOP_K_0_6_8, False, 1, ("moe_ep", "comm.comm_backend")),
        Profile("0.6.16", 22, 6, 64, False, True, True, True, False, _TOP_K_0_6_16, False, 1, ("moe_ep",)),
        Profile("0.7.2", 22, 6, 64, False, True, True, True, True, _TOP_K_0_6_16, True, 1, ()),
        Profile("0.7.4", 22, 4, 256, False, True, True, True, True, _TOP_K_0_7_4, True, 4, _REMOVED_0_7_4, True),
    )
}
DEFAULT_PROFILE = "0.7.2"


def set_profile(name: str) -> Profile:
    """Make ``name`` the active profile of this process; returns it."""
    global _active
    if name not in PROFILES:
        raise ValueError(f"unknown FlashInfer profile {name!r}: expected one of {sorted(PROFILES)}")
    _active = PROFILES[name]
    return _active


def active() -> Profile:
    return _active


def removed_module(module: str) -> AttributeError:
    """What reaching into ``module`` (a fake module path) raises under a profile whose release
    does not ship it: the real ``import`` fails, so the fake's names must not serve either."""
    path = module.removeprefix("fakes.flashinfer.")
    return AttributeError(f"flashinfer {_active.name} does not ship flashinfer.{path} "
                          f"(import flashinfer.{path} fails there)")


@contextlib.contextmanager
def fake_profile(name: str) -> Iterator[Profile]:
    """``name`` active inside the block, the previous profile after it."""
    before = _active.name
    try:
        yield set_profile(name)
    finally:
        set_profile(before)


_active = set_profile(os.environ.get("A2A_FAKE_FLASHINFER_PROFILE", DEFAULT_PROFILE))
