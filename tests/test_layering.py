"""Layers only point down: impl imports neither fakes nor testbed, fakes never imports
testbed, and the scenario's independent side (model, reference) never imports impl."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("files, forbidden", [
    (sorted((ROOT / "impl").rglob("*.py")), {"fakes", "testbed"}),
    (sorted((ROOT / "fakes").rglob("*.py")), {"testbed", "impl"}),
    ([ROOT / "testbed/scenario/reference.py", ROOT / "testbed/scenario/model.py"], {"impl"}),
], ids=["impl", "fakes", "reference"])
def test_layering_imports_point_down(files, forbidden):
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) & forbidden) for f in files if _imports(f) & forbidden}
    assert not bad, bad
