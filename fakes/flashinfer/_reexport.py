"""Modules that re-export other fake modules' names, as the real package's shims and
``__init__`` files do: the same object, resolved per release at each access."""

from __future__ import annotations

import importlib
from typing import Callable

from fakes.flashinfer import profiles


def forwarding(module: str, homes: dict[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``module`` serving each name of ``homes`` from the fake
    module named there (``fakes.flashinfer.<home>``), where the active release has it there."""
    path = module.removeprefix("fakes.flashinfer").lstrip(".")

    def __getattr__(name: str):
        if name in homes and profiles.ships(path, name):
            return getattr(importlib.import_module(f"fakes.flashinfer.{homes[name]}"), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(module))) | {n for n in homes if profiles.ships(path, n)})

    return __getattr__, __dir__
