"""GPU tests run only where there are >= 2 CUDA GPUs and the real FlashInfer; elsewhere
every test here is skipped with the reason."""

from __future__ import annotations

import pytest


def _missing() -> str | None:
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
    return None


def pytest_collection_modifyitems(config, items):
    reason = _missing()
    for item in items:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
