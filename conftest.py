"""Fixtures shared by ``tests/`` and ``gpu_tests/``: backend choice, the rank pool, leak
checks and Hypothesis profiles."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import multiprocessing
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional

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


# The optional parts a test may need (``@pytest.mark.needs(PART, ...)``): where one is missing
# the test skips, naming the part and what installs it; under the part's ``A2A_REQUIRE_*`` (CI)
# that is a failure instead. Tests needing an engine, or a package that comes only with an
# engine's set, are also marked ``engines``: the tier `.ci/run` runs after installing them.
def _engine_missing(name: str):
    from testbed import integrations

    return integrations.get(name).engine.unavailable()


def _module_missing(module: str, install: str):
    def missing():
        return None if importlib.util.find_spec(module) else f"{module} is not installed: {install}"
    return missing


def _chromium_missing():
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        return None
    return "headless Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"


@dataclasses.dataclass(frozen=True)
class Part:
    missing: Callable[[], Optional[str]]  # why it is absent, or None
    require_env: str
    engines: bool = False  # comes with `./dev setup --vllm` / `--sglang`


PARTS = {
    "vllm": Part(functools.partial(_engine_missing, "vllm"), "A2A_REQUIRE_VLLM", engines=True),
    "sglang": Part(functools.partial(_engine_missing, "sglang"), "A2A_REQUIRE_SGLANG", engines=True),
    # vLLM's engine level writes and loads checkpoints with them; they come with vLLM's set.
    "safetensors": Part(_module_missing("safetensors", "`./dev setup --vllm` installs it with vLLM's set"),
                        "A2A_REQUIRE_VLLM", engines=True),
    "transformers": Part(_module_missing("transformers", "`./dev setup --vllm` installs it with vLLM's set"),
                         "A2A_REQUIRE_VLLM", engines=True),
    "ray": Part(_module_missing("ray", "`./dev setup` installs the ray extra (pip install -e '.[ray]')"),
                "A2A_REQUIRE_RAY"),
    "chromium": Part(_chromium_missing, "A2A_REQUIRE_CHROMIUM"),
}


def need(part: str) -> None:
    """Skip the running test where ``part`` is missing (fail under its ``A2A_REQUIRE_*``)."""
    why = PARTS[part].missing()
    if why:
        if os.environ.get(PARTS[part].require_env):
            pytest.fail(f"{PARTS[part].require_env} is set but {why}")
        pytest.skip(why)


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(*parts): the optional parts the test needs: " + ", ".join(PARTS))
    config.addinivalue_line("markers", "engines: needs an engine or its set (`./dev setup --vllm --sglang`)")


def _needed(item) -> list[str]:
    parts = [p for m in item.iter_markers("needs") for p in m.args]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.needs: unknown part(s) {unknown}; known: {list(PARTS)}")
    return parts


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(PARTS[p].engines for p in _needed(item)):
            item.add_marker(pytest.mark.engines)


def pytest_runtest_setup(item):
    for part in _needed(item):
        need(part)


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


def _flashinfer_bound() -> dict[str, int]:
    return {n: id(m) for n, m in sys.modules.items() if n == "flashinfer" or n.startswith("flashinfer.")}


@pytest.fixture(autouse=True)
def flashinfer_names_restored():
    """A test leaves ``import flashinfer`` in this process as it found it: a name it left bound
    (a package of its own, the fake under the real name) is what a later test on the same
    xdist worker would import, passing or failing by the order tests are dealt in."""
    before = _flashinfer_bound()
    yield
    after = _flashinfer_bound()
    assert after == before, f"the test left flashinfer modules bound in sys.modules: " \
                            f"{sorted(n for n in after if before.get(n) != after[n])[:5]}"


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
