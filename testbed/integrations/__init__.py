"""The integrations under test, behind one seam the rank program and the invariants use
without knowing which one runs (:mod:`testbed.integrations.base`).

Each integration is one package (``testbed/integrations/<name>/``) whose face holds its
:class:`~testbed.integrations.base.Integration` as ``INTEGRATION``. :data:`REGISTRY` lists
them; importing this module registers each with the scenario model, which asks it for the
rules of its scenarios. Adding an engine is a new package and one line here; a package
outside this tree (a test's) joins with :func:`register`.
"""

from __future__ import annotations

import importlib

from testbed.integrations import impl, sglang, vllm
from testbed.integrations.base import Finding, Integration, Layer, Mutant, Session, Traits
from testbed.scenario import model

REGISTRY = (impl, vllm, sglang)

__all__ = ["Finding", "Integration", "Layer", "Mutant", "Session", "Traits", "engines", "get", "names",
           "module_of", "register"]
_modules: dict[str, str] = {}  # name -> the module whose INTEGRATION it is


def register(module_name: str) -> Integration:
    """Register the integration a module's ``INTEGRATION`` is (idempotent); returns it."""
    found = importlib.import_module(module_name).INTEGRATION
    _modules.setdefault(found.name, module_name)
    if _modules[found.name] != module_name:
        raise ValueError(f"integration {found.name!r} is {_modules[found.name]}'s; {module_name} names another")
    model.register_integration(found)
    return found


def get(name: str) -> Integration:
    return model.integration(name)


def names() -> tuple[str, ...]:
    return model.integration_names()


def engines() -> tuple[Integration, ...]:
    """The integrations that are another project's code."""
    return tuple(get(n) for n in names() if get(n).engine is not None)


def module_of(name: str) -> str:
    """The module a rank process imports to have integration ``name`` registered."""
    get(name)
    return _modules[name]


for _package in REGISTRY:
    register(_package.__name__)
