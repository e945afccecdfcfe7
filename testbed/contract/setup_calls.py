"""The communicator calls a release's MNNVL set-up makes, read from its source.

``MnnvlMemory.open_mnnvl_memory`` (and every helper of ``comm/mnnvl.py`` it reaches) is
walked in evaluation order; each call of a ``CommBackend`` method on the communicator is one
step. The path is the one the fake's machine takes: FABRIC handles (the fake's shared memory
stands in for them). A step under a cache (``if X is not None: return X`` first in its
function) is ``once`` (the first set-up of a process), one under any other condition is
``maybe`` (a new address range: the first allocation, then when one fills up). The integration's
``CommBackend`` sees these calls in this order on hardware, so the fake must make them too,
and every scenario checks that it did (the ``setup-calls`` invariant).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, Optional

from testbed.contract.tree import RealTree

COMM_METHODS = ("Get_rank", "Get_size", "allgather", "bcast", "barrier", "Split")
_MAX_DEPTH = 8

# What each release's source says (the contract re-reads it and compares): the steps of one
# open_mnnvl_memory, FABRIC path (a release without an entry: its profile's base's). 0.6.15 moved
# the handle export into _create_and_map_handles (which asks rank and size again); 0.6.16 added
# the fabric-support vote (cached per process); 0.7.4 votes on the handle type at every
# allocation and agrees on errors before and after the import.
_OPEN = ("Get_rank", "Get_size", "allgather")
SETUP_CALLS: dict[str, tuple[str, ...]] = {
    "0.6.8": _OPEN + ("Get_size (maybe)", "allgather"),
    "0.6.15": _OPEN + ("Get_size (maybe)", "Get_rank", "Get_size", "allgather"),
    "0.6.16": _OPEN + ("allgather (once)", "Get_size (maybe)", "Get_rank", "Get_size", "allgather"),
    "0.7.4": _OPEN + ("Get_size (maybe)", "allgather", "Get_rank", "Get_size", "allgather", "allgather", "allgather"),
}


def expected(release: str) -> tuple[str, ...]:
    """The steps the fake must make under ``release`` (a profile, or a release one serves)."""
    from fakes.flashinfer.profiles import pick, resolve

    return pick(SETUP_CALLS, resolve(release))


@dataclass(frozen=True)
class Step:
    method: str
    when: str = "always"  # always | once | maybe

    def __str__(self) -> str:
        return self.method if self.when == "always" else f"{self.method} ({self.when})"


def release_setup_calls(tree: RealTree) -> Optional[tuple[Step, ...]]:
    """The steps of ``MnnvlMemory.open_mnnvl_memory`` in the release, or None without it."""
    module = tree("flashinfer.comm.mnnvl")
    if module is None:
        return None
    functions = _functions(module.defs)
    if "MnnvlMemory.open_mnnvl_memory" not in functions:
        return None
    walked: set[str] = set()
    steps = tuple(_walk(functions["MnnvlMemory.open_mnnvl_memory"].body, functions, "always", 0,
                        ("MnnvlMemory.open_mnnvl_memory",), walked))
    module.whole |= {name.split(".")[0] for name in walked | {"MnnvlMemory.open_mnnvl_memory"}}
    module.used |= {name.split(".")[0] for name in walked | {"MnnvlMemory.open_mnnvl_memory"}}
    return steps


def matches(pattern: tuple[str, ...], calls: list[str], first: bool) -> bool:
    """Whether ``calls`` (one open's communicator calls, in order) follow ``pattern``; ``first``:
    the first set-up of the process, where the ``once`` steps run."""
    steps = [(p.split(" (")[0], p.split(" (")[1].rstrip(")") if " (" in p else "always") for p in pattern]

    def match(i: int, j: int) -> bool:
        if i == len(steps):
            return j == len(calls)
        method, when = steps[i]
        here = j < len(calls) and calls[j] == method
        if when == "always" or (when == "once" and first):
            return here and match(i + 1, j + 1)
        if when == "once":
            return match(i + 1, j)
        return (here and match(i + 1, j + 1)) or match(i + 1, j)  # maybe

    return match(0, 0)


def _functions(defs: dict) -> dict[str, ast.FunctionDef]:
    out = {}
    for name, node in defs.items():
        if isinstance(node, ast.FunctionDef):
            out[name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[f"{node.name}.{item.name}"] = item
    return out


def _walk(body: list[ast.stmt], functions: dict, when: str, depth: int, stack: tuple,
          walked: set) -> Iterator[Step]:
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstrings
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            if "FABRIC" in test:  # the fake's machine exports FABRIC handles
                fabric = "==" in test or ("!=" not in test and "not " not in test)
                yield from _walk(stmt.body if fabric else stmt.orelse, functions, when, depth, stack, walked)
                continue
            returns = bool(stmt.body) and isinstance(stmt.body[-1], ast.Return)
            if "is not None" in test and returns:
                if i == 0:
                    when = "once"  # a cached result: the rest runs on a process's first call
                    continue
                yield from _calls(stmt.test, functions, when, depth, stack, walked)
                yield from _walk(stmt.body, functions, when, depth, stack, walked)
                return  # the success path (what was made is there): the fallback after it never runs
            yield from _calls(stmt.test, functions, when, depth, stack, walked)
            inner = "maybe" if when == "always" else when
            yield from _walk(stmt.body, functions, inner, depth, stack, walked)
            yield from _walk(stmt.orelse, functions, inner, depth, stack, walked)
        elif isinstance(stmt, ast.Try):
            yield from _walk(stmt.body, functions, when, depth, stack, walked)
            yield from _walk(stmt.finalbody, functions, when, depth, stack, walked)
        elif isinstance(stmt, (ast.For, ast.While, ast.With)):
            for expr in (getattr(stmt, "iter", None), getattr(stmt, "test", None)):
                if expr is not None:
                    yield from _calls(expr, functions, when, depth, stack, walked)
            yield from _walk(stmt.body, functions, when, depth, stack, walked)
        elif not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            yield from _calls(stmt, functions, when, depth, stack, walked)


def _calls(node: ast.AST, functions: dict, when: str, depth: int, stack: tuple, walked: set) -> Iterator[Step]:
    """The steps of the calls in ``node``, arguments before the call that takes them."""
    for call in _in_evaluation_order(node):
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in COMM_METHODS and _is_comm(func.value):
            yield Step(func.attr, when)
            continue
        target = _callee(func, functions)
        if target is not None and target not in stack and depth < _MAX_DEPTH:
            walked.add(target)
            yield from _walk(functions[target].body, functions, when, depth + 1, stack + (target,), walked)


def _in_evaluation_order(node: ast.AST) -> list[ast.Call]:
    out: list[ast.Call] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.Lambda, ast.FunctionDef)):
            return
        for child in ast.iter_child_nodes(n):
            visit(child)
        if isinstance(n, ast.Call):
            out.append(n)

    visit(node)
    return out


def _is_comm(node: ast.expr) -> bool:
    """The communicator: a name ``comm``/``comm_backend``, or ``x.comm`` (``ex.comm.allgather``)."""
    text = ast.unparse(node)
    return text.split(".")[-1] in ("comm", "comm_backend", "_comm")


def _callee(func: ast.expr, functions: dict) -> Optional[str]:
    if isinstance(func, ast.Name) and func.id in functions:
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        name = f"{func.value.id}.{func.attr}"
        if name in functions:
            return name
    return None
