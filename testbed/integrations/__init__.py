"""The integrations under test, behind one seam the rank program and the invariants use
without knowing which one runs.

An integration is the code that drives FlashInfer's all-to-all from an inference engine:
``impl`` (this project's reference re-creation of the seed pull requests), ``vllm`` (the
installed vLLM's own classes) or ``sglang`` (the installed SGLang's own dispatcher). Each is a :class:`Integration`: it stands up its engine's state
on a rank (:meth:`Integration.start`), builds each MoE layer around the testbed's experts,
and brackets every forward pass and every layer call as its engine does. What the invariants
need from it besides the event log is declared, not inferred from its name (:class:`Traits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ContextManager, Protocol

import torch

INTEGRATIONS = ("impl", "vllm", "sglang")
ENGINES = ("vllm", "sglang")  # the integrations that are another project's code


@dataclass(frozen=True)
class Traits:
    """What an integration promises that the invariants check it against.

    ``shared_communication``: one ``moe_ep`` communication for every layer of the EP group,
    replaced (never shrunk) when a layer needs more (vLLM's manager), instead of one per
    layer sizing (impl's). ``barrier_after_build``: the integration itself barriers on the EP
    group after building a communication, before a layer uses it. ``code``: the integration's
    source as ``(real path prefix, shown name)`` pairs: collectives from these frames are its.
    ``fixed_capacity``: one ``MoeAlltoAll`` per layer, all at one token capacity, sharing a
    workspace through FlashInfer's size-keyed cache (SGLang's), instead of one grown to each
    layer's need. ``combine_output``: the integration probes combine for ``output=`` and
    passes it wherever the release takes it (impl's); one that never does is not wrong.
    """

    shared_communication: bool
    barrier_after_build: bool
    code: tuple[tuple[str, str], ...]
    fixed_capacity: bool = False
    combine_output: bool = True


class Layer(Protocol):
    """One MoE layer as the integration built it: ``layer(x_TH, w_TK, ids_TK) -> [T, H]``."""

    sequence_parallel: bool
    reduce_pending: bool

    def output_is_reduced(self) -> bool: ...

    def __call__(self, x_TH: torch.Tensor, w_TK: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor: ...


class Session(Protocol):
    """An integration on one rank for one scenario."""

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts) -> Layer: ...

    def forward_pass(self, num_tokens: int) -> ContextManager[None]:
        """The engine's state around one forward pass of this rank's stage (``num_tokens``:
        this rank's tokens in it)."""

    def layer_call(self, num_tokens: int) -> ContextManager[None]:
        """Around one layer's call inside a forward pass."""


class Integration(Protocol):
    name: str

    def traits(self, scenario) -> Traits: ...

    def start(self, ctx, scenario, api, log) -> Session: ...


def get(name: str) -> Integration:
    if name == "impl":
        from testbed.integrations.impl import IMPL

        return IMPL
    if name == "vllm":
        from testbed.integrations.vllm import VLLM

        return VLLM
    if name == "sglang":
        from testbed.integrations.sglang import SGLANG

        return SGLANG
    raise ValueError(f"unknown integration {name!r}; one of {', '.join(INTEGRATIONS)}")


def engine(name: str):
    """The adapter module of engine ``name`` (its ``use``, ``unavailable``, ``prepare_environment``)."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINES)}")
    import importlib

    return importlib.import_module(f"testbed.integrations.{name}")
