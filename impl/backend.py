"""Which FlashInfer the integration talks to: the real package or the CPU fake.

``impl`` never names the fake: a caller that runs it on a stand-in hands the stand-in's package
in (``resolve_backend("fake", root=...)``). The rest of ``impl`` receives a :class:`FlashInferAPI`
and reads every FlashInfer symbol from it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch

# Which FlashInfer API carries an all-to-all: ``flashinfer.comm``'s MoeAlltoAll (one-sided) and
# MnnvlMoe (two-sided), gone in 0.7.4, or ``flashinfer.moe_ep``'s NVLink backends (0.7.2 on).
A2A_APIS = ("comm", "moe_ep")


class FlashInferUnavailableError(ImportError):
    """The chosen FlashInfer cannot serve the integration (missing, or too new)."""


@dataclass(frozen=True)
class FlashInferAPI:
    """The FlashInfer modules the integration uses.

    Symbols are read from the modules at call time, so a fake whose version profile changes
    after resolution hands out that profile's classes. A module the release does not ship is
    None; :meth:`has` says which all-to-all APIs it offers.
    """

    name: str
    root: ModuleType
    moe_alltoall: Optional[ModuleType]  # comm.trtllm_moe_alltoall (one-sided)
    alltoall: Optional[ModuleType]  # comm.trtllm_alltoall (two-sided MnnvlMoe)
    mnnvl: ModuleType  # comm.mnnvl
    mapping: ModuleType  # comm.mapping
    moe_ep: Optional[ModuleType] = None  # moe_ep (NVLink one- and two-sided backends)
    unavailable: tuple[tuple[str, str], ...] = ()  # (module, why it did not import)

    def has(self, a2a_api: str, two_sided: bool = False) -> bool:
        """Whether this FlashInfer offers the one-sided (or ``two_sided``) all-to-all through
        ``a2a_api`` (one of :data:`A2A_APIS`): a probe of the symbols, not of the version."""
        if a2a_api not in A2A_APIS:
            raise ValueError(f"a2a_api must be one of {A2A_APIS}, got {a2a_api!r}")
        if a2a_api == "comm":
            module, symbols = (self.alltoall, ("MnnvlMoe",)) if two_sided else (self.moe_alltoall, ("MoeAlltoAll",))
        else:
            side = "NVLinkTwoSidedAlltoAll" if two_sided else "NVLinkOneSidedAlltoAll"
            module, symbols = self.moe_ep, (side, "create_communication")
        if module is None:
            return False
        try:
            for symbol in symbols:
                getattr(module, symbol)
        except (AttributeError, ImportError):
            return False
        return True

    def a2a_api(self, two_sided: bool = False, prefer: Optional[str] = None) -> str:
        """The API that carries the one-sided (or ``two_sided``) all-to-all: ``prefer`` if
        given, else ``comm`` where the release has it (its long-tested path) and ``moe_ep``
        where it does not.

        Raises
        ------
        FlashInferUnavailableError
            ``prefer`` (or, without it, every API) is missing from this FlashInfer.
        """
        kind = "two-sided" if two_sided else "one-sided"
        if prefer is not None:
            if not self.has(prefer, two_sided):
                raise FlashInferUnavailableError(
                    f"flashinfer {self.version} has no {kind} all-to-all in {_API_HOME[prefer][two_sided]}")
            return prefer
        for candidate in A2A_APIS:
            if self.has(candidate, two_sided):
                return candidate
        why = "".join(f"; {module}: {reason}" for module, reason in self.unavailable)
        raise FlashInferUnavailableError(
            f"flashinfer {self.version} has no {kind} all-to-all: neither {_API_HOME['comm'][two_sided]} "
            f"nor {_API_HOME['moe_ep'][two_sided]}{why}")

    @property
    def version(self) -> str:
        return str(getattr(self.root, "__version__", "unknown"))

    @property
    def fused_moe(self) -> ModuleType:
        """``fused_moe`` (the TRT-LLM MoE kernels and weight-layout helpers), imported on use."""
        return importlib.import_module(f"{self.root.__name__}.fused_moe")

    @property
    def MoeAlltoAll(self) -> type:
        return self._symbol(self.moe_alltoall, "MoeAlltoAll", two_sided=False)

    @property
    def MnnvlMoe(self) -> type:
        return self._symbol(self.alltoall, "MnnvlMoe", two_sided=True)

    def _symbol(self, module: Optional[ModuleType], name: str, two_sided: bool) -> type:
        if not self.has("comm", two_sided):
            raise FlashInferUnavailableError(f"flashinfer {self.version} has no {_API_HOME['comm'][two_sided]}")
        return getattr(module, name)

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


def resolve_backend(name: str = "flashinfer", *, root: ModuleType | None = None) -> FlashInferAPI:
    """Return the FlashInfer API namespace of the installed package, or of ``root``.

    Parameters
    ----------
    name : str
        What the namespace is called: ``"flashinfer"`` for the installed package (imported
        here), another name for a stand-in given as ``root`` (a CPU fake, say).
    root : module, optional
        A package laid out as ``flashinfer`` is (its ``comm``, ``moe_ep``, ... submodules under
        its own name); None imports the installed ``flashinfer``.

    Returns
    -------
    FlashInferAPI

    Raises
    ------
    ValueError
        ``root`` given for ``"flashinfer"``, or a stand-in's name without its ``root``.
    FlashInferUnavailableError
        ``flashinfer`` is not installed, or is a release with neither
        ``flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll`` nor ``flashinfer.moe_ep``'s
        ``NVLinkOneSidedAlltoAll``.
    """
    if name != "flashinfer":
        if root is None:
            raise ValueError(f"backend {name!r}: give its package as root= (only 'flashinfer' is imported here)")
        return _namespace(name, root, root.__name__)
    if root is not None:
        raise ValueError("root= stands in for the real FlashInfer; backend 'flashinfer' is the installed package")
    try:
        root = importlib.import_module("flashinfer")
    except ImportError as e:
        raise FlashInferUnavailableError(
            f"backend 'flashinfer' needs the flashinfer-python package (pip install flashinfer-python): {e}"
        ) from e
    try:
        api = _namespace(name, root, "flashinfer")
    except ImportError as e:
        raise FlashInferUnavailableError(f"flashinfer {getattr(root, '__version__', 'unknown')}: {e}") from e
    api.a2a_api()  # the one-sided all-to-all, through one API or the other
    return api


def default_gpus_per_node(ep_size: int) -> int:
    """``gpus_per_node`` for FlashInfer's ``Mapping``: the visible CUDA devices, or on a host
    without them (the fake) the EP size, so the whole group reads as one node."""
    return torch.cuda.device_count() if torch.cuda.is_available() else ep_size


_API_HOME = {
    "comm": ("flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll", "flashinfer.comm.trtllm_alltoall.MnnvlMoe"),
    "moe_ep": ("flashinfer.moe_ep.NVLinkOneSidedAlltoAll", "flashinfer.moe_ep.NVLinkTwoSidedAlltoAll"),
}


def _optional(module: str, unavailable: dict[str, str]) -> Optional[ModuleType]:
    """``module``, or None where this FlashInfer does not ship it (0.7.4 removed the ``comm``
    all-to-alls; ``moe_ep`` arrived in 0.7.2) or it fails to import (a dependency it needs is
    missing); why goes into ``unavailable``, so the other API still serves."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        unavailable[module] = f"{type(e).__name__}: {e}"
        return None


def _namespace(name: str, root: ModuleType, prefix: str) -> FlashInferAPI:
    unavailable: dict[str, str] = {}
    optional = lambda mod: _optional(f"{prefix}.{mod}", unavailable)  # noqa: E731
    return FlashInferAPI(name, root, optional("comm.trtllm_moe_alltoall"), optional("comm.trtllm_alltoall"),
                         importlib.import_module(f"{prefix}.comm.mnnvl"),
                         importlib.import_module(f"{prefix}.comm.mapping"), optional("moe_ep"),
                         tuple(sorted(unavailable.items())))
