"""What a machine lacks for ``gpu_tests/``: each missing piece as the reason a skip gives.

In order: torch, CUDA, >= 2 GPUs, the flashinfer-python package, a release that offers the
one-sided all-to-all (``MoeAlltoAll`` up to 0.7.2, ``flashinfer.moe_ep`` from 0.7.2), NVLink
between every GPU pair, and ``CAP_SYS_PTRACE`` where FlashInfer shares its MNNVL memory as
POSIX file descriptors (``pidfd_getfd`` needs it; FABRIC handles, on GB200, do not).
"""

from __future__ import annotations

import itertools
from importlib import metadata
from pathlib import Path
from typing import Optional

CAP_SYS_PTRACE = 19  # linux/capability.h


def has_capability(status_text: str, bit: int) -> bool:
    """Whether ``CapEff`` in a ``/proc/<pid>/status`` text has capability ``bit``."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return bool((int(line.split()[1], 16) >> bit) & 1)
    raise ValueError("no CapEff line in the process status")


def missing_for_gpu_tests(status_path: str = "/proc/self/status") -> Optional[str]:
    """The first thing this machine lacks for ``gpu_tests/``, as a skip reason; None if nothing."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (gpu_tests need >= 2 NVLink GPUs)"
    if torch.cuda.device_count() < 2:
        return f"only {torch.cuda.device_count()} CUDA device(s); gpu_tests need >= 2"
    try:
        import flashinfer  # noqa: F401
    except ImportError as exc:
        return f"flashinfer-python is not importable: {exc}"
    from impl.backend import FlashInferUnavailableError
    from testbed.scenario.rank import resolve_backend

    try:
        api = resolve_backend("flashinfer")
    except FlashInferUnavailableError as exc:
        return str(exc)
    n = torch.cuda.device_count()
    no_peer = [(a, b) for a, b in itertools.permutations(range(n), 2) if not torch.cuda.can_device_access_peer(a, b)]
    if no_peer:
        return f"GPU pairs without peer access (the NVLink puts need it): {no_peer}"
    try:
        nvlink_up = bool(api.mnnvl.MnnvlMemory.support_nvlink(True))
    except Exception as exc:  # NVML or cuda-python missing or failing: that is the reason
        return f"could not query NVLink through FlashInfer's MnnvlMemory.support_nvlink: {type(exc).__name__}: {exc}"
    if not nvlink_up:
        return "GPU 0 has no NVLink, or not all of its NVLinks are up (MnnvlMemory.support_nvlink)"
    if not _fabric_handles(api) and not has_capability(Path(status_path).read_text(), CAP_SYS_PTRACE):
        return ("CAP_SYS_PTRACE is missing: without an MNNVL fabric FlashInfer shares its workspace as POSIX file "
                "descriptors through pidfd_getfd, which needs it (docker run --cap-add SYS_PTRACE)")
    return None


def _fabric_handles(api) -> bool:
    """Whether GPU 0 can share memory as FABRIC handles (``is_mnnvl_fabric_supported``, which
    releases before 0.7.4 may lack: then POSIX file descriptors are assumed)."""
    import torch

    probe = getattr(api.mnnvl, "is_mnnvl_fabric_supported", None)
    if probe is None:
        return False
    try:
        return bool(probe(torch.cuda.current_device()))
    except Exception:  # a failing probe means no FABRIC handles for FlashInfer either
        return False


def installed_profile() -> str:
    """The installed ``flashinfer-python`` release (what ``--backend flashinfer`` runs), as pip
    prints it, when a profile serves it.

    Raises
    ------
    ValueError
        The package is not installed, or no profile serves its release (the invariants need
        the release's facts); one line naming what is served.
    """
    from fakes.flashinfer.profiles import resolve

    try:
        version = metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        raise ValueError("flashinfer-python is not installed (pip install flashinfer-python)") from None
    resolve(version, "the installed flashinfer-python")  # UnservedRelease, a ValueError: one line
    return version
