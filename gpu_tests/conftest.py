"""GPU tests run only where :func:`testbed.gpu_env.missing_for_gpu_tests` finds nothing
missing (>= 2 NVLink GPUs, a FlashInfer with the one-sided all-to-all, SYS_PTRACE where
needed); elsewhere every test here (and only here: ``pytest tests gpu_tests`` still runs the
CPU suite) is skipped with what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.gpu_env import missing_for_gpu_tests

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(item.path).resolve().parents]
    reason = missing_for_gpu_tests() if mine else None
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
