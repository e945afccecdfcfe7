"""What the GPU-or-fake benchmarks share: their backend options, checked before any rank
starts, and each rank's one-sided ``MoeAlltoAll`` from ``impl``'s manager."""

from __future__ import annotations

import torch

from testbed.scenario.rank import resolve_backend
from testbed.integrations.impl.cases import one_sided_manager
from testbed.scenario.rank import rank_api, rank_device


def add_backend_arguments(parser) -> None:
    parser.add_argument("--backend", choices=("fake", "flashinfer"), default="fake")
    parser.add_argument("--profile", default="0.7.2", help="the fake's release (default: %(default)s)")
    parser.add_argument("--ranks", type=int, default=2)


def check_backend(args) -> None:
    """Refuse, with the reason, a fake release without ``MoeAlltoAll`` or a real backend this
    machine cannot run (what :func:`testbed.gpu_env.missing_for_gpu_tests` finds missing,
    fewer GPUs than ``--ranks``)."""
    if args.backend == "fake":
        from fakes.flashinfer.profiles import PROFILES

        if args.profile not in PROFILES:
            raise SystemExit(f"--profile: one of {sorted(PROFILES)}, got {args.profile!r}")
        if "comm.trtllm_moe_alltoall" in PROFILES[args.profile].absent_modules:
            raise SystemExit(f"--profile {args.profile}: that release has no MoeAlltoAll (moe_ep only); "
                             "this benchmark drives MoeAlltoAll")
        return
    from testbed.gpu_env import missing_for_gpu_tests

    missing = missing_for_gpu_tests()
    if missing:
        raise SystemExit(f"--backend flashinfer: {missing}")
    api = resolve_backend("flashinfer")
    if not api.has("comm"):
        raise SystemExit(f"--backend flashinfer: flashinfer {api.root.__version__} has no MoeAlltoAll (moe_ep only); "
                         "this benchmark drives MoeAlltoAll")
    if args.ranks > torch.cuda.device_count():
        raise SystemExit(f"--ranks {args.ranks}: this machine has {torch.cuda.device_count()} GPUs")


def rank_manager(ctx, backend: str, profile: str):
    """This rank's device and a one-sided manager (``MoeAlltoAll``) of ``backend`` over the EP
    group, not yet initialized."""
    api = rank_api(ctx, backend, profile)
    if not api.has("comm"):
        raise RuntimeError(f"flashinfer {api.root.__version__} has no MoeAlltoAll (0.7.4 moved it to moe_ep): "
                           "this benchmark drives MoeAlltoAll")
    return rank_device(ctx, backend), one_sided_manager(ctx, api)
