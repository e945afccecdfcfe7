"""Changes a scenario makes to the process it runs in, each returning what undoes it: a rank
runs many scenarios, and the next one must find the process as the last found it."""

from __future__ import annotations

import os
from typing import Callable


def attribute(owner, name: str, value) -> Callable[[], None]:
    """Set ``owner.name`` (a module's or, in place, a class's); returns what puts it back (a
    name served by a lookup, as the fake's per-profile names are, comes back by removing it)."""
    had, old = name in vars(owner), vars(owner).get(name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, old) if had else delattr(owner, name)


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
