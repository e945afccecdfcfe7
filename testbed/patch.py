"""Changes a scenario makes to the process it runs in, each returning what undoes it: a rank
runs many scenarios, and the next one must find the process as the last found it."""

from __future__ import annotations

import os
from typing import Callable


UNBOUND = object()  # as a value of attribute(): the name is removed (a fresh import would not bind it)


def attribute(owner, name: str, value) -> Callable[[], None]:
    """Set ``owner.name`` (a module's or, in place, a class's), or remove it for ``UNBOUND``;
    returns what puts it back (a name served by a lookup, as the fake's per-profile names are,
    comes back by removing it)."""
    had, old = name in vars(owner), vars(owner).get(name)
    if value is UNBOUND:
        if had:
            delattr(owner, name)
    else:
        setattr(owner, name, value)

    def undo() -> None:
        if had:
            setattr(owner, name, old)
        elif name in vars(owner):
            delattr(owner, name)

    return undo


def environment(values: dict[str, str]) -> Callable[[], None]:
    """Set these environment variables; returns what restores them (or removes them again)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    return restore
