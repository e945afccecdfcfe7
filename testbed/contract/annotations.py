"""The parameter annotations of a release's public callables, as the fake checks calls with.

For every function and method the contract compares, each parameter's annotation as the
release's source writes it (``"Optional[torch.Tensor]"``), or, where it has none, its default
(``"=8"``: the argument must be of that kind), or ``""`` (nothing to check). The table of each
profile is checked in under ``fakes/flashinfer/annotations/`` (the fake reads it at run time,
never the release) and the contract compares it with the release, so it cannot drift.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Optional

from testbed.contract.surface import _ast_dataclass, dataclass_fields
from testbed.contract.tree import RealSide, RealTree

_CALLABLE = ("def ", "method ", "classmethod ", "staticmethod ")


def release_annotations(entries, tree: RealTree) -> dict[str, dict[str, str]]:
    """``{"comm.mapping.Mapping.__init__": {"world_size": "=1", ...}, ...}`` for every callable
    among the contract's ``entries`` (``Difference`` rows; keys under ``flashinfer.``, without it)."""
    real = RealSide(tree)
    table: dict[str, dict[str, str]] = {}
    for entry in entries:
        if " " in entry.key or not entry.real.startswith(_CALLABLE):
            continue
        params = _params_of(real, tree, entry.key)
        if params is not None:
            table[entry.key.removeprefix("flashinfer.")] = params
    return dict(sorted(table.items()))


def _params_of(real: RealSide, tree: RealTree, key: str) -> Optional[dict[str, str]]:
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
        module = tree(".".join(parts[:cut]))
        if module is not None:
            break
    else:
        return None
    path = tuple(parts[cut:])
    target = real._resolve(module, path)
    if target is None and path[-1] == "__init__":
        owner = real._resolve(module, path[:-1])
        if owner is not None and isinstance(owner[1], ast.ClassDef) and _ast_dataclass(owner[1]) is not None:
            return {f.target.id: _text(f.annotation, None) for f in dataclass_fields(*owner)}
        return None
    if target is None or not isinstance(target[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return _function_params(target[1])


def _function_params(fn: ast.FunctionDef) -> dict[str, str]:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = {}
    for arg, default in list(zip(positional, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults)):
        if arg.arg in ("self", "cls"):
            continue
        out[arg.arg] = _text(arg.annotation, default)
    return out


def _text(annotation: Optional[ast.expr], default: Optional[ast.expr]) -> str:
    if annotation is not None:
        return ast.unparse(annotation)
    if default is not None:
        try:
            ast.literal_eval(default)
        except ValueError:
            return ""  # a computed default says nothing checkable
        return "=" + ast.unparse(default)
    return ""


def table_path(profile: str) -> Path:
    from fakes.flashinfer import annotations

    return Path(annotations.__file__).parent / f"{profile}.json"


def write_table(profile: str, table: dict[str, dict[str, str]]) -> Path:
    path = table_path(profile)
    path.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    return path
