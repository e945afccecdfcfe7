"""pytest plugin: ``pytest --fake-flashinfer=0.7.2`` runs the session with ``import flashinfer``
(and every ``flashinfer.<module>`` that release ships) resolving to the CPU fake, for an
inference engine's own CPU CI. Loaded through the ``pytest11`` entry point; inert without the
option. The fake is installed before test collection and removed when the session ends."""

from __future__ import annotations

import re


def pytest_addoption(parser):
    parser.addoption(
        "--fake-flashinfer", metavar="VERSION", default=None,
        help="resolve `import flashinfer` to the CPU fake of this release (0.6.8, 0.6.14, 0.6.16, 0.7.2)")


def pytest_configure(config):
    version = config.getoption("--fake-flashinfer")
    if version:
        from fakes.flashinfer import install

        block = install(re.sub(r"\.post\d+$", "", version))
        block.__enter__()
        config._fake_flashinfer_block = block


def pytest_unconfigure(config):
    block = getattr(config, "_fake_flashinfer_block", None)
    if block is not None:
        block.__exit__(None, None, None)
