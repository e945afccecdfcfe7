"""GPU tests run only where there are >= 2 CUDA GPUs and the real FlashInfer; elsewhere
every test here (and only here: ``pytest tests gpu_tests`` still runs the CPU suite) is
skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


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
    mine = [item for item in items if HERE in Path(item.path).resolve().parents]
    reason = _missing() if mine else None
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
