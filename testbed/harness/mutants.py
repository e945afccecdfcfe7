"""Mutants applied at run time in the rank processes: each integration's catalogue
(:meth:`testbed.integrations.base.Integration.mutants`), looked up by name and applied here.

A mutant replaces one exact piece of one function's source (or, where the integration's
release writes that code differently, the same change in its form; where a release moved the
module or renamed the function, in the first of ``a|b:F|G`` it has) and recompiles that function in
its module (the file name and line numbers stay the real ones, so call sites and stacks still
point into the integration's code). A replacement that does not match exactly once is a
broken mutant (:class:`MutantError`), never a "killed" one. ``expect`` says how the testbed
must catch it: the name of an invariant (:mod:`testbed.harness.invariants`) and a piece of
its evidence; a scenario failing for another reason does not count. What scenarios cannot
reach (a refusal of bad input, a checkpoint) names the tests that must fail instead:
``("tests", name)`` with ``tests`` their pytest ids, run with ``A2A_MUTANT`` set.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap
from typing import Callable

from testbed import integrations
from testbed.integrations.base import Integration, Mutant


class MutantError(RuntimeError):
    """A mutant that cannot be applied as written (its source no longer matches the integration's)."""


def catalogue(integration: str) -> tuple[Mutant, ...]:
    """The mutants of ``integration``'s code."""
    return integrations.get(integration).mutants()


def owner_of(name: str) -> Integration:
    """The integration whose code mutant ``name`` changes."""
    for integration in map(integrations.get, integrations.names()):
        if any(m.name == name for m in integration.mutants()):
            return integration
    raise ValueError(f"unknown mutant {name!r}; `a2a-testbed mutants --list` names them")


def get(name: str) -> Mutant:
    return next(m for m in owner_of(name).mutants() if m.name == name)


def not_applicable(m: Mutant) -> tuple[str, str] | None:
    """``(kind, why)`` mutant ``m`` is not hunted on the release in use: its own probes'
    answer (:meth:`Mutant.not_applicable`), else ``unbuilt`` where the engine's module imports a
    package this host lacks (the scenarios reaching it are refused), else ``absent`` where an engine's release has no
    module or function the mutant targets (an older release, before the code was written; this
    project's own code always has its targets, and a mutant that misses one is broken)."""
    found = m.not_applicable()
    engine = owner_of(m.name).engine
    if found or engine is None:
        return found
    modules, paths = _target(m)
    unbuilt = [why for module in modules if (why := engine.unimportable(module))]
    if unbuilt and len(unbuilt) == len(modules):
        return "unbuilt", f"{unbuilt[0]}: no scenario reaches it here (the rules refuse them, naming it)"
    lacks = [engine.lacks(module, path) for module in modules for path in paths]
    return ("absent", f"{lacks[0]} (its code came later)") if all(lacks) else None


def _undecorated(function, name: str):
    """The function a decorator wrapped, whose source (decorator lines included) is the one
    to change: the changed source is then decorated again, as an edit of the file would be. A
    decorator keeps it as ``__wrapped__`` (``functools.wraps``) or in its wrapper's closure."""
    function = inspect.unwrap(function)
    for cell in function.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if inspect.isfunction(inner) and inner.__name__ == name and inner is not function:
            return _undecorated(inner, name)
    return function


def touches(m: Mutant, files: list[str]) -> bool:
    """Whether mutant ``m`` changes one of ``files`` (paths in a checkout or a pull request's
    diff: ``vllm/distributed/device_communicators/all2all.py``, ``python/sglang/srt/...``): a
    module its target may live in is that file, or the package whose ``__init__.py`` it is."""
    wanted = [f.replace("\\", "/").lstrip("./") for f in files]
    for module in _target(m)[0]:
        stem = module.replace(".", "/")
        if any(f == path or f.endswith("/" + path) for f in wanted for path in (f"{stem}.py", f"{stem}/__init__.py")):
            return True
    return False


def _target(m: Mutant) -> tuple[list[str], list[str]]:
    """The modules mutant ``m``'s target may live in and the function's paths in them
    (``a|b:F|G``: where a release moved or renamed it; the first the release has)."""
    modules, _, paths = m.target.partition(":")
    return modules.split("|"), paths.split("|")


def _importable(modules: list[str]):
    """Each of ``modules`` this release has, imported, in order."""
    found = []
    for name in modules:
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as e:
            if e.name is None or not name.startswith(e.name):
                raise
    if not found:
        importlib.import_module(modules[-1])  # raises what the last one raises
    return found


def apply(name: str) -> Callable[[], None]:
    """Patch the integration's code in this process with mutant ``name``; returns the function
    that undoes it."""
    m = get(name)
    modules, paths = _target(m)
    integration = owner_of(name)
    if integration.engine is None or integration.engine.name not in sys.modules:
        # What its code needs before it is imported here; once it is (an engine's own process
        # where it is served), the process has made its choices (vLLM's platform among them).
        integration.prepare_environment()
    homes = _importable(modules)
    for module, path in ((module, path) for module in homes for path in paths):
        *owner_path, attr = path.split(".")
        owner = module
        try:
            for part in owner_path:
                owner = getattr(owner, part)
            original = inspect.getattr_static(owner, attr)
            break
        except AttributeError:
            continue
    else:  # the release has moved or removed the target: broken here, never killed
        raise MutantError(f"mutant {name}: {m.target} is not in this release's "
                          f"{', '.join(module.__name__ for module in homes)}")
    # Its source has @property (or @classmethod): the function is what it wraps.
    function = original.fget if isinstance(original, property) else getattr(original, "__func__", original)
    function = _undecorated(function, attr)
    lines, first = inspect.getsourcelines(function)
    source = "".join(lines)
    counts = [(old, new, source.count(old)) for old, new in ((m.old, m.new),) + m.forms]
    found = [(old, new) for old, new, count in counts if count == 1]
    if not found:
        raise MutantError(f"mutant {name}: " + "; ".join(f"{old!r} occurs {count} times" for old, _, count in counts)
                          + f" in {m.target} (expected once)")
    old, new = found[0]
    mutated = textwrap.dedent(source.replace(old, new))
    if owner_path:  # a method: zero-argument super() needs the class cell a class body gives
        mutated = mutated.replace("super()", f"super({owner_path[-1]}, self)")
    namespace: dict = {}
    try:
        exec(compile("\n" * (first - 1) + mutated, inspect.getsourcefile(function), "exec"),
             module.__dict__, namespace)
        replacement = namespace[attr]
    except Exception as e:  # noqa: BLE001 - whatever it is, the mutant is broken, not killed
        raise MutantError(f"mutant {name}: the changed {m.target} does not compile: {type(e).__name__}: {e}") from e
    # Rebind every module's reference (``from impl.x import f`` copies the name), as an
    # edit of the file would reach every importer.
    # A module's own dict (what `from x import f` wrote), never its __getattr__: lazy modules
    # (transformers') import on attribute access.
    # (sys.modules may hold objects without a dict: SGLang's processes have some.)
    holders = [owner] + ([] if owner_path else [mod for mod in list(sys.modules.values())
                                               if mod is not owner and getattr(mod, "__dict__", {}).get(attr) is original])
    for holder in holders:
        setattr(holder, attr, replacement)

    def undo() -> None:
        for holder in holders:
            setattr(holder, attr, original)

    return undo
