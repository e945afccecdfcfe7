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
