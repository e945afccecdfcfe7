"""Which FlashInfer the integration talks to: the real package or the CPU fake.

This is the only module of ``impl`` that names the fake, and only by its import path: the
rest of ``impl`` receives a :class:`FlashInferAPI` and reads every FlashInfer symbol from it.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

import torch

BACKENDS = ("fake", "flashinfer")
FAKE_ROOT = "fakes.flashinfer"
# The last release with flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll (0.7.4 moved it).
LAST_SUPPORTED = "0.7.2.post1"


class FlashInferUnavailableError(ImportError):
    """The chosen FlashInfer cannot serve the integration (missing, or too new)."""


@dataclass(frozen=True)
class FlashInferAPI:
    """The FlashInfer modules the integration uses.

    Symbols are read from the modules at call time, so a fake whose version profile changes
    after resolution hands out that profile's classes.
    """

    name: str
    root: ModuleType
    moe_alltoall: ModuleType  # comm.trtllm_moe_alltoall (one-sided)
    alltoall: ModuleType  # comm.trtllm_alltoall (two-sided MnnvlMoe)
    mnnvl: ModuleType  # comm.mnnvl
    mapping: ModuleType  # comm.mapping

    @property
    def version(self) -> str:
        return str(getattr(self.root, "__version__", "unknown"))

    @property
    def fused_moe(self) -> ModuleType:
        """``fused_moe`` (the TRT-LLM MoE kernels and weight-layout helpers), imported on use."""
        return importlib.import_module(f"{self.root.__name__}.fused_moe")

    @property
    def MoeAlltoAll(self) -> type:
        return self.moe_alltoall.MoeAlltoAll

    @property
    def MnnvlMoe(self) -> type:
        return self.alltoall.MnnvlMoe

    @property
    def Mapping(self) -> type:
        return self.mapping.Mapping

    @property
    def MnnvlConfig(self) -> type:
        return self.mnnvl.MnnvlConfig

    @property
    def CommBackend(self) -> type:
        return self.mnnvl.CommBackend

    def workspace_size_per_rank(self, ep_size: int, max_num_tokens: int,
                                dispatch_bytes_per_token: int, combine_bytes_per_token: int) -> int:
        """FlashInfer's own one-sided workspace size formula."""
        return self.moe_alltoall.moe_a2a_get_workspace_size_per_rank(
            ep_size=ep_size,
            max_num_tokens=max_num_tokens,
            total_dispatch_payload_size_per_token=dispatch_bytes_per_token,
            combine_payload_size_per_token=combine_bytes_per_token,
        )


def resolve_backend(name: str, *, profile: str | None = None) -> FlashInferAPI:
    """Return the FlashInfer API namespace named ``name``.

    Parameters
    ----------
    name : str
        ``"fake"`` (the CPU fake) or ``"flashinfer"`` (the installed package, imported here).
    profile : str, optional
        For ``"fake"`` only: the FlashInfer release to imitate (e.g. ``"0.6.8"``, ``"0.7.2"``);
        None keeps the fake's active profile.

    Returns
    -------
    FlashInferAPI

    Raises
    ------
    ValueError
        Unknown ``name``, or ``profile`` given for the real package.
    FlashInferUnavailableError
        ``flashinfer`` is not installed, or is a release without
        ``flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll``.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "fake":
        root = importlib.import_module(FAKE_ROOT)
        if profile is not None:
            root.set_profile(profile)
        return _namespace(name, root, FAKE_ROOT)
    if profile is not None:
        raise ValueError(f"profile={profile!r} applies to the fake backend only; "
                         "the real FlashInfer is whatever release is installed")
    try:
        root = importlib.import_module("flashinfer")
    except ImportError as e:
        raise FlashInferUnavailableError(
            "backend 'flashinfer' needs the flashinfer-python package "
            f"(pip install 'flashinfer-python<={LAST_SUPPORTED}'): {e}"
        ) from e
    version = getattr(root, "__version__", "unknown")
    try:
        api = _namespace(name, root, "flashinfer")
        api.MoeAlltoAll  # noqa: B018 - the symbol the integration cannot do without
    except (ImportError, AttributeError) as e:
        moved = importlib.util.find_spec("flashinfer.moe_ep") is not None
        raise FlashInferUnavailableError(
            f"flashinfer {version} has no flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll"
            + (" (0.7.4 moved the one-sided all-to-all to flashinfer.moe_ep as "
               "NVLinkOneSidedAlltoAll, which this integration does not drive yet)" if moved else "")
            + f"; install flashinfer-python<={LAST_SUPPORTED}: {e}"
        ) from e
    return api


def default_gpus_per_node(ep_size: int) -> int:
    """``gpus_per_node`` for FlashInfer's ``Mapping``: the visible CUDA devices, or on a host
    without them (the fake) the EP size, so the whole group reads as one node."""
    return torch.cuda.device_count() if torch.cuda.is_available() else ep_size


def _namespace(name: str, root: ModuleType, prefix: str) -> FlashInferAPI:
    sub = lambda mod: importlib.import_module(f"{prefix}.comm.{mod}")  # noqa: E731
    return FlashInferAPI(name, root, sub("trtllm_moe_alltoall"), sub("trtllm_alltoall"),
                         sub("mnnvl"), sub("mapping"))
