"""Fake ``flashinfer.moe_ep`` (0.7.2): the NVLink communication an engine integrates, not the
NCCL-EP/NIXL-EP transports or the mega kernels the real package also holds."""

from fakes.flashinfer.moe_ep.communication import (
    MoEEpCommParams,
    MoEEpCommunication,
    MoEEpDispatchResult,
    available_communication_backends,
    create_communication,
    register_communication,
)
from fakes.flashinfer.moe_ep.config import BootstrapConfig
from fakes.flashinfer.moe_ep.nvlink import (
    NVLinkOneSidedAlltoAll,
    NVLinkOneSidedConfig,
    NVLinkTwoSidedAlltoAll,
    NVLinkTwoSidedConfig,
)

__all__ = [
    "BootstrapConfig", "MoEEpCommParams", "MoEEpCommunication", "MoEEpDispatchResult",
    "NVLinkOneSidedAlltoAll", "NVLinkOneSidedConfig", "NVLinkTwoSidedAlltoAll", "NVLinkTwoSidedConfig",
    "available_communication_backends", "create_communication", "register_communication",
]
