"""Layers only point down: impl imports neither fakes nor testbed, fakes never imports
testbed, and the scenario's independent side never imports impl (the reference not at all;
the model only impl's support table, to reject what the integration rejects)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules(path)}


@pytest.mark.parametrize("files, forbidden", [
    (sorted((ROOT / "impl").rglob("*.py")), {"fakes", "testbed"}),
    (sorted((ROOT / "fakes").rglob("*.py")), {"testbed", "impl"}),
    ([ROOT / "testbed/scenario/reference.py"], {"impl"}),
], ids=["impl", "fakes", "reference"])
def test_layering_imports_point_down(files, forbidden):
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) & forbidden) for f in files if _imports(f) & forbidden}
    assert not bad, bad


def test_layering_model_reads_only_the_support_table_of_impl():
    used = {m for m in _modules(ROOT / "testbed/scenario/model.py") if m.split(".")[0] == "impl"}
    assert used <= {"impl", "impl.parallel"}, used
