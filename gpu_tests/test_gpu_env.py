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
    """impl drives MoeAlltoAll (up to 0.7.2) or flashinfer.moe_ep's NVLinkOneSidedAlltoAll
    (0.7.2 on; the only one in 0.7.4): the installed release must offer one of them."""
    from impl.backend import resolve_backend

    api = resolve_backend("flashinfer")
    assert api.a2a_api() in ("comm", "moe_ep")
