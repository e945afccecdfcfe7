"""CPU fake of FlashInfer's MoE all-to-all surface; module paths mirror the real package.

Select the release to imitate with :func:`set_profile` (or ``A2A_FAKE_FLASHINFER_PROFILE``);
:func:`install` makes ``import flashinfer`` itself resolve to the fake.
"""

from fakes.flashinfer.aliases import install
from fakes.flashinfer.profiles import PROFILES, active, set_profile

__all__ = ["PROFILES", "active", "install", "set_profile"]


def __getattr__(name: str):
    if name == "__version__":
        return active().name
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
