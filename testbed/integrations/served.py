"""What every engine's serving plugin does the same way in the engine's own processes
(``a2a-testbed serve``): act only in a process of a served run, blame the testbed for its own
errors, read the run's plan, and write each rank's steps.

The plan (``plan.json`` in the run's directory, written by :mod:`testbed.harness.serve`)
names a function for each process as it starts (``start_process``: the run's mutant) and one
for each rank once the engine's groups form (``start_rank``: its recorders; it returns the
rank's event log).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os

from testbed.integrations.engine import SERVE_RUN_ENV


def run_dir() -> str | None:
    """This process's served run's directory, or None outside a served run."""
    return os.environ.get(SERVE_RUN_ENV) or None


@contextlib.contextmanager
def testbed_errors(directory: str):
    """What the testbed's own code raises in an engine process, written where the serving
    command reads it (``testbed-error``), so that the report blames the testbed, never the
    engine; then raised on, as the engine would see it."""
    try:
        yield
    except BaseException as e:
        with open(os.path.join(directory, "testbed-error"), "a") as f:
            f.write(f"process {os.getpid()}: {type(e).__name__}: {e}\n")
        raise


_applied = False


def apply_once(glue, on_groups) -> None:
    """A serving plugin's body, in a process of a served run only and once per process (an
    engine loads its plugins once; a second load changes nothing): ``glue()``, the plan's
    ``start_process`` (the run's mutant), then, where the plan names ``start_rank``,
    ``on_groups(run directory, plan)`` (which installs each rank's recorders once the engine's
    groups form); the testbed's errors written down (:func:`testbed_errors`)."""
    global _applied
    directory = run_dir()
    if directory is None or _applied:
        return
    _applied = True
    with testbed_errors(directory):
        glue()
        run = plan(directory)
        if run["start_process"]:
            named(run["start_process"])(directory)
        if run["start_rank"]:
            on_groups(directory, run)


class ProcessLife:
    """What the engine level's helpers take as a scenario's context, where the scenario is the
    process's life: nothing is undone."""

    def add_cleanup(self, fn) -> None:
        pass


def plan(directory: str) -> dict:
    with open(os.path.join(directory, "plan.json")) as f:
        return json.load(f)


def named(ref: str):
    """The function ``module:name`` names."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


class Steps(list):
    """A rank's MoE layer calls as they come, ``(layer, rows, DP token counts)``, one JSON line
    each in ``steps<rank>.jsonl`` (what :func:`testbed.harness.serve` reads as the rank's steps)."""

    def __init__(self, directory: str, rank: int):
        super().__init__()
        self._fd = os.open(os.path.join(directory, f"steps{rank}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, item) -> None:
        layer, rows, counts = item
        os.write(self._fd, (json.dumps([layer, rows, list(counts) if counts is not None else None]) + "\n").encode())


def write_answers(directory: str, dp_rank: int, answers: dict) -> None:
    """A DP rank's answers to the run's requests where the engine's own processes generate them
    (offline data parallel): ``{request: {"ids", "top2", "prompt_logprobs"}}``."""
    with open(answers_path(directory, dp_rank), "w") as f:
        json.dump({str(i): a for i, a in answers.items()}, f)


def answers_path(directory: str, dp_rank: int) -> str:
    return os.path.join(directory, f"answers{dp_rank}.json")
