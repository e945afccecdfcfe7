"""Fake ``flashinfer.moe_ep`` (0.7.2, 0.7.4): the NVLink communication an engine integrates,
not the NCCL-EP/NIXL-EP transports or the mega kernels the real package also holds. Where
the releases differ (the base's ``dispatch`` keyword, 0.7.4's own one-sided kernels and
config), the active profile's classes serve."""

from fakes.flashinfer import profiles
from fakes.flashinfer.moe_ep import nvlink, nvlink_jit
from fakes.flashinfer.moe_ep.communication import (
    MoEEpCommParams,
    MoEEpCommunication_0_7_4,
    MoEEpDispatchResult,
    available_communication_backends,
    create_communication,
    register_communication,
)
from fakes.flashinfer.moe_ep.communication import MoEEpCommunication as _MoEEpCommunication_0_7_2
from fakes.flashinfer.moe_ep.config import BootstrapConfig
from fakes.flashinfer.moe_ep.nvlink import NVLinkTwoSidedConfig

__all__ = [
    "BootstrapConfig", "MoEEpCommParams", "MoEEpCommunication", "MoEEpDispatchResult",
    "NVLinkOneSidedAlltoAll", "NVLinkOneSidedConfig", "NVLinkTwoSidedAlltoAll", "NVLinkTwoSidedConfig",
    "available_communication_backends", "create_communication", "register_communication",
]
_BY_KERNELS = {
    False: {"MoEEpCommunication": _MoEEpCommunication_0_7_2, "NVLinkOneSidedAlltoAll": nvlink.NVLinkOneSidedAlltoAll,
            "NVLinkOneSidedConfig": nvlink.NVLinkOneSidedConfig,
            "NVLinkTwoSidedAlltoAll": nvlink.NVLinkTwoSidedAlltoAll},
    True: {"MoEEpCommunication": MoEEpCommunication_0_7_4, "NVLinkOneSidedAlltoAll": nvlink_jit.NVLinkOneSidedAlltoAll,
           "NVLinkOneSidedConfig": nvlink_jit.NVLinkOneSidedConfig,
           "NVLinkTwoSidedAlltoAll": nvlink_jit.NVLinkTwoSidedAlltoAll},
}
del MoEEpCommunication_0_7_4


def __getattr__(name: str):
    profile = profiles.active()
    if "moe_ep" in profile.absent_modules:
        raise profiles.removed_module(__name__)
    names = _BY_KERNELS[profile.moe_ep_kernels]
    if name in names:
        return names[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_BY_KERNELS[True]))
