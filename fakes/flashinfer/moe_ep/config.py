"""Fake ``flashinfer.moe_ep.config``: ``BootstrapConfig`` (the EP domain every backend takes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class BootstrapConfig:
    """``world_size`` / ``rank`` of the EP domain; the NVLink backends also read
    ``process_group`` (their default communicator's group). ``device`` is keyword-only."""

    world_size: int
    rank: int
    stream: int = 0
    auto_bootstrap: bool = True
    device: Optional[int] = field(default=None, kw_only=True)
    nccl_comm: Optional[int] = None
    process_group: Optional[Any] = field(default=None, compare=False, hash=False)
    tcp_store: Optional[Any] = None

    def __post_init__(self) -> None:
        if self.world_size <= 0:
            raise ValueError(f"world_size must be positive, got {self.world_size}")
        if not (0 <= self.rank < self.world_size):
            raise ValueError(f"rank {self.rank} not in [0, {self.world_size})")
        if self.device is not None and self.device < 0:
            raise ValueError(f"device must be non-negative, got {self.device}")
