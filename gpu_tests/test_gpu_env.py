"""The GPU box itself: what every later GPU test assumes."""

from __future__ import annotations

import itertools


def test_gpu_env_peer_access_all_pairs():
    """One-sided NVLink puts need every GPU pair to have peer access."""
    import torch

    n = torch.cuda.device_count()
    missing = [
        (a, b) for a, b in itertools.permutations(range(n), 2)
        if not torch.cuda.can_device_access_peer(a, b)
    ]
    assert not missing, f"GPU pairs without peer access: {missing}"


def test_gpu_env_flashinfer_has_one_sided_alltoall():
    """flashinfer 0.7.4 moved one-sided all-to-all to flashinfer.moe_ep; impl/ targets MoeAlltoAll."""
    import flashinfer

    try:
        from flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll  # noqa: F401
    except ImportError as exc:
        raise AssertionError(
            f"flashinfer {flashinfer.__version__} has no comm.trtllm_moe_alltoall.MoeAlltoAll: {exc}"
        ) from exc
