"""pytest plugin: ``pytest --fake-flashinfer=0.7.2`` runs the session with ``import flashinfer``
(and every ``flashinfer.<module>`` that release ships) resolving to the CPU fake, for an
inference engine's own CPU CI. Loaded through the ``pytest11`` entry point; inert without the
option. The fake is installed before test collection and removed when the session ends; the
Python processes the tests start (``spawn``, ``subprocess``) install it too when they start
(:mod:`fakes.spawned`)."""

from __future__ import annotations

import os

import pytest

PROFILE_ENV = "A2A_FAKE_FLASHINFER_PROFILE"  # fakes.flashinfer.profiles.ENV, read without importing it


def pytest_addoption(parser):
    parser.addoption(
        "--fake-flashinfer", metavar="VERSION", default=None,
        help="resolve `import flashinfer` to the CPU fake of this release, as pip prints it (e.g. 0.7.2.post1); "
             "a release the fake does not serve is refused with the list of those it does")


def pytest_configure(config):
    version = config.getoption("--fake-flashinfer")
    if not version and not os.environ.get(PROFILE_ENV):
        return  # inert: the fake is not imported
    try:
        from fakes.flashinfer import install  # reads PROFILE_ENV
    except ValueError as e:  # a release no profile serves
        pytest.exit(str(e), returncode=2)
    if version:
        from fakes import spawned

        block = install(version)
        try:
            block.__enter__()
        except ValueError as e:
            pytest.exit(f"--fake-flashinfer: {e}", returncode=2)
        config._fake_flashinfer_block = block
        config._fake_flashinfer_environ = {k: os.environ.get(k) for k in spawned.ENVIRONMENT}
        spawned.enable(version)


def pytest_unconfigure(config):
    block = getattr(config, "_fake_flashinfer_block", None)
    if block is not None:
        block.__exit__(None, None, None)
        for key, value in config._fake_flashinfer_environ.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
