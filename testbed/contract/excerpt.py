"""Small copies of a release's sources that keep exactly what the contract reads.

Python files keep their imports, ``__all__``, assignments, classes and signatures, with each
function body cut down to its ``return`` statements (the contract compares their shapes);
C++ files keep the lines the constant patterns match. The CPU suite compares the fake with
these checked-in copies, so the contract runs without the network or the multi-GB wheels.
"""

from __future__ import annotations

import ast
from pathlib import Path

from testbed.contract.compare import CONSTANT_PATTERNS
from testbed.contract.tree import RealTree
from testbed.contract.surface import RealModule, own_nodes, top_level

HEADER = ("Excerpt of FlashInfer {version} ({path}), Apache-2.0, (c) the FlashInfer authors:\n"
          "signatures, constants and return statements only, for the fake's contract test.")


def write_excerpt(tree: RealTree, out: Path) -> list[Path]:
    """Write, under ``out/flashinfer``, the excerpt of each file a comparison over ``tree``
    (``compare(source, profile, tree)``) read; returns the files written."""
    source = tree.source
    modules = {path: module for path, module in tree.modules()}
    written = []
    for rel, text in sorted(source.read_paths.items()):
        python = rel.endswith(".py")
        body = _python_excerpt(text, modules[rel]) if python else _cpp_excerpt(text)
        comment = "#" if python else "//"
        header = "".join(f"{comment} {line}\n" for line in HEADER.format(version=source.version, path=rel).splitlines())
        path = out / "flashinfer" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + body)
        written.append(path)
    dist = out / f"flashinfer_python-{source.version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Name: flashinfer-python\nVersion: {source.version}\n")
    return written


def _python_excerpt(text: str, module: RealModule) -> str:
    """Imports, ``__all__`` and the definitions the comparison resolved, stripped; every other
    top-level name only as an empty stub (so the module's list of public names is intact)."""
    body = []
    for node in top_level(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("flashinfer")):
            star = "*" + module.import_base(node)
            node.names = [a for a in node.names if (a.asname or a.name) in module.used
                          or (a.name == "*" and star in module.used)]
            if node.names:
                body.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body.append(node if node.name in module.whole else _strip(node) if node.name in module.used
                        else _stub(node))
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            body.append(node if name == "__all__" or name in module.used else
                        ast.Assign([ast.Name(name)], ast.Constant(None), lineno=0))
    return ast.unparse(ast.Module(body, [])) + "\n"


def _stub(node: ast.stmt) -> ast.stmt:
    if isinstance(node, ast.ClassDef):
        return ast.ClassDef(node.name, [], [], [ast.Expr(ast.Constant(...))], [], type_params=[])
    return ast.FunctionDef(node.name, ast.arguments([], [], None, [], [], None, []),
                           [ast.Expr(ast.Constant(...))], [], None, type_params=[], lineno=0)


def _strip(node: ast.stmt) -> ast.stmt:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        returns = [n for n in own_nodes(node) if isinstance(n, ast.Return)]
        # The attributes a method sets on self are what an instance has (the consumer contract
        # reads them); their values are not.
        attrs = sorted({t.attr for n in own_nodes(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"})
        sets = [ast.Assign([ast.Attribute(ast.Name("self"), a, ast.Store())], ast.Constant(None), lineno=0)
                for a in attrs]
        node.body = sets + returns or [ast.Expr(ast.Constant(...))]
    elif isinstance(node, ast.ClassDef):
        kept = [_strip(n) for n in node.body if isinstance(
            n, (ast.Assign, ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        node.body = kept or [ast.Expr(ast.Constant(...))]
    return node


def _cpp_excerpt(text: str) -> str:
    kept = [m.group(0) for pattern in CONSTANT_PATTERNS for m in pattern.finditer(text)]
    return "\n\n".join(kept) + "\n\n"


def excerpt_dirs(root: Path) -> list[Path]:
    """The excerpt directories under ``root`` (one per release)."""
    return sorted(p for p in root.iterdir() if (p / "flashinfer").is_dir()) if root.is_dir() else []
