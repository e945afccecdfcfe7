"""Version profiles: what differs between FlashInfer releases that the integration meets.

The active profile decides which signatures ``fakes.flashinfer.comm.trtllm_moe_alltoall``
exposes (so ``inspect.signature`` sees the real shape), the limits the kernels check and
the return forms. Choose it with :func:`set_profile` or ``A2A_FAKE_FLASHINFER_PROFILE``.

A profile is named for the release it imitates and may serve others (``serves``): releases
the contract finds identical to it (0 differences), named as pip prints them. A profile is its
``base`` plus declared deltas: its own fields, and an entry in a per-release table (:func:`pick`)
only where the release differs from the base. The roots, whose tables are complete, are 0.6.8
and 0.7.4; a release after 0.6.8 has the release before it as base, one before 0.6.8 the release
after it (0.6.3 -> 0.6.6 -> 0.6.7 -> 0.6.8), so every delta is declared against a neighbour.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, TypeVar

T = TypeVar("T")


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
    backend_kw: bool  # backend="trtllm" keyword (0.7.1 on)
    top_k_kernels: tuple[int, ...]  # the top_k values SWITCH_TOP_K instantiates (moeAlltoAllKernels.cu)
    init_barrier: bool  # MoeAlltoAll barriers after zeroing its workspace row (0.7.1 on); before, the caller must
    rank_mask_words: int  # uint64 words of an active-rank mask (kRankMaskWords)
    # Modules under flashinfer the fake does not provide for this release: not shipped, or not
    # imitated (0.6.14 .. 0.7.1's moe_ep is the NCCL-EP/NIXL-EP API, which holds no NVLink class).
    absent_modules: tuple[str, ...]
    # moe_ep's NVLink backends run their own JIT kernels (nvlink_one_sided_alltoall.cu, 0.7.4)
    # instead of wrapping MoeAlltoAll / MnnvlMoe (0.7.2).
    moe_ep_kernels: bool = False
    # block_scale_interleave(unswizzled_sf, *, out=None) (0.7.2.post1 on)
    interleave_out: bool = False
    # MoeAlltoAll and MnnvlMoe carry typing_extensions.deprecated (0.7.2 on, until 0.7.4 removes them)
    comm_deprecated: bool = False
    # moe_a2a_dispatch(recv_view_cache=) and MoeAlltoAll keeping its receive views (0.7.0 on)
    recv_view_cache: bool = False
    # fused_moe re-exports fused_moe.api's QuantFormat (0.7.0 on)
    quant_format: bool = False
    # Names the release's modules lack although the fake's modules of the same path have them,
    # as ``module.name`` ("trtllm_bf16_moe" for the root): 0.6.3's fused_moe has no bf16 routed entry.
    absent_names: tuple[str, ...] = ()
    base: Optional[str] = None  # the profile whose per-release tables this one falls back on
    serves: tuple[str, ...] = ()  # other releases identical to this one (contract: 0 differences)


def derive(base: Profile, name: str, serves: tuple[str, ...] = (), **changes) -> Profile:
    """The profile of release ``name``: ``base`` with ``changes``, falling back on its tables."""
    return dataclasses.replace(base, name=name, base=base.name, serves=serves, **changes)


_TOP_K_0_6_8 = (1, 2, 4, 6, 8, 10, 16, 22)
_TOP_K_0_6_16 = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22)
_TOP_K_0_7_4 = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 22)
# 0.7.4 removed the one-sided MoeAlltoAll and the two-sided MnnvlMoe: flashinfer.moe_ep's NVLink
# backends are the only way in, with their own kernels (nvlink_one_sided_alltoall.cu).
_REMOVED_0_7_4 = ("comm.trtllm_moe_alltoall", "comm.trtllm_alltoall")
# The quantizers' package (flashinfer.quantization with fp4_/fp8_quantization under it) and
# flashinfer.tllm_enums came in 0.6.7; before, flashinfer.quantization is a flat module of
# packbits helpers the fake does not imitate, so none of the fake package's names are there.
_QUANTIZATION_NAMES = tuple(f"quantization.{n}" for n in (
    "SfLayout", "block_scale_interleave", "fp4_quantize", "mxfp8_quantize", "nvfp4_block_scale_interleave",
    "shuffle_matrix_a", "shuffle_matrix_sf_a"))
_0_6_8 = Profile("0.6.8", 22, 4, 64, True, False, False, False, False, _TOP_K_0_6_8, False, 1,
                 ("moe_ep", "fused_moe.api", "comm.comm_backend"),
                 serves=("0.6.8.post1", "0.6.9", "0.6.10", "0.6.10.post1"))
# Before 0.6.8 the one-sided kernels take at most 8 experts per token and 8 payloads.
_0_6_7 = derive(_0_6_8, "0.6.7", ("0.6.7.post1", "0.6.7.post2", "0.6.7.post3"), k_max_top_k=8, k_max_payloads=8,
                top_k_kernels=(1, 2, 4, 8))
_0_6_6 = derive(_0_6_7, "0.6.6", ("0.6.5",), absent_modules=_0_6_7.absent_modules + (
    "quantization.fp4_quantization", "quantization.fp8_quantization", "tllm_enums"), absent_names=_QUANTIZATION_NAMES)
_0_6_4 = derive(_0_6_6, "0.6.4", absent_names=_QUANTIZATION_NAMES + (
    "trtllm_bf16_moe", "trtllm_bf16_routed_moe", "trtllm_fp8_block_scale_routed_moe",
    "fused_moe.trtllm_bf16_routed_moe", "fused_moe.Fp8QuantizationType"))
_0_6_3 = derive(_0_6_4, "0.6.3")
_0_6_11 = derive(_0_6_8, "0.6.11", ("0.6.11.post1", "0.6.11.post2", "0.6.11.post3"))
_0_6_12 = derive(_0_6_11, "0.6.12")
_0_6_13 = derive(_0_6_12, "0.6.13")
_0_6_14 = Profile("0.6.14", 22, 6, 64, True, True, False, False, False, _TOP_K_0_6_8, False, 1,
                  ("moe_ep", "comm.comm_backend"), base="0.6.13")
_0_6_15 = derive(_0_6_14, "0.6.15", ("0.6.15.post1",))
_0_6_16 = Profile("0.6.16", 22, 6, 64, False, True, True, True, False, _TOP_K_0_6_16, False, 1, ("moe_ep",),
                  base="0.6.15", serves=("0.6.16.post1", "0.6.16.post2", "0.6.16.post3", "0.6.16.post4", "0.6.17"))
_0_6_18 = derive(_0_6_16, "0.6.18", ("0.6.18.post1",))
_0_7_0 = derive(_0_6_18, "0.7.0", ("0.7.0.post1",), recv_view_cache=True, quant_format=True)
_0_7_1 = derive(_0_7_0, "0.7.1", backend_kw=True, init_barrier=True)
_0_7_2 = derive(_0_7_1, "0.7.2", absent_modules=(), comm_deprecated=True)
_0_7_2_post1 = derive(_0_7_2, "0.7.2.post1", interleave_out=True)
_0_7_4 = Profile("0.7.4", 22, 4, 256, False, True, True, True, True, _TOP_K_0_7_4, True, 4, _REMOVED_0_7_4,
                 moe_ep_kernels=True, interleave_out=True, recv_view_cache=True, quant_format=True)
PROFILES = {p.name: p for p in (_0_6_3, _0_6_4, _0_6_6, _0_6_7, _0_6_8, _0_6_11, _0_6_12, _0_6_13, _0_6_14, _0_6_15, _0_6_16, _0_6_18, _0_7_0, _0_7_1, _0_7_2, _0_7_2_post1, _0_7_4)}
# vLLM 0.33.0's pin, which the fake imitated before it had a profile per release.
DEFAULT_PROFILE = "0.7.2.post1"


# The fields the all-to-all kernels and their Python APIs read; the others change only the
# surface around them (enums, the fused MoE's signatures, quantizer keywords, deprecations).
_ALLTOALL_FIELDS = ("k_max_top_k", "k_max_payloads", "k_max_ranks", "experts_divisible", "combine_quant_kws",
                    "combine_output_kw", "eplb_and_rank_mask", "backend_kw", "top_k_kernels", "init_barrier",
                    "rank_mask_words", "moe_ep_kernels", "recv_view_cache")
_ALLTOALL_MODULES = ("comm", "moe_ep")  # of absent_modules, those the all-to-alls live in


def distinct_alltoalls() -> tuple[str, ...]:
    """The oldest profile of each distinct all-to-all: a matrix over releases runs these, as
    the others' all-to-all is one of theirs."""
    seen: dict[tuple, str] = {}
    for p in PROFILES.values():
        key = tuple(getattr(p, f) for f in _ALLTOALL_FIELDS)
        seen.setdefault(key + (tuple(m for m in p.absent_modules if m.startswith(_ALLTOALL_MODULES)),), p.name)
    return tuple(seen.values())


class UnservedRelease(ValueError):
    """A FlashInfer release no profile serves; the message is one line naming what is served."""


# Releases an engine pins that PyPI has no wheel of (so no source a profile could be built from):
# each can be served only by evidence (:func:`serve_by_evidence`), never by a profile's name.
WHEELLESS = {"0.7.3": "flashinfer-python on PyPI goes from 0.7.2.post1 to 0.7.4, with no 0.7.3 or rc of it"}
EVIDENCE_ENV = "A2A_FLASHINFER_SERVED_BY_EVIDENCE"  # "0.7.3=0.7.4=83=vLLM 0.34.0;...": inherited by the ranks


@dataclass(frozen=True)
class Evidence:
    """Why a wheelless ``pin`` runs on profile ``by``: every one of the ``uses`` uses of FlashInfer
    ``engine`` makes has the same form in ``by`` (:mod:`testbed.contract.serving` finds it)."""

    pin: str
    by: str
    uses: int
    engine: str  # "vLLM 0.34.0"


def serve_by_evidence(evidence: Evidence) -> None:
    """From now on ``evidence.pin`` resolves to ``evidence.by``, in this process and every one
    it starts (the environment carries it)."""
    if evidence.pin not in WHEELLESS:
        raise ValueError(f"{evidence.pin} has a wheel: it is served by a profile of its own, not by evidence")
    resolve(evidence.by)
    entries = dict(e.split("=", 1) for e in filter(None, os.environ.get(EVIDENCE_ENV, "").split(";")))
    entries[evidence.pin] = f"{evidence.by}={evidence.uses}={evidence.engine}"
    os.environ[EVIDENCE_ENV] = ";".join(f"{k}={v}" for k, v in entries.items())


def _evidence(release: str) -> Optional[Evidence]:
    for entry in filter(None, os.environ.get(EVIDENCE_ENV, "").split(";")):
        pin, by, uses, engine = entry.split("=", 3)
        if pin == release:
            return Evidence(pin, by, int(uses), engine)
    return None


def served_releases() -> tuple[str, ...]:
    """Every release a profile serves, oldest first."""
    return tuple(sorted((r for p in PROFILES.values() for r in (p.name,) + p.serves), key=release_key))


def unserved_pin(who: str, pin: str) -> UnservedRelease:
    """The one-line refusal of ``who`` (``vLLM 0.99.0``) pinning FlashInfer ``pin`` no profile serves."""
    return UnservedRelease(f"{who} pins flashinfer-python {pin}, which no profile of the fake serves: it serves "
                           f"{', '.join(served_releases())}")


def release_key(version: str) -> tuple:
    """``0.7.2`` < ``0.7.2.post1`` < ``0.7.4``, as pip orders them (release candidates before)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)*)(?:rc(\d+))?(?:\.post(\d+))?", version)
    if m is None:
        return (float("inf"), version)
    rc = int(m.group(2)) if m.group(2) is not None else float("inf")
    return tuple(int(x) for x in m.group(1).split(".")) + (rc, int(m.group(3) or 0))


def resolve(release: str, what: str = "FlashInfer release") -> Profile:
    """The profile that serves ``release`` (a profile's name or a release it serves)."""
    release = str(release).strip()
    if release in PROFILES:
        return PROFILES[release]
    for profile in PROFILES.values():
        if release in profile.serves:
            return profile
    evidence = _evidence(release)
    if evidence is not None:
        return PROFILES[evidence.by]
    raise UnservedRelease(f"{what} {release!r} is not served by the fake: it serves "
                          f"{', '.join(served_releases())}")


def serving(release: str) -> Optional[str]:
    """The name of the profile serving ``release``, or None where none does."""
    try:
        return resolve(release).name
    except UnservedRelease:
        return None


def served_by(release: str) -> str:
    """``release`` as a report names it: ``0.6.16.post3 (served by 0.6.16)``, or the profile's own."""
    name = resolve(release).name
    evidence = _evidence(release)
    if evidence is not None:
        return f"{release} (no wheel; served by {name} for the {evidence.uses} uses {evidence.engine} makes)"
    return release if name == release else f"{release} (served by {name})"


def chain(profile: Profile) -> Iterator[Profile]:
    """``profile``, then its base, then that one's, ..."""
    while True:
        yield profile
        if profile.base is None:
            return
        profile = PROFILES[profile.base]


def pick(table: Mapping[str, T], profile: Optional[Profile] = None) -> T:
    """``table``'s entry for ``profile`` (default: the active one) or, where it declares none,
    for its nearest base."""
    for p in chain(profile or _active):
        if p.name in table:
            return table[p.name]
    raise KeyError(f"no entry for profile {(profile or _active).name} or its bases")


def set_profile(name: str) -> Profile:
    """Make release ``name`` (a profile, or a release one serves) active in this process;
    returns its profile."""
    global _active, _release
    _active, _release = resolve(name), str(name).strip()
    return _active


def active() -> Profile:
    return _active


def release() -> str:
    """The release the fake answers for: the one named to :func:`set_profile`."""
    return _release


def removed_module(module: str) -> AttributeError:
    """What reaching into ``module`` (a fake module path) raises under a profile whose release
    does not ship it: the real ``import`` fails, so the fake's names must not serve either."""
    path = module.removeprefix("fakes.flashinfer.")
    return AttributeError(f"flashinfer {_release} does not ship flashinfer.{path} "
                          f"(import flashinfer.{path} fails there)")


def ships(module: str, name: str) -> bool:
    """Whether the active release's ``flashinfer.<module>`` (``""``: the root) has ``name``,
    where the fake's module of that path serves it."""
    return f"{module}.{name}".lstrip(".") not in _active.absent_names


@contextlib.contextmanager
def fake_profile(name: str) -> Iterator[Profile]:
    """``name`` active inside the block, the previous profile after it."""
    before = _release
    try:
        yield set_profile(name)
    finally:
        set_profile(before)


ENV = "A2A_FAKE_FLASHINFER_PROFILE"
_active, _release = PROFILES[DEFAULT_PROFILE], DEFAULT_PROFILE
try:
    set_profile(os.environ.get(ENV, DEFAULT_PROFILE))
except UnservedRelease as e:
    raise UnservedRelease(f"{ENV}: {e}") from None
