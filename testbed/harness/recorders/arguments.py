"""Every argument the integration passes straight to the fake's public API, checked against the
release's annotations (or defaults), each violation logged with its call site."""

from __future__ import annotations

import functools
import importlib
import inspect

from testbed import patch
from testbed.harness import audit
from testbed.scenario.events import ArgumentRefused, EventLog


def recording_arguments(profile: str, log: EventLog, cleanup) -> None:
    """Every public callable of the fake whose parameters the release annotates (or gives a
    literal default), wrapped for the scenario so that each argument the integration passes it
    directly and its release rules out is logged with its call site (``arguments``): a function
    for a count, a list for a tensor, another enum. The table is the release's own
    (:mod:`fakes.flashinfer.annotations`); calls the fake makes itself are not checked."""
    from fakes.flashinfer.annotations import table

    done: set = set()  # (holder, attribute): every path a name is exported by gets the check
    for qualname, rules in table(profile).items():
        if not any(rules.values()):
            continue
        found = _fake_callable(qualname)
        if found is None:
            continue
        module, owner, attr, raw = found
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if (id(owner), attr) in done or not callable(fn):
            continue
        done.add((id(owner), attr))
        checked = _checking(fn, qualname, module, log)
        wrapped = type(raw)(checked) if isinstance(raw, (staticmethod, classmethod)) else checked
        cleanup(patch.attribute(owner, attr, wrapped))


def _fake_callable(qualname: str):
    """``(module, owner, attribute, raw object)`` of the fake's ``qualname`` under the active
    profile (``owner``: the module or the class that holds it), or None."""
    found = _fake_module_of(qualname)
    if found is None:
        return None
    module, path = importlib.import_module(found[0]), found[1]
    owner = module
    try:
        for attr in path[:-1]:
            owner = getattr(owner, attr)
        raw = inspect.getattr_static(owner, path[-1]) if inspect.isclass(owner) else getattr(owner, path[-1])
    except AttributeError:
        return None
    return module, owner, path[-1], raw


@functools.lru_cache(maxsize=None)
def _fake_module_of(qualname: str):
    """``(the fake module's name, the path under it)`` of ``qualname``: the longest prefix that
    is a module (cached: a failed import searches every path entry)."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        name = ".".join(["fakes.flashinfer"] + parts[:cut])
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name, tuple(parts[cut:])
    return None


def _checking(fn, qualname: str, module, log: EventLog):
    from fakes.flashinfer.annotations import violations

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if _Checking.depth:  # inside another checked call (a recorder's method calling its base's)
            return fn(*args, **kwargs)
        site = audit.direct_integration_call_site()
        if site is not None:
            for param, value, rule in violations(qualname, fn, args, kwargs, _Names(module)):
                log.write(ArgumentRefused(call=f"flashinfer.{qualname}", param=param, value=value, expected=rule, site=site))
        _Checking.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _Checking.depth -= 1

    return checked


class _Checking:
    depth = 0  # a rank runs one scenario on one thread


class _Names:
    """The names an annotation of ``module`` can mean: the module's, then the package root's."""

    def __init__(self, module):
        self.module = module

    def get(self, name: str):
        import fakes.flashinfer as root

        for where in (self.module, root):
            try:
                return getattr(where, name)
            except AttributeError:
                continue
        return None
