"""Fake ``flashinfer.moe_ep.core.comm.communication`` (0.7.2, 0.7.4): the backend-neutral
sizing, the dispatch result, the ``MoEEpCommunication`` base (per release) and its registry.

The row contract every backend keeps: dispatch returns ``ep_size * tokens_per_rank`` rows
(rank-major; which row a token lands in is the backend's), each token at most once per rank
with its full top-k of GLOBAL ids; rows without a token carry ``invalid_expert_id`` in every
slot; combine sums each token's per-rank partial results on its source rank.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

import torch

from fakes import observe

# name -> registered classes, oldest first; a release sees the last one that belongs to it.
_COMMUNICATION_REGISTRY: dict[str, list[type["_Communication"]]] = {}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# Bytes of one token's dispatched activations (values and scale factors) per QuantFormat name;
# the order is the one the error message lists.
_DISPATCH_BYTES_PER_TOKEN: dict[str, Callable[[int], int]] = {
    "BF16": lambda h: 2 * h,
    "FP16": lambda h: 2 * h,
    "FP8PerTensor": lambda h: h,
    "DeepSeekFp8": lambda h: h + 4 * _ceil_div(h, 128),
    "MXFP8": lambda h: h + _ceil_div(h, 32),
    "NVFP4": lambda h: _ceil_div(h, 2) + _ceil_div(h, 16),
    "MXFP4": lambda h: _ceil_div(h, 2) + _ceil_div(h, 32),
}


@dataclass(frozen=True)
class MoEEpCommParams:
    """EP sizing shared by every backend: ``max_tokens_per_rank`` bounds what a rank dispatches
    in one call; ``hidden_size`` / ``dtype`` (default bf16) describe the unquantized row, which
    is also what combine takes; ``dispatch_format`` (a ``QuantFormat``, None for ``dtype``
    rows) sizes the dispatched bytes."""

    num_experts: int
    top_k: int
    max_tokens_per_rank: int
    hidden_size: int
    dtype: Optional[torch.dtype] = None
    dispatch_format: Optional[Any] = None
    invalid_expert_id: int = -1

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "max_tokens_per_rank", "hidden_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"MoEEpCommParams.{name} must be a positive int")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoEEpCommParams.top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if 0 <= self.invalid_expert_id < self.num_experts:
            raise ValueError("MoEEpCommParams.invalid_expert_id must lie outside "
                             f"[0, num_experts={self.num_experts}), got {self.invalid_expert_id}")
        if self.dispatch_format is not None:
            from fakes.flashinfer.fused_moe.api import QuantFormat

            if (not isinstance(self.dispatch_format, QuantFormat)
                    or self.dispatch_format.name not in _DISPATCH_BYTES_PER_TOKEN):
                raise ValueError("MoEEpCommParams.dispatch_format must be one of QuantFormat."
                                 f"{{{', '.join(_DISPATCH_BYTES_PER_TOKEN)}}} or None, got "
                                 f"{self.dispatch_format!r}")

    @property
    def token_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.dtype is None else self.dtype

    @property
    def dispatch_bytes_per_token(self) -> int:
        if self.dispatch_format is None:
            return self.hidden_size * self.token_dtype.itemsize
        return _DISPATCH_BYTES_PER_TOKEN[self.dispatch_format.name](self.hidden_size)


@dataclass(frozen=True)
class MoEEpDispatchResult:
    """Receive rows of one dispatch, ``ep_size * tokens_per_rank`` each (views into the
    backend's buffers, valid until the matching combine)."""

    hidden_states: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: Optional[torch.Tensor]
    tokens_per_rank: int
    hidden_states_scale: Optional[torch.Tensor] = None
    eplb_gathered_stats: Optional[torch.Tensor] = None


class _Communication(ABC):
    """One EP group's dispatch/combine backend; one dispatch/combine pair in flight. What
    0.7.2's and 0.7.4's bases share; ``_fake_profiles`` are the releases a class belongs to
    (None: every release, as for a backend a user registers)."""

    backend_name: ClassVar[str]
    supports_cuda_graph: ClassVar[bool] = True
    _fake_profiles: ClassVar[Optional[tuple[str, ...]]] = None

    def __init__(self, bootstrap, params: MoEEpCommParams) -> None:
        if not self.is_platform_supported():
            raise RuntimeError(f"{type(self).__name__} is not supported on this platform.")
        self.bootstrap = bootstrap
        self.params = params
        self.ep_rank = bootstrap.rank
        self.ep_size = bootstrap.world_size
        if params.num_experts % self.ep_size != 0:
            raise ValueError(f"{type(self).__name__} requires num_experts ({params.num_experts}) "
                             f"divisible by the EP size ({self.ep_size})")
        self.num_local_experts = params.num_experts // self.ep_size

    @classmethod
    @abstractmethod
    def is_platform_supported(cls) -> bool:
        """Whether this backend can run here (no collective work)."""

    @abstractmethod
    def combine(self, expert_output, *, output=None):
        """Each token's expert outputs summed over ranks, ``[local_num_tokens, hidden]``."""

    def get_combine_input_buffer(self, dtype):
        return None

    def destroy(self) -> None:  # noqa: B027 - the base has nothing to release
        """Release backend resources (collective, idempotent)."""


class MoEEpCommunication(_Communication, ABC):
    """0.7.2's base: ``dispatch(max_tokens_per_rank=...)``."""

    _fake_profiles = ("0.7.2",)

    def is_workload_feasible(self, max_tokens_per_rank: int) -> bool:
        return max_tokens_per_rank <= self.params.max_tokens_per_rank

    @abstractmethod
    def dispatch(self, hidden_states, topk_ids, topk_weights=None, *, hidden_states_scale=None,
                 max_tokens_per_rank=None, eplb_local_stats=None) -> MoEEpDispatchResult:
        """Send each token to the ranks owning its selected experts."""

    def _tokens_per_rank_for(self, max_tokens_per_rank: Optional[int]) -> int:
        tokens = self.params.max_tokens_per_rank if max_tokens_per_rank is None else max_tokens_per_rank
        if not 0 < tokens <= self.params.max_tokens_per_rank:
            raise ValueError(f"max_tokens_per_rank={tokens} must be in (0, {self.params.max_tokens_per_rank}]")
        return tokens


class MoEEpCommunication_0_7_4(_Communication, ABC):
    """0.7.4's base: ``dispatch(runtime_max_tokens_per_rank=...)``, at most the capacity."""

    _fake_profiles = ("0.7.4",)

    @abstractmethod
    def dispatch(self, hidden_states, topk_ids, topk_weights=None, *, hidden_states_scale=None,
                 runtime_max_tokens_per_rank=None, eplb_local_stats=None) -> MoEEpDispatchResult:
        """Send each token to the ranks owning its selected experts."""

    def _resolve_runtime_max_tokens_per_rank(self, runtime_max_tokens_per_rank: Optional[int]) -> int:
        capacity = self.params.max_tokens_per_rank
        if runtime_max_tokens_per_rank is None:
            return capacity
        if not 0 < runtime_max_tokens_per_rank <= capacity:
            raise ValueError(f"runtime_max_tokens_per_rank={runtime_max_tokens_per_rank} must be in (0, {capacity}]")
        return runtime_max_tokens_per_rank


MoEEpCommunication_0_7_4.__name__ = MoEEpCommunication_0_7_4.__qualname__ = "MoEEpCommunication"


def register_communication(name: str) -> Callable[[type[MoEEpCommunication]], type[MoEEpCommunication]]:
    """Class decorator registering a backend under ``name`` (the last registration wins)."""

    def decorator(cls: type[MoEEpCommunication]) -> type[MoEEpCommunication]:
        cls.backend_name = name
        _COMMUNICATION_REGISTRY.setdefault(name, []).append(cls)
        return cls

    return decorator


def communication_backend_name(backend: Any) -> str:
    name = getattr(backend, "backend_name", backend)
    if not isinstance(name, str):
        raise TypeError(f"backend must be a string or have a .backend_name str attr; got {backend!r}")
    return name


def _registered() -> dict[str, type[_Communication]]:
    """The backends of the active release, by name."""
    from fakes.flashinfer.profiles import active, chain

    releases = {p.name for p in chain(active())}
    found = {}
    for name, classes in _COMMUNICATION_REGISTRY.items():
        mine = [c for c in classes if c._fake_profiles is None or releases & set(c._fake_profiles)]
        if mine:
            found[name] = mine[-1]
    return found


def available_communication_backends() -> list[str]:
    return sorted(name for name, cls in _registered().items() if cls.is_platform_supported())


def create_communication(bootstrap, params: MoEEpCommParams, backend: Any, **options: Any) -> MoEEpCommunication:
    """The registered backend named by ``backend`` (a name, or a config with ``backend_name``,
    which is then passed as ``config``)."""
    name = communication_backend_name(backend)
    registered = _registered()
    cls = registered.get(name)
    if cls is None:
        raise KeyError(f"unknown communication backend {name!r}; available: {sorted(registered)}")
    if not isinstance(backend, str):
        options["config"] = backend
    communication = cls(bootstrap, params, **options)
    observe.emit("communication_built", communication=communication,
                 workspace_bytes=_workspace_bytes(communication))
    return communication


def _workspace_bytes(communication) -> int:
    """Bytes per rank of a communication's (main) workspace: 0.7.4's one-sided layout, 0.7.2's
    ``MoeAlltoAll`` or the two-sided FIFO (0 for a backend a user registered)."""
    metainfo = getattr(communication, "metainfo", None)
    if metainfo is not None:
        return int(metainfo[communication._index.WORKSPACE_SIZE_INDEX])
    alltoall = getattr(communication, "_alltoall", None)
    if alltoall is not None:
        return alltoall.workspace_size_per_rank
    workspace = getattr(communication, "_workspace", None)
    return 0 if workspace is None else workspace.size(1) * workspace.element_size()
