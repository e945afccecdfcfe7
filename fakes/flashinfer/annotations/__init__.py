"""Arguments checked against the real release's annotations.

``<profile>.json`` holds, for every public callable of that release the contract compares,
each parameter's annotation as the release writes it (``"Optional[torch.Tensor]"``), its
default where it has no annotation (``"=8"``: an argument of that kind), or ``""``. The
contract regenerates and compares these tables (``a2a-testbed contract --write-annotations``);
here they are only read. :func:`violations` names each argument of a call that its
annotation rules out: a function for an ``int``, a list for a ``torch.Tensor``, another enum.
Annotations this reading cannot decide (``Any``, ``Callable``, unknown names) pass.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import json
import numbers
from pathlib import Path
from typing import Any, Optional

import torch

from fakes.flashinfer import profiles


@functools.lru_cache(maxsize=None)
def table(profile: str) -> dict[str, dict[str, str]]:
    """The table of ``profile`` (a release it serves too), else its nearest base's."""
    for p in profiles.chain(profiles.resolve(profile)):
        path = Path(__file__).parent / f"{p.name}.json"
        if path.is_file():
            return json.loads(path.read_text())
    return {}


def violations(qualname: str, fn, args: tuple, kwargs: dict, namespace: dict) -> list[tuple[str, str, str]]:
    """``(parameter, value, rule)`` for each argument of ``fn(*args, **kwargs)`` (``qualname``
    under ``flashinfer.``, e.g. ``comm.mapping.Mapping.__init__``) that the active release's
    annotation or default rules out; ``namespace``: where the annotation's names live."""
    rules = table(profiles.active().name).get(qualname)
    if not rules:
        return []
    try:
        bound = _signature(fn).bind(*args, **kwargs)
    except TypeError:
        return []  # the call itself fails, with the release's own error
    out = []
    for name, value in bound.arguments.items():
        rule = rules.get(name, "")
        if rule and not _allows(rule, value, namespace):
            out.append((name, repr(value)[:120], rule))
    return out


@functools.lru_cache(maxsize=4096)
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


def _allows(rule: str, value: Any, namespace: dict) -> bool:
    node = _parsed(rule)
    if rule.startswith("="):
        return _fits_default(node, value)
    verdict = None if node is None else _check(node, value, namespace)
    return True if verdict is None else verdict


@functools.lru_cache(maxsize=None)
def _parsed(rule: str):
    """A default's value, or an annotation's expression (None: not one)."""
    if rule.startswith("="):
        return ast.literal_eval(rule[1:])
    try:
        return ast.parse(rule, mode="eval").body
    except SyntaxError:
        return None


def _fits_default(default, value) -> bool:
    """The kind of the default (any value where it says nothing: None, a container)."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    return not isinstance(default, str) or isinstance(value, str)


_SCALARS = {"int": numbers.Integral, "float": numbers.Real, "bool": bool, "str": str, "bytes": bytes}
_CONTAINERS = {"list": list, "List": list, "tuple": tuple, "Tuple": tuple, "dict": dict, "Dict": dict,
               "Sequence": (list, tuple), "set": set, "Set": set}
_UNCHECKED = {"Any", "object", "Callable", "callable", "TypeVar"}


def _check(node: ast.expr, value: Any, ns: dict) -> Optional[bool]:
    """True or False where the annotation decides, None where it cannot."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return value is None
        if isinstance(node.value, str):  # a forward reference
            try:
                return _check(ast.parse(node.value, mode="eval").body, value, ns)
            except SyntaxError:
                return None
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _any(_check(node.left, value, ns), _check(node.right, value, ns))
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value).split(".")[-1]
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return True if value is None else _check(items[0], value, ns)
        if head == "Union":
            return _any(*(_check(i, value, ns) for i in items))
        if head == "Literal":
            return value in [ast.literal_eval(i) for i in items]
        if head in _CONTAINERS:
            return isinstance(value, _CONTAINERS[head])
        return None
    name = ast.unparse(node)
    short = name.split(".")[-1]
    if short in _UNCHECKED:
        return None
    if name in _SCALARS:  # bool is an int to typing, as numpy's integers are
        return isinstance(value, _SCALARS[name])
    if name in ("torch.Tensor", "Tensor"):
        return isinstance(value, torch.Tensor)
    if name in ("torch.dtype",):
        return isinstance(value, torch.dtype)
    if name in ("torch.device",):
        return isinstance(value, (torch.device, str, int))
    cls = ns.get(short)
    if inspect.isclass(cls):
        if isinstance(value, cls):
            return True
        if issubclass(cls, enum.IntEnum):  # the kernels take the integer
            return isinstance(value, numbers.Integral) and not isinstance(value, enum.Enum)
        if getattr(cls, "_is_protocol", False):
            return None if not getattr(cls, "_is_runtime_protocol", False) else False
        return False
    return None


def _any(*verdicts: Optional[bool]) -> Optional[bool]:
    if any(v is True for v in verdicts):
        return True
    if any(v is None for v in verdicts):
        return None
    return False
