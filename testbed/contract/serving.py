"""A FlashInfer pin PyPI has no wheel of (:data:`~fakes.flashinfer.profiles.WHEELLESS`), served by
evidence: the consumer contract's scan of the engine release's all-to-all path lists every
FlashInfer module, name, attribute and keyword it reaches for; the profile that serves the pin
is the one nearest it (in release order, the older first) under which each of those uses is
there. Probes and type-only imports are left out: the engine works, differently, without them.
A use no profile has is refused by name, with the file and line that makes it.
"""

from __future__ import annotations

from pathlib import Path

from fakes.flashinfer.profiles import PROFILES, WHEELLESS, Evidence, UnservedRelease, release_key
from testbed.contract.consumer import Consumer, Use, _FakeSide, scan
from testbed.contract.source import PackageSource, Source
from testbed.contract.tree import RealSide, RealTree

FAKE_ROOT = Path(__file__).resolve().parents[2] / "fakes" / "flashinfer"


def uses(source: PackageSource, consumer: Consumer) -> list[Use]:
    """What the engine's path needs of FlashInfer: every use but probes and type-only imports.
    The fake's own tree tells modules from names (there is no real tree of a wheelless release)."""
    real = RealSide(RealTree(Source("fake", str(FAKE_ROOT), _root=FAKE_ROOT)))
    return [u for u in scan(source, consumer, real) if not u.tolerant]


def missing(needed: list[Use], profile: str) -> list[Use]:
    """The uses ``profile`` does not have."""
    from fakes.flashinfer import install

    with install(profile):
        fake = _FakeSide()
        return [u for u in needed if not fake.lookup(u).present]


def evidence(engine: str, source: PackageSource, consumer: Consumer, pin: str) -> Evidence:
    """The profile serving wheelless ``pin`` for ``engine`` (``vLLM 0.34.0``), with its evidence.

    Raises
    ------
    UnservedRelease
        ``pin`` has a wheel (it needs a profile of its own), or no profile has every use: one
        line naming the use.
    """
    if pin not in WHEELLESS:
        raise UnservedRelease(f"{engine} pins flashinfer-python {pin}, which no profile of the fake serves")
    try:
        needed = uses(source, consumer)
    except ValueError as e:  # the path's files are not where the consumer says
        raise UnservedRelease(f"{engine} pins flashinfer-python {pin}, which has no wheel, and what it uses of "
                              f"FlashInfer cannot be read: {e}") from None
    order = sorted(PROFILES, key=release_key)
    below = [p for p in order if release_key(p) < release_key(pin)][::-1]
    above = [p for p in order if release_key(p) > release_key(pin)]
    nearest = [p for pair in zip(below, above) for p in pair] + below[len(above):] + above[len(below):]
    gaps = {p: missing(needed, p) for p in nearest}
    for profile in nearest:
        if not gaps[profile]:
            return Evidence(pin, profile, len(needed), engine)
    nowhere = [u for u in needed if all(u in gap for gap in gaps.values())]
    closest = min(nearest, key=lambda p: len(gaps[p]))
    use = (nowhere or gaps[closest])[0]
    where = "no profile has it" if nowhere else f"the profile nearest to having every use, {closest}, lacks it"
    raise UnservedRelease(f"{engine} pins flashinfer-python {pin}, which has no wheel ({WHEELLESS[pin]}), and no "
                          f"profile of the fake has every use it makes of FlashInfer: {use.what} ({use.file}:{use.line}): "
                          f"{where}")
