"""A public API as comparable text: the real one read with ``ast``, the fake's with ``inspect``.

Both sides are rendered to the same strings, so a difference is a difference in what a caller
meets (``inspect.signature``, keyword-only markers, defaults, method kinds, the shape of what
is returned), never in how it is written:

- function or method: ``"<kind> (<params>) -> <form>"``, ``<kind>`` one of ``def``,
  ``method``, ``classmethod``, ``staticmethod``; ``property`` alone for a property;
- class: ``"class <traits>"`` (``abc``, ``protocol``, ``runtime_checkable``,
  ``dataclass(frozen)``), its members under ``Class.member`` keys;
- constant: its ``repr``;
- a class, function or method under ``@deprecated(message)`` (``typing_extensions``, which
  sets ``__deprecated__`` and warns where it is used) ends in ``deprecated: <message>``.

``<form>`` is the set of shapes of the ``return`` statements (``None``, ``tuple[n]``,
``value``): a release that returns a 3-tuple where another returns a list differs there.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import textwrap
import typing
from typing import Callable, Iterator, Optional

Describe = dict[str, str]


# ---- the real side: source text ------------------------------------------------------------

def top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """A module's statements that run at import, with those in top-level ``if``, ``try`` and
    ``with`` blocks (``with contextlib.suppress(ImportError): from .x import y``)."""
    for node in tree.body:
        yield from _flatten(node)


def _flatten(node: ast.stmt) -> Iterator[ast.stmt]:
    if isinstance(node, (ast.If, ast.Try, ast.With)):
        for field in ("body", "orelse", "finalbody"):
            for child in getattr(node, field, ()):
                yield from _flatten(child)
        for handler in getattr(node, "handlers", ()):
            for child in handler.body:
                yield from _flatten(child)
    else:
        yield node


class RealModule:
    """One real module's top level, with imported names followed inside the same release."""

    def __init__(self, tree: ast.Module, name: str, is_package: bool,
                 load: Callable[[str], Optional["RealModule"]]):
        self.name = name
        self.is_package = is_package
        self.used: set[str] = set()  # names resolved here (what an excerpt must keep)
        self.whole: set[str] = set()  # definitions whose bodies the contract reads (kept verbatim)
        self._load = load
        self.defs: dict[str, ast.AST] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        self.all: Optional[list[str]] = None
        self.stars: list[str] = []  # modules imported with ``*``, in order
        self.lazy = False  # a module __getattr__ may serve more names
        for node in top_level(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                self.lazy = True
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs[node.name] = node
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
                if target == "__all__":
                    self.all = [ast.literal_eval(e) for e in node.value.elts]
                else:
                    self.defs[target] = node
            elif isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == "flashinfer"):
                base = self.import_base(node)
                for alias in node.names:
                    if alias.name == "*":
                        self.stars.append(base)
                    else:
                        self.imports[alias.asname or alias.name] = (base, alias.name)

    def import_base(self, node: ast.ImportFrom) -> str:
        """The absolute name of the module ``node`` imports from."""
        return self._relative(node.module, node.level) if node.level else node.module

    def _relative(self, module: Optional[str], level: int) -> str:
        parts = self.name.split(".")
        if not self.is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
        return ".".join(parts + ([module] if module else []))

    def public(self) -> set[str]:
        """``__all__`` when the module has one, else its public top-level definitions."""
        if self.all is not None:
            return set(self.all)
        return {n for n in self.defs if not n.startswith("_")}

    def resolve(self, name: str, _seen: frozenset = frozenset()) -> Optional[tuple["RealModule", ast.AST]]:
        """Where ``name`` is defined, following relative imports (an import cycle resolves to None)."""
        if name in self.defs:
            self.used.add(name)
            return self, self.defs[name]
        if name in self.imports and (self.name, name) not in _seen:
            self.used.add(name)
            module, orig = self.imports[name]
            other = self._load(module)
            return other.resolve(orig, _seen | {(self.name, name)}) if other is not None else None
        # ``from .x import *`` binds x's public names (0.6.7's fused_moe.core takes the enums so)
        for module in self.stars:
            other = self._load(module)
            if other is not None and name in other.public() and (module, name) not in _seen:
                self.used.add("*" + module)  # an excerpt keeps this star import
                return other.resolve(name, _seen | {(module, name)})
        return None


def describe_real(module: RealModule, name: str) -> Describe:
    """The description of ``module.name`` (and, for a class, of its public members)."""
    found = module.resolve(name)
    if found is None:
        return {}
    home, node = found
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {name: f"def {_ast_params(node.args, home)} -> {_return_form(node)}{_ast_deprecated(node, home)}"}
    if isinstance(node, ast.Assign):
        alias = home.resolve(node.value.id) if isinstance(node.value, ast.Name) else None
        if alias is not None and isinstance(alias[1], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return {name if k == node.value.id else name + k[len(node.value.id):]: v  # the alias is the object
                    for k, v in describe_real(home, node.value.id).items()}
        try:
            return {name: repr(ast.literal_eval(node.value))}
        except ValueError:
            return {name: ast.unparse(node.value)}
    out = {name: "class " + _ast_class_traits(node) + _ast_deprecated(node, home)}
    for member, desc in _ast_members(home, node).items():
        out[f"{name}.{member}"] = desc
    return out


def _ast_members(home: RealModule, node: ast.ClassDef) -> dict[str, str]:
    members: dict[str, str] = {}
    for base in node.bases:  # inherited members first, so the class's own override them
        if isinstance(base, ast.Name):
            found = home.resolve(base.id)
            if found is not None and isinstance(found[1], ast.ClassDef):
                members.update(_ast_members(*found))
    fields = []
    enum = any(ast.unparse(b).split(".")[-1] in ("Enum", "IntEnum", "IntFlag", "Flag") for b in node.bases)
    for item in node.body:
        if enum and isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name) \
                and not item.targets[0].id.startswith("_"):
            value = item.value
            if isinstance(value, ast.Tuple) and len(value.elts) == 1:  # `Name = (0,)`: IntEnum(0)
                value = value.elts[0]
            members[item.targets[0].id] = "member " + _ast_default(value, home)
            continue
        accessor = isinstance(item, ast.FunctionDef) and any(
            isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") for d in item.decorator_list)
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public_member(item.name) and not accessor:
            kind = _ast_method_kind(item)
            form = "None" if item.name == "__init__" else _return_form(item)
            members[item.name] = "property" if kind == "property" else \
                f"{kind} {_ast_params(item.args, home)} -> {form}{_ast_deprecated(item, home)}"
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if "ClassVar" not in ast.unparse(item.annotation):
                fields.append(item)
    if _ast_dataclass(node) is not None and "__init__" not in members:
        positional, keyword = ["self"], []
        for item in fields:
            text = item.target.id + ("" if item.value is None else "=" + _ast_default(_field_default(item.value), home))
            (keyword if _kw_only_field(item.value) else positional).append(text)
        params = positional + (["*"] + keyword if keyword else [])
        members["__init__"] = f"method ({', '.join(params)}) -> None"
    return members


def _kw_only_field(value: Optional[ast.expr]) -> bool:
    return isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field") and any(
        kw.arg == "kw_only" and ast.unparse(kw.value) == "True" for kw in value.keywords)


def _field_default(value: ast.expr) -> ast.expr:
    # field(default=x) reads as x; default_factory has no literal default
    if isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field"):
        for kw in value.keywords:
            if kw.arg == "default":
                return kw.value
            if kw.arg == "default_factory":
                return ast.Constant("<factory>")
    return value


def _ast_dataclass(node: ast.ClassDef) -> Optional[bool]:
    """None when not a dataclass, else whether it is frozen."""
    for dec in node.decorator_list:
        text = ast.unparse(dec)
        if text.split("(")[0].split(".")[-1] == "dataclass":
            return isinstance(dec, ast.Call) and any(
                kw.arg == "frozen" and ast.unparse(kw.value) == "True" for kw in dec.keywords)
    return None


def dataclass_fields(home: RealModule, cls: ast.ClassDef) -> list[ast.AnnAssign]:
    """A dataclass's fields in ``__init__`` order: its dataclass bases' first, then its own
    (``ClassVar`` annotations are not fields)."""
    out: list[ast.AnnAssign] = []
    for base in cls.bases:
        found = home.resolve(ast.unparse(base).split(".")[-1].split("[")[0])
        if found is not None and isinstance(found[1], ast.ClassDef) and _ast_dataclass(found[1]) is not None:
            out += dataclass_fields(*found)
    return out + [i for i in cls.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)
                  and "ClassVar" not in ast.unparse(i.annotation)]


def _ast_class_traits(node: ast.ClassDef) -> str:
    traits = []
    bases = {ast.unparse(b).split(".")[-1] for b in node.bases}
    decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
    if "ABC" in bases:
        traits.append("abc")
    if "Protocol" in bases:
        traits.append("protocol")
    if "runtime_checkable" in decorators:
        traits.append("runtime_checkable")
    frozen = _ast_dataclass(node)
    if frozen is not None:
        traits.append("dataclass(frozen)" if frozen else "dataclass")
    return " ".join(traits) or "plain"


def _ast_deprecated(node: ast.AST, home: "RealModule") -> str:
    """`` deprecated: <message>`` for a definition under ``@deprecated(message)``, else ``""``."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Call) and ast.unparse(dec.func).split(".")[-1] == "deprecated" and dec.args:
            return DEPRECATED + _ast_message(dec.args[0], home)
    return ""


def _ast_message(node: ast.expr, home: "RealModule") -> str:
    """A decorator's message: a literal, or a module constant holding one."""
    if isinstance(node, ast.Name):
        found = home.resolve(node.id)
        if found is not None and isinstance(found[1], ast.Assign):
            node = found[1].value
    try:
        return str(ast.literal_eval(node))
    except ValueError:
        return ast.unparse(node)


DEPRECATED = " deprecated: "


def _ast_method_kind(node: ast.FunctionDef) -> str:
    names = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
    for kind in ("property", "classmethod", "staticmethod"):
        if kind in names:
            return kind
    return "method"


def _ast_params(args: ast.arguments, home: "RealModule") -> str:
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = []
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        parts.append(arg.arg + ("" if default is None else "=" + _ast_default(default, home)))
        if args.posonlyargs and i == len(args.posonlyargs) - 1:
            parts.append("/")
    if args.vararg:
        parts.append("*" + args.vararg.arg)
    elif args.kwonlyargs:
        parts.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        parts.append(arg.arg + ("" if default is None else "=" + _ast_default(default, home)))
    if args.kwarg:
        parts.append("**" + args.kwarg.arg)
    return "(" + ", ".join(parts) + ")"


def _ast_default(node: ast.expr, home: "RealModule") -> str:
    try:
        return repr(ast.literal_eval(node))
    except ValueError:
        pass
    member = _enum_member_value(node, home)
    if member is not None:
        return member
    if all(isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop))
           for n in ast.walk(ast.Expression(node))):
        return repr(eval(compile(ast.Expression(node), "<default>", "eval"), {"__builtins__": {}}))  # arithmetic only
    return ast.unparse(node)


def _enum_member_value(node: ast.expr, home: "RealModule") -> Optional[str]:
    """``Cls.Member.value`` -> the member's literal value, as the fake's default holds it."""
    parts = ast.unparse(node).split(".")
    if len(parts) != 3 or parts[2] != "value":
        return None
    found = home.resolve(parts[0])
    if found is None or not isinstance(found[1], ast.ClassDef):
        return None
    for item in found[1].body:
        if (isinstance(item, ast.Assign) and len(item.targets) == 1
                and isinstance(item.targets[0], ast.Name) and item.targets[0].id == parts[1]):
            try:
                return repr(ast.literal_eval(item.value))
            except ValueError:
                return None
    return None


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s body in source order, not those of the functions or classes
    nested in it."""
    for item in ast.iter_child_nodes(fn):
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield item
            yield from own_nodes(item)


def _return_form(node: ast.FunctionDef) -> str:
    forms = set()
    for item in own_nodes(node):
        if isinstance(item, ast.Return):
            value = item.value
            if value is None or (isinstance(value, ast.Constant) and value.value is None):
                forms.add("None")
            elif isinstance(value, ast.Tuple):
                forms.add(f"tuple[{len(value.elts)}]")
            else:
                forms.add("value")
    return "|".join(sorted(forms)) or "None"


def _is_public_member(name: str) -> bool:
    return name == "__init__" or not name.startswith("_")


# ---- the fake side: live objects --------------------------------------------------------

def describe_fake(name: str, obj: object) -> Describe:
    """The description of the fake's ``obj`` exported as ``name``, in :func:`describe_real`'s form."""
    if inspect.isclass(obj):
        out = {name: "class " + _class_traits(obj) + _deprecated(vars(obj).get("__deprecated__"))}
        for member in sorted(_members(obj)):
            out[f"{name}.{member}"] = _member(obj, member)
        return out
    if callable(obj):
        return {name: f"def {_params(obj)} -> {_source_return_form(obj)}{_deprecated(getattr(obj, '__deprecated__', None))}"}
    return {name: repr(obj)}


def _members(cls: type) -> set[str]:
    names = set(getattr(cls, "__members__", {})) if issubclass(cls, enum.Enum) else set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("fakes."):
            for n, raw in vars(klass).items():
                fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
                if _is_public_member(n) and (isinstance(raw, property) or (
                        inspect.isfunction(fn) and fn.__module__.startswith("fakes."))):
                    names.add(n)
    return names


def _member(cls: type, name: str) -> str:
    if issubclass(cls, enum.Enum) and name in cls.__members__:
        return "member " + repr(cls.__members__[name].value)
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, property):
        return "property"
    kind, fn = "method", raw
    if isinstance(raw, (classmethod, staticmethod)):
        kind, fn = type(raw).__name__, raw.__func__
    form = "None" if name == "__init__" else _source_return_form(fn)
    return f"{kind} {_params(fn)} -> {form}{_deprecated(getattr(fn, '__deprecated__', None))}"


def _deprecated(message: Optional[str]) -> str:
    return "" if message is None else DEPRECATED + message


def _class_traits(cls: type) -> str:
    traits = []
    if any(b.__name__ == "ABC" and b.__module__ == "abc" for b in cls.__bases__):
        traits.append("abc")
    if typing.Protocol in cls.__bases__:
        traits.append("protocol")
    if getattr(cls, "_is_runtime_protocol", False):
        traits.append("runtime_checkable")
    if dataclasses.is_dataclass(cls):
        traits.append("dataclass(frozen)" if cls.__dataclass_params__.frozen else "dataclass")
    return " ".join(traits) or "plain"


def _params(fn: Callable) -> str:
    parts = []
    kinds = inspect.Parameter
    seen_kw_marker = False
    params = list(inspect.signature(fn).parameters.values())
    for i, p in enumerate(params):
        if p.kind is kinds.KEYWORD_ONLY and not seen_kw_marker:
            parts.append("*")
            seen_kw_marker = True
        text = p.name
        if p.kind is kinds.VAR_POSITIONAL:
            text, seen_kw_marker = "*" + p.name, True
        elif p.kind is kinds.VAR_KEYWORD:
            text = "**" + p.name
        elif p.default is not p.empty:
            text += "=" + _value(p.default)
        parts.append(text)
        if p.kind is kinds.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not kinds.POSITIONAL_ONLY):
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def _value(value: object) -> str:
    """A default as the real source writes it: enum members by name, the rest (literals,
    ``torch.bfloat16``) by ``repr``."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _source_return_form(fn: Callable) -> str:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError):
        return "?"
    node = tree.body[0]
    return _return_form(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else "?"
