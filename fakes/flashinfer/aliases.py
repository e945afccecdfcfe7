"""``import flashinfer`` resolving to the fake: a drop-in for other projects' CI.

Inside :func:`install`, ``flashinfer`` and every ``flashinfer.<module>`` the chosen release
ships are the fake's modules (the same objects as ``fakes.flashinfer...``), a module the
release does not ship fails to import (and ``importlib.util.find_spec`` finds nothing) as it
does there, and nothing reaches a real FlashInfer that may be installed. Leaving the block restores ``sys.modules`` and the active profile.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import sys
from typing import Iterator

from fakes.flashinfer import profiles

REAL = "flashinfer"
FAKE = "fakes.flashinfer"


class _RefuseRealFlashInfer:
    """Last word on ``flashinfer.*`` names the fake does not provide for this release."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname == REAL or fullname.startswith(REAL + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _fake_modules() -> dict[str, object]:
    """Every module of the fake package, by its path under ``flashinfer`` ("" for the root)."""
    root = importlib.import_module(FAKE)
    found = {"": root}
    for info in pkgutil.walk_packages(root.__path__, FAKE + "."):
        found[info.name[len(FAKE) + 1:]] = importlib.import_module(info.name)
    return found


@contextlib.contextmanager
def install(profile: str) -> Iterator[profiles.Profile]:
    """Within the block, ``import flashinfer...`` gives the fake imitating ``profile``.

    Parameters
    ----------
    profile : str
        A FlashInfer release a profile serves, as pip prints it (``"0.7.2.post1"``).

    Yields
    ------
    Profile
        The active profile.

    Raises
    ------
    UnservedRelease
        A release no profile serves (a ``ValueError``; the message names those served).
    RuntimeError
        Already inside an ``install`` block.
    """
    served = profiles.resolve(profile)  # UnservedRelease (a ValueError) names what is served
    if any(isinstance(f, _RefuseRealFlashInfer) for f in sys.meta_path):
        raise RuntimeError("fakes.flashinfer.install is already active; leave that block first")
    modules = _fake_modules()
    absent = set(served.absent_modules) | set(modules[""].__fake_only_modules__)
    saved = {n: m for n, m in sys.modules.items() if n == REAL or n.startswith(REAL + ".")}
    for name in saved:
        del sys.modules[name]
    detached = []
    for path, module in modules.items():
        if any(path == a or path.startswith(a + ".") for a in absent):
            parent_path, _, leaf = path.rpartition(".")
            parent = modules[parent_path]
            if leaf in vars(parent):  # `from flashinfer.comm import x` must fail too
                detached.append((parent, leaf, vars(parent)[leaf]))
                delattr(parent, leaf)
            # None: `import` fails (ModuleNotFoundError) and importlib.util.find_spec answers
            # None, as for a module the release does not ship (engines probe with find_spec).
            sys.modules[f"{REAL}.{path}"] = None
            continue
        sys.modules[f"{REAL}.{path}" if path else REAL] = module
    finder = _RefuseRealFlashInfer()
    sys.meta_path.insert(0, finder)
    try:
        with profiles.fake_profile(profile) as active:
            yield active
    finally:
        # Entered without ``with`` and never left, the generator is closed at interpreter exit,
        # when there is nothing left to restore.
        if not sys.is_finalizing() and sys.meta_path is not None:
            _restore(finder, saved, detached)


def _restore(finder, saved: dict, detached: list) -> None:
    sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n == REAL or n.startswith(REAL + ".")]:
        del sys.modules[name]
    sys.modules.update(saved)
    for parent, leaf, value in detached:
        setattr(parent, leaf, value)
