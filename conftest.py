"""Fixtures shared by ``tests/`` and ``gpu_tests/``: backend choice, the rank pool, leak
checks and Hypothesis profiles."""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from fakes.arena import PREFIX_ROOT, SHM_DIR

# `ci` is Hypothesis' own profile, loaded by Hypothesis itself when CI is set.
settings.register_profile(
    "dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "nightly", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
if os.environ.get("HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["HYPOTHESIS_PROFILE"])
elif not os.environ.get("CI"):
    settings.load_profile("dev")


def pytest_addoption(parser):
    parser.addoption(
        "--backend", choices=("fake", "flashinfer"), default=None,
        help="FlashInfer implementation under the integration: the CPU fake or the real package "
             "(default: flashinfer for gpu_tests/, which never fall back to the fake, else fake)",
    )


@pytest.fixture
def backend(request) -> str:
    """The backend chosen with ``--backend`` (by default the real one under ``gpu_tests/``);
    skips when the real one is asked for but absent."""
    in_gpu_tests = "gpu_tests" in Path(request.node.path).resolve().parts
    name = request.config.getoption("--backend") or ("flashinfer" if in_gpu_tests else "fake")
    if name == "flashinfer":
        pytest.importorskip("flashinfer", reason="--backend flashinfer needs flashinfer-python")
    return name


# `a2a-testbed mutants` runs the tests a mutant names with A2A_MUTANT set: the mutant then
# patches impl in this process and in every rank process, as an edit of impl/ would.
MUTANT = os.environ.get("A2A_MUTANT")
if MUTANT:
    from testbed.harness import mutants

    mutants.apply(MUTANT)


def _engine_installed(name: str) -> None:
    """Skip (with the reason) where ``--integration NAME`` cannot run; under
    ``A2A_REQUIRE_<NAME>`` (CI) that is a failure instead: those tests must run there."""
    from testbed import integrations

    why = integrations.get(name).engine.unavailable()
    if why:
        required = f"A2A_REQUIRE_{name.upper()}"
        if os.environ.get(required):
            pytest.fail(f"{required} is set but {why}")
        pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    _engine_installed("vllm")


@pytest.fixture(scope="session")
def sglang_installed() -> None:
    _engine_installed("sglang")


@pytest.fixture(scope="session")
def cluster():
    """A rank pool shared by every test of this pytest process (one per xdist worker)."""
    from testbed import integrations
    from testbed.harness.runner import scenario_pool

    initializer = functools.partial(mutants.apply, MUTANT) if MUTANT else None
    # An engine's import (vLLM ~5 s, SGLang ~3.5 s) once in this process's fork server where it is
    # installed, not once per rank; not through the environment, which every subprocess a test
    # starts would inherit.
    engines = tuple(i.engine.preload_module for i in integrations.engines()
                    if importlib.util.find_spec(i.engine.name) is not None)
    with scenario_pool(initializer=initializer, preload=engines) as pool:
        yield pool


def _own_segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{PREFIX_ROOT}-{os.getpid()}-*")}


@pytest.fixture
def no_leaks(cluster):
    """Fail the test if it leaves shared-memory segments or stray child processes behind."""
    before = _own_segments()
    yield cluster
    leaked = _own_segments() - before
    assert not leaked, f"shared-memory segments left in {SHM_DIR}: {sorted(leaked)}"
    workers = set(cluster.worker_pids)
    strays = [p for p in multiprocessing.active_children() if p.pid not in workers]
    assert not strays, f"child processes left running: {strays}"
    dead = [pid for pid in workers if not Path(f"/proc/{pid}").exists()]
    assert not dead, f"pool still lists dead workers: {dead}"
