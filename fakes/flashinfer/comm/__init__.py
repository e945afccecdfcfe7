"""Fake ``flashinfer.comm``: of the real package's names, those it re-exports from the MoE
all-to-all modules and ``Mapping``, per release (``CommBackend``, ``MnnvlConfig`` and
``MnnvlMemory`` are imported from ``flashinfer.comm.mnnvl``, as on the real package)."""

from fakes.flashinfer import profiles
from fakes.flashinfer.comm.mapping import Mapping  # noqa: F401 - re-exported, as by the real package

_FROM_A2A = (
    "MoeAlltoAll", "moe_a2a_combine", "moe_a2a_dispatch", "moe_a2a_get_workspace_size_per_rank",
    "moe_a2a_initialize", "moe_a2a_sanitize_expert_ids", "moe_a2a_wrap_payload_tensor_in_workspace",
)


def _a2a_names() -> tuple[str, ...]:
    profile = profiles.active()
    if "comm.trtllm_moe_alltoall" in profile.absent_modules:
        return ()
    return _FROM_A2A + (("moe_a2a_active_rank_mask",) if profile.eplb_and_rank_mask else ())


def __getattr__(name: str):
    if name in _a2a_names():
        from fakes.flashinfer.comm import trtllm_moe_alltoall

        return getattr(trtllm_moe_alltoall, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_a2a_names()))
