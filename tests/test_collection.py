"""Collecting the CPU suite together with gpu_tests/ on a machine without GPUs: the CPU tests
run, only the GPU ones are skipped, each with its reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_collection_cpu_and_gpu_dirs_together_skip_only_gpu_tests():
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/test_layering.py", "gpu_tests"], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    out = done.stdout
    assert done.returncode == 0, out[-3000:]
    assert re.search(r"\b[1-9]\d* passed", out), out[-3000:]  # tests/test_layering.py ran
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skipped and all("gpu_tests/" in line for line in skipped), skipped
    assert all("CUDA" in line or "flashinfer" in line for line in skipped), skipped


STATUS = "Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{}\nCapBnd:\t000001ffffffffff\n"


def test_collection_gpu_env_reads_cap_sys_ptrace():
    from testbed.gpu_env import CAP_SYS_PTRACE, has_capability

    assert has_capability(STATUS.format("00000000a80c25fb"), CAP_SYS_PTRACE)  # docker --cap-add SYS_PTRACE
    assert not has_capability(STATUS.format("00000000a80425fb"), CAP_SYS_PTRACE)  # docker's default set
    import pytest

    with pytest.raises(ValueError, match="no CapEff line"):
        has_capability("Name:\tpython\n", CAP_SYS_PTRACE)


def test_collection_gpu_env_names_what_this_machine_lacks():
    import pytest
    import torch

    from testbed.gpu_env import missing_for_gpu_tests

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: the reason depends on its GPUs and FlashInfer")
    assert missing_for_gpu_tests() == "no CUDA device (gpu_tests need >= 2 NVLink GPUs)"
