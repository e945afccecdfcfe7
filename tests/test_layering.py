"""Layers only point down, and no module imports itself back through others.

From the bottom: ``fakes`` (the CPU FlashInfer) and ``impl`` (the integration under test, which
reaches the fake neither by import nor by string: a caller hands it the fake's package);
``testbed.cluster`` and ``testbed.contract``; ``testbed.scenario``, the data and the oracle (the
model reads only impl's support table and names no integration; the reference never imports
impl); ``testbed.integrations``, which never import the harness; ``testbed.harness`` (the rank
program, recorders, invariants, runner, matrix, fuzz loop, reports); the command line and the
benchmarks on top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("impl", "fakes", "testbed")


def _modules(path: Path) -> set[str]:
    """Every module ``path`` imports (anywhere in it, deferred imports too), by dotted name."""
    names = set()
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _strings(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def _files(*parts: str) -> list[Path]:
    return sorted(ROOT.joinpath(*parts).rglob("*.py"))


def _under(names: set[str], *prefixes: str) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("where, forbidden", [
    (("impl",), ("fakes", "testbed")),
    (("fakes",), ("testbed", "impl")),
    (("testbed", "cluster"), ("testbed.scenario", "testbed.integrations", "testbed.harness", "testbed.contract")),
    (("testbed", "contract"), ("testbed.scenario", "testbed.integrations", "testbed.harness")),
    (("testbed", "scenario"), ("testbed.integrations", "testbed.harness", "testbed.cli", "testbed.bench")),
    (("testbed", "integrations"), ("testbed.harness", "testbed.cli", "testbed.bench")),
    (("testbed", "scenario", "reference.py"), ("impl",)),
], ids=["impl", "fakes", "cluster", "contract", "scenario", "integrations", "reference"])
def test_layering_imports_point_down(where, forbidden):
    files = [ROOT.joinpath(*where)] if where[-1].endswith(".py") else _files(*where)
    bad = {str(f.relative_to(ROOT)): _under(_modules(f), *forbidden) for f in files if _under(_modules(f), *forbidden)}
    assert not bad, bad


def test_layering_impl_never_names_the_fake_by_string():
    """Not by an import path handed to importlib either: the fake is given to impl, not found by it."""
    bad = {str(f.relative_to(ROOT)): sorted(s for s in _strings(f) if s == "fakes" or s.startswith("fakes."))
           for f in _files("impl")}
    assert not {k: v for k, v in bad.items() if v}


def test_layering_model_reads_only_the_support_table_of_impl():
    used = {m for m in _modules(ROOT / "testbed/scenario/model.py") if m.split(".")[0] == "impl"}
    assert used <= {"impl", "impl.parallel"}, used


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports: ``from package import name`` is an edge to
    the submodule where ``name`` is one, else to the package's face."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): f
             for p in PACKAGES for f in _files(p)}
    graph = {}
    for name, f in files.items():
        imported = _modules(f) & files.keys()
        # ``from m import sub``: the submodule is the edge, not m's face
        faces = {m for m in imported if any(other.startswith(m + ".") for other in imported)}
        graph[name] = imported - faces - {name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_layering_no_import_circles():
    graph = _graph()
    assert "testbed.scenario.model" in graph["testbed.integrations"]  # the graph sees imports
    assert not _circles(graph)


def test_layering_circle_check_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
