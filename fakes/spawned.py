"""The fake in every Python process started below this one: an engine's API server, engine
cores and workers, a test's own spawned ranks, whoever starts them and however (``spawn``,
``forkserver``, ``subprocess``).

An engine binds its FlashInfer when it is first imported (SGLang's dispatcher sets
``use_flashinfer = False`` where ``import flashinfer`` fails), and its processes start with
``spawn``: the fake must be there before the first import of each, not patched in later.
:func:`enable` puts :data:`STARTUP_DIR` first on ``PYTHONPATH`` and names the release in
:data:`INSTALL_ENV`; its ``sitecustomize`` then installs the fake of that release
(:func:`fakes.flashinfer.install`) when each interpreter starts, before its main module.
Without :data:`INSTALL_ENV` the hook does nothing. A ``sitecustomize`` the directory shadows
(a distribution's own) runs after it, as if it were not there. With an arena prefix
(:data:`ARENA_ENV`, from :func:`fakes.arena.scenario_prefix` of the run's owner), every such
process joins the run's shared-memory arena, so the fake's NVLink memory is mapped by whoever
started the process; the owner's end (:func:`fakes.arena.unlink_prefix`, or
:func:`fakes.arena.sweep_orphans` once the owner is gone) removes its segments.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import MutableMapping

from fakes.accelerator import DEVICES_ENV, parse_count

INSTALL_ENV = "A2A_FAKE_FLASHINFER_EVERYWHERE"  # the release whose fake every started process installs
ARENA_ENV = "A2A_FAKE_ARENA_PREFIX"  # the run's segment-name prefix, which every started process joins
# A function ``module:name`` every started process calls once its fake is installed, before its
# main module: what the engine's own imports need in place on this host (stand-ins for
# packages a CPU host lacks), named by the run, never known here.
PREPARE_ENV = "A2A_FAKE_PREPARE"
ENVIRONMENT = (INSTALL_ENV, ARENA_ENV, DEVICES_ENV, PREPARE_ENV, "PYTHONPATH")  # what enable() and disable() change
STARTUP_DIR = Path(__file__).resolve().parent / "startup"
_installed = None  # this process's install() block, kept open for its life


def enable(release: str, environ: MutableMapping[str, str] = os.environ, arena: str | None = None,
           devices: int | None = None, prepare: str | None = None) -> None:
    """Make every Python process started with ``environ`` (this process's own by default)
    install the fake of ``release`` before anything else, join the arena of segment-name
    prefix ``arena`` where one is given, answer for ``devices`` accelerators where that is
    given (:func:`fakes.accelerator.install`), then call the function ``prepare``
    (``module:name``) names where one is given.

    Raises
    ------
    UnservedRelease
        ``release`` is one no profile serves (a ``ValueError`` naming those served).
    ValueError
        ``arena`` is not a prefix :func:`fakes.arena.scenario_prefix` makes, or ``devices`` is
        not a whole number >= 1.
    """
    from fakes.arena import PREFIX_ROOT
    from fakes.flashinfer.profiles import resolve

    resolve(release)
    if devices is not None:
        environ[DEVICES_ENV] = str(parse_count(devices, "devices"))
    else:
        environ.pop(DEVICES_ENV, None)
    if arena is not None:
        parts = arena.split("-")
        if len(parts) < 4 or parts[0] != PREFIX_ROOT or not parts[1].isdigit() or parts[-1] != "":
            raise ValueError(f"arena: {arena!r} is not a prefix fakes.arena.scenario_prefix(owner_pid, token) "
                             f"makes ('{PREFIX_ROOT}-<owner pid>-<token>-')")
        environ[ARENA_ENV] = arena
    else:
        environ.pop(ARENA_ENV, None)
    if prepare is not None:
        module, _, name = prepare.partition(":")
        if not (module and name):
            raise ValueError(f"prepare: {prepare!r} is not 'module:name'")
        environ[PREPARE_ENV] = prepare
    else:
        environ.pop(PREPARE_ENV, None)
    environ[INSTALL_ENV] = release
    environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR)] + _other_paths(environ))


def disable(environ: MutableMapping[str, str] = os.environ) -> None:
    """Undo :func:`enable` in ``environ``: processes started from now on are left alone."""
    for key in (INSTALL_ENV, ARENA_ENV, DEVICES_ENV, PREPARE_ENV):
        environ.pop(key, None)
    paths = _other_paths(environ)
    if paths:
        environ["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        environ.pop("PYTHONPATH", None)


def _other_paths(environ: MutableMapping[str, str]) -> list[str]:
    """``environ``'s ``PYTHONPATH`` entries but :data:`STARTUP_DIR`."""
    return [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(STARTUP_DIR)]


def install_here() -> None:
    """What the start-up hook does where :data:`INSTALL_ENV` names a release: install its fake
    in this process for good, join the run's arena where :data:`ARENA_ENV` names one, stand
    in for :data:`DEVICES_ENV` accelerators where it names a count, and call the function
    :data:`PREPARE_ENV` names. A release no profile
    serves, or a count that is none, ends the process (exit 2) with one line naming the
    variable: a process must never go on without the fake it was started for."""
    global _installed
    release = os.environ[INSTALL_ENV]
    from fakes.flashinfer import install

    block = install(release)
    try:
        block.__enter__()
        if os.environ.get(DEVICES_ENV):
            from fakes import accelerator

            accelerator.install(parse_count(os.environ[DEVICES_ENV]))
    except ValueError as e:
        sys.stderr.write(f"{INSTALL_ENV}={release}: {e} (process {os.getpid()}: {' '.join(sys.argv)})\n")
        sys.stderr.flush()
        os._exit(2)  # at start-up, before the main module: SystemExit here is a fatal error with a traceback
    _installed = block
    if os.environ.get(ARENA_ENV):
        from fakes.arena import ShmArena

        ShmArena(os.environ[ARENA_ENV]).activate()
        _register_what_is_created(os.environ[ARENA_ENV])
    if os.environ.get(PREPARE_ENV):
        import importlib

        module, _, name = os.environ[PREPARE_ENV].partition(":")
        getattr(importlib.import_module(module), name)()


def _register_what_is_created(prefix: str) -> None:
    """Every POSIX shared memory segment and named semaphore this process creates through
    ``multiprocessing`` (an engine's message queues, its locks under ``spawn``), and every file
    it creates in ``/dev/shm`` itself (SGLang's load snapshots), noted in the arena's register
    (:func:`fakes.arena.record_created`): a process killed before it unlinks them leaves them to
    the arena's end, never in ``/dev/shm`` for good."""
    from multiprocessing import shared_memory, synchronize

    from fakes.arena import SHM_DIR, record_created

    os_open = os.open

    def open_noting_shm(path, flags, *a, **k):
        name = os.path.basename(path)  # the arena's own files (its prefix) go with it anyway
        new = bool(flags & os.O_CREAT) and os.path.dirname(os.path.abspath(path)) == str(SHM_DIR) \
            and not name.startswith(prefix) and not os.path.exists(path)
        fd = os_open(path, flags, *a, **k)
        if new:
            record_created(prefix, "/" + name)
        return fd

    shm_init, sem_init = shared_memory.SharedMemory.__init__, synchronize.SemLock.__init__

    def shm(self, name=None, create=False, size=0, *a, **k):
        shm_init(self, name, create, size, *a, **k)
        if create:
            record_created(prefix, self._name)

    def sem(self, *a, **k):
        sem_init(self, *a, **k)
        name = getattr(self._semlock, "name", None)  # None: unlinked at once (fork), nothing left behind
        if name:
            record_created(prefix, "/sem." + name.lstrip("/"))

    shared_memory.SharedMemory.__init__ = shm
    synchronize.SemLock.__init__ = sem
    os.open = open_noting_shm

