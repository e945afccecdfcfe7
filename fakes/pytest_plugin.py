"""pytest plugin: ``pytest --fake-flashinfer=0.7.2`` runs the session with ``import flashinfer``
(and every ``flashinfer.<module>`` that release ships) resolving to the CPU fake, for an
inference engine's own CPU CI. Loaded through the ``pytest11`` entry point; inert without the
option.

- The fake is installed before test collection and removed when the session ends; the Python
  processes the tests start (``spawn``, ``subprocess``) install it too when they start
  (:mod:`fakes.spawned`), and join the session's shared-memory arena, whose segments go when
  the session ends.
- ``--fake-devices N`` stands in for ``N`` accelerators in the session and in every process it
  starts (:mod:`fakes.accelerator`): an engine's multi-GPU tests of its all-to-all run on the
  CPU. A skip condition whose reason asks for ``SYS_PTRACE`` is lifted: the real workspaces
  pass file descriptors between processes (``pidfd_getfd``), the fake's are shared-memory
  files opened by name. A test that reaches what the stand-in cannot do (CUDA graphs) is
  reported as skipped, naming it.
"""

from __future__ import annotations

import os

import pytest

PROFILE_ENV = "A2A_FAKE_FLASHINFER_PROFILE"  # fakes.flashinfer.profiles.ENV, read without importing it
PTRACE = "SYS_PTRACE"


def pytest_addoption(parser):
    parser.addoption(
        "--fake-flashinfer", metavar="VERSION", default=None,
        help="resolve `import flashinfer` to the CPU fake of this release, as pip prints it (e.g. 0.7.2.post1); "
             "a release the fake does not serve is refused with the list of those it does")
    parser.addoption(
        "--fake-devices", metavar="N", default=None,
        help="with --fake-flashinfer: stand in for N accelerators (torch.accelerator, torch.cuda, cuda:N "
             "tensors on the CPU, NCCL as gloo) here and in every process the tests start")


def pytest_configure(config):
    version = config.getoption("--fake-flashinfer")
    devices = config.getoption("--fake-devices")
    if devices is not None and not version:
        pytest.exit("--fake-devices: needs --fake-flashinfer=VERSION (the stand-in serves the fake's tests)",
                    returncode=2)
    if not version and not os.environ.get(PROFILE_ENV):
        return  # inert: the fake is not imported
    try:
        from fakes.flashinfer import install  # reads PROFILE_ENV
    except ValueError as e:  # a release no profile serves
        pytest.exit(str(e), returncode=2)
    if not version:
        return
    from fakes import accelerator, spawned, stacks
    from fakes.arena import ShmArena, scenario_prefix

    if devices is not None:
        try:
            devices = accelerator.parse_count(devices, "--fake-devices")
        except ValueError as e:
            pytest.exit(str(e), returncode=2)
    block = install(version)
    try:
        block.__enter__()
    except ValueError as e:
        pytest.exit(f"--fake-flashinfer: {e}", returncode=2)
    config._fake_flashinfer_block = block
    config._fake_flashinfer_environ = {k: os.environ.get(k) for k in spawned.ENVIRONMENT}
    arena = ShmArena(scenario_prefix(os.getpid(), "pytest"))
    arena.activate()
    config._fake_flashinfer_arena = arena
    spawned.enable(version, arena=arena.prefix, devices=devices)
    stacks.on_signal()
    if devices is not None:
        accelerator.install(devices)


def pytest_report_header(config):
    if getattr(config, "_fake_flashinfer_block", None) is None:
        return None
    lines = [f"flashinfer: the CPU fake of {config.getoption('--fake-flashinfer')} (a2a-testbed), "
             f"in this process and every process it starts"]
    devices = config.getoption("--fake-devices")
    if devices is not None:
        lines.append(f"accelerators: {devices} CPU stand-ins (cuda:N tensors on the CPU, NCCL as gloo); "
                     f"{PTRACE} not needed (the fake shares workspaces by name, no pidfd_getfd)")
    return lines


def pytest_collection_modifyitems(config, items):
    """Lift the skip conditions that ask for ``SYS_PTRACE``, where the stand-in runs."""
    if config.getoption("--fake-devices") is None or getattr(config, "_fake_flashinfer_block", None) is None:
        return
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if not _asks_ptrace(m)]


def _asks_ptrace(mark) -> bool:
    # skipif(condition, reason=...); skip(reason) or skip(reason=...)
    reason = mark.kwargs.get("reason", mark.args[0] if mark.name == "skip" and mark.args else "")
    return mark.name in ("skipif", "skip") and PTRACE in str(reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed on what the accelerator stand-in cannot do is a skip naming it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        from fakes.accelerator import NeedsAccelerator

        text = str(call.excinfo.value)
        at = text.find(NeedsAccelerator.MARK)
        if at >= 0:
            need = text[at:].splitlines()[0]
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {need}")


def pytest_unconfigure(config):
    block = getattr(config, "_fake_flashinfer_block", None)
    if block is None:
        return
    block.__exit__(None, None, None)
    for key, value in config._fake_flashinfer_environ.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    arena = config._fake_flashinfer_arena
    arena.close()
    arena.sweep()
