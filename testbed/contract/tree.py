"""A real FlashInfer release read as source: its modules parsed on first use
(:class:`RealTree`), and names, members and keywords looked up in them (:class:`RealSide`),
for the contract's comparison, the consumer check, the annotation tables and the set-up
calls alike."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Optional

from testbed.contract.source import Source
from testbed.contract.surface import RealModule, _ast_dataclass, dataclass_fields


class RealTree:
    """The release's Python modules, parsed on first use, by dotted name."""

    def __init__(self, source: Source):
        self.source = source
        self._cache: dict[str, Optional[RealModule]] = {}
        self.paths: dict[str, str] = {}  # dotted name -> path under flashinfer/

    def modules(self) -> list[tuple[str, RealModule]]:
        return [(self.paths[name], m) for name, m in sorted(self._cache.items()) if m is not None]

    def __call__(self, dotted: str) -> Optional[RealModule]:
        if dotted not in self._cache:
            rel = dotted.split(".", 1)[1].replace(".", "/") if "." in dotted else ""
            path, package = f"{rel}.py", False
            module = self.source.read(path) if rel else None
            if module is None:
                path, package = (f"{rel}/__init__.py" if rel else "__init__.py"), True
                module = self.source.read(path)
            self.paths[dotted] = path
            self._cache[dotted] = None if module is None else RealModule(
                ast.parse(module), dotted, package, self)
        return self._cache[dotted]


@dataclass(frozen=True)
class Found:
    present: bool
    detail: str = ""  # what it is (for the table)


class RealSide:
    """The release, read as source."""

    def __init__(self, tree: RealTree):
        self.tree = tree

    def is_module(self, dotted: str) -> bool:
        return self.tree(dotted) is not None

    def makes(self, dotted: str, path: tuple[str, ...]) -> Optional[tuple[str, ...]]:
        """The path of the class a call of ``dotted.path`` returns an instance of: the class
        itself, or the class a factory's return annotation names (None: anything else)."""
        module = self.tree(dotted)
        target = self._resolve(module, path) if module is not None and path else None
        if target is None:
            return path or None  # missing here: what is reached through it follows from that
        home, node = target
        if isinstance(node, ast.ClassDef):
            return path
        made = self._instance_type(home, node)
        if isinstance(made, ast.ClassDef) and len(path) == 1:
            return (made.name,)  # a module-level factory; its class is reachable from the module
        return None

    def lookup(self, use) -> Found:
        module = self.tree(use.module)
        if module is None:
            return Found(False, "no such module")
        if not use.path:
            return Found(True, "module")
        target = self._resolve(module, use.path)
        if target is None:
            return Found(False)
        home, node = target
        if use.keyword is None:
            return Found(True, type(node).__name__)
        params = self._params(home, node)
        if params is None:
            return Found(True, "**kwargs")
        return Found(use.keyword in params)

    def _resolve(self, module: RealModule, path: tuple[str, ...]):
        found = module.resolve(path[0])
        if found is None:
            sub = self.tree(f"{module.name}.{path[0]}")
            if sub is not None:
                return self._resolve(sub, path[1:]) if len(path) > 1 else (sub, ast.Module([], []))
            if module.lazy and re.search(rf"['\"]{re.escape(path[0])}['\"]", _source_of(module, self.tree)):
                return (module, ast.Pass())  # served by the module's __getattr__
            return None
        home, node = found
        for attr in path[1:]:
            node = self._instance_type(home, node)
            if not isinstance(node, ast.ClassDef):
                return None
            member = self._member(home, node, attr)
            if member is None:
                return None
            home, node = member
        return home, node

    def _instance_type(self, home: RealModule, node: ast.AST):
        """A factory function's class (its return annotation), else the node."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            name = ast.unparse(node.returns).strip("'\"").split("|")[0].strip()
            found = home.resolve(name.split("[")[-1].rstrip("]")) if name else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                return found[1]
        return node

    def _member(self, home: RealModule, cls: ast.ClassDef, attr: str):
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == attr:
                return home, item
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.target.id == attr:
                return home, item
            if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in item.targets):
                return home, item
        for fn in cls.body:  # instance attributes: self.<attr> = ... in a method
            if isinstance(fn, ast.FunctionDef):
                for n in ast.walk(fn):
                    if isinstance(n, (ast.Assign, ast.AnnAssign)):
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                            if isinstance(t, ast.Attribute) and t.attr == attr and getattr(t.value, "id", "") == "self":
                                return home, n
        for base in cls.bases:
            found = home.resolve(ast.unparse(base).split(".")[-1].split("[")[0])
            if found is not None and isinstance(found[1], ast.ClassDef):
                member = self._member(found[0], found[1], attr)
                if member is not None:
                    return member
        return None

    def _params(self, home: RealModule, node: ast.AST) -> Optional[set[str]]:
        """The keywords ``node`` takes when called (None: any, it has ``**kwargs``)."""
        if isinstance(node, ast.ClassDef):
            init = self._member(home, node, "__init__")
            if init is not None and isinstance(init[1], ast.FunctionDef):
                return self._params(*init)
            if _ast_dataclass(node) is not None:
                return {f.target.id for f in dataclass_fields(home, node)}
            return set()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            if a.kwarg is not None:
                return None
            return {x.arg for x in a.args + a.kwonlyargs}  # positional-only ones take no keyword
        return None  # an assigned callable (an alias): its own signature is not read here


def _source_of(module: RealModule, tree: RealTree) -> str:
    return tree.source.read_paths.get(tree.paths.get(module.name, ""), "")
