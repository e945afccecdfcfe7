"""``a2a-testbed contract --consumer``: what an engine's MoE all-to-all path uses of FlashInfer,
checked against the real release and against the fake profile that imitates it.

The consumer's source is read with ``ast`` (neither it nor FlashInfer is imported). Within the
files of its FlashInfer NVLink all-to-all path (each engine integration's ``consumer()``, what ``--integration``
drives), every use of a FlashInfer name is collected:

- ``import``: ``from flashinfer.x import y``, ``import flashinfer.x``; inside ``try`` with an
  ``ImportError`` handler or ``if TYPE_CHECKING`` it is a probe or a type-only use;
- ``probe``: ``hasattr``/``getattr`` with a literal name, a call whose first arguments are a
  literal ``"flashinfer..."`` module and a literal name (``importlib.import_module``,
  ``find_spec``, vLLM's ``_get_submodule`` and ``_lazy_import_wrapper``), and
  ``("flashinfer.x", "Name")`` pairs in a table the code walks;
- ``attribute`` and ``call``: a name reached through a FlashInfer module, class or instance
  (instances are followed through assignments, ``self`` attributes and return annotations);
- ``keyword``: each keyword a call passes.

Each use is looked up in the release's source (:class:`~testbed.contract.tree.RealTree`) and
in the fake under :func:`fakes.flashinfer.install`. Verdicts: ``ok`` (both have it), ``FAKE GAP``
(the release has it, the fake does not: fix the fake), ``FAKE EXTRA`` (the fake has what the
release lacks: the fake is more lenient, fix it), ``FINDING`` (neither has it: the consumer's bug
against that release), ``probed`` (a probe of what neither has: how the consumer detects) and
``follows`` (missing on both sides because what it reaches is: a keyword of a missing callee,
a member of a missing module; listed with ``--all``).
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from testbed.contract.source import PackageSource
from testbed.contract.surface import top_level
from testbed.contract.tree import Found, RealSide, RealTree


@dataclass(frozen=True)
class PathFile:
    """A file of the consumer's all-to-all path; ``only``: the top-level functions, classes
    and assignments that belong to it (None: the whole file)."""

    pattern: str  # under the package root, fnmatch
    only: Optional[tuple[str, ...]] = None


@dataclass(frozen=True)
class Consumer:
    name: str
    dist: str  # the PyPI distribution
    files: tuple[PathFile, ...]
    release: Optional[str] = None  # what a bare ``--consumer NAME`` reads where none is installed


ROOT = "flashinfer"
_PROBE_CALLS = ("hasattr", "getattr")
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class Use:
    """One use of a FlashInfer name: ``module`` (dotted) and the attribute ``path`` under it
    (``()``: the module itself); ``keyword`` for a keyword a call passes."""

    file: str
    line: int
    kind: str  # import, probe, typing, attribute, call, keyword
    module: str
    path: tuple[str, ...]
    keyword: Optional[str] = None

    @property
    def what(self) -> str:
        name = ".".join((self.module,) + self.path)
        return f"{name}({self.keyword}=)" if self.keyword else name

    @property
    def tolerant(self) -> bool:
        """A probe or a type-only import: the code works (differently) where the name is absent."""
        return self.kind in ("probe", "typing", "guarded")


# --- scanning ---------------------------------------------------------------------------------

# A value's FlashInfer type: ("module", dotted) | ("object", dotted, path) | ("instance", dotted, path)
Typed = Optional[tuple]


def scan(source: PackageSource, consumer: Consumer, real: "RealSide") -> list[Use]:
    """Every use in the consumer's path files; ``real`` (the pinned release) tells modules
    from names and what a call makes an instance of."""
    files = _path_files(source, consumer)
    trees = {rel: ast.parse(text) for rel, text in files.items()}
    returns: dict[str, tuple] = {}
    scanners = []
    for rel, tree in trees.items():
        only = next(pf.only for pf in consumer.files if fnmatch.fnmatch(rel, pf.pattern))
        scanner = _Scanner(rel, real, returns, tree, only)
        scanners.append(scanner)
        for node in ast.walk(tree):  # annotations resolve among the names of the file that wrote them
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                returns.setdefault(node.name, (scanner, node.returns))
    for _ in range(3):  # bindings through assignments and across files settle in a few passes
        for scanner in scanners:
            scanner.bind()
    uses = [u for scanner in scanners for u in scanner.collect()]
    return sorted(set(uses), key=lambda u: (u.file, u.line, u.kind, u.what))


def _path_files(source: PackageSource, consumer: Consumer) -> dict[str, str]:
    names = source.files()
    found: dict[str, str] = {}
    for pf in consumer.files:
        hits = sorted(n for n in names if fnmatch.fnmatch(n, pf.pattern))
        if not hits:
            raise ValueError(f"{consumer.name} {source.version} has no {pf.pattern}: the consumer's path moved; "
                             "update testbed/contract/consumer.py")
        for rel in hits:
            found[rel] = source.read(rel)
    return found


class _Scanner:
    """One file's uses. The consumer's own functions that return a FlashInfer instance
    (``def get_communication(self) -> "NVLinkOneSidedAlltoAll"``) are known by name across the
    path's files (``returns``: name -> (their file's scanner, annotation))."""

    def __init__(self, rel: str, real: "RealSide", returns: dict, tree: ast.Module,
                 only: Optional[tuple[str, ...]]):
        self.rel, self.real, self.returns = rel, real, returns
        self.classify = real.is_module
        self.names: dict[str, Typed] = {}  # name -> type (file-wide: FlashInfer names are distinctive)
        self.attrs: dict[tuple, Typed] = {}  # (class, attr) -> the type of self.<attr> in that class
        self.uses: list[Use] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        self.nodes = [n for n in tree.body if only is None or _top_name(n) in only
                      or isinstance(n, (ast.Import, ast.ImportFrom)) or _guards_imports(n)]
        for top in self.nodes:
            for parent in ast.walk(top):
                for child in ast.iter_child_nodes(parent):
                    self.parents[child] = parent
        # Flags a probe sets: self.<flag> = <a call naming "name"> (supports_kw(f, "output")),
        # as flag -> the names its probes name.
        self.flags: dict[str, set[str]] = {}
        for top in self.nodes:
            for node in ast.walk(top):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    named = {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                             and isinstance(c.value, str) and c.value.isidentifier()}
                    for target in node.targets:
                        if isinstance(target, ast.Attribute) and named:
                            self.flags.setdefault(target.attr, set()).update(named)

    def bind(self) -> None:
        for top in self.nodes:
            for node in ast.walk(top):
                self._bind(node)

    def collect(self) -> list[Use]:
        for top in self.nodes:
            for node in ast.walk(top):
                self._use(node)
        return self.uses

    # -- types of expressions ---------------------------------------------------------------
    def typeof(self, node: ast.AST) -> Typed:
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                key = (self._class_of(node), node.attr)
                if key in self.attrs:
                    return self.attrs[key]
            base = self.typeof(node.value)
            if base is None:
                return None
            if base[0] == "module":
                dotted = f"{base[1]}.{node.attr}"
                return ("module", dotted) if self.classify(dotted) else ("object", base[1], (node.attr,))
            if base[0] == "object":  # a name under a module: a class's member
                return ("object", base[1], base[2] + (node.attr,))
            if base[0] == "instance":  # an instance's attribute or method
                return ("member", base[1], base[2] + (node.attr,))
            return None
        if isinstance(node, ast.Call):
            literal = _literal_module(node)
            if literal:
                # f("flashinfer.x", "name") reaches the name (vLLM's _lazy_import_wrapper), f("flashinfer.x") the module
                name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str) else None
                return ("object", literal, (name,)) if name else ("module", literal)
            func = self.typeof(node.func)
            if func is not None and func[0] == "object":
                made = self.real.makes(func[1], func[2])  # a class, or a factory annotated with one
                return ("instance", func[1], made) if made else None
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in self.returns:
                writer, annotation = self.returns[name]
                return writer._annotation(annotation)
            return None
        if isinstance(node, ast.IfExp):
            return self.typeof(node.body) or self.typeof(node.orelse)
        if isinstance(node, ast.BoolOp):
            return next(filter(None, map(self.typeof, node.values)), None)
        return None

    def _annotation(self, node: ast.expr) -> Typed:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(node, ast.BinOp):  # X | None
            return self._annotation(node.left) or self._annotation(node.right)
        if isinstance(node, ast.Subscript):  # Optional[X]
            return self._annotation(node.slice)
        t = self.typeof(node)
        return ("instance", t[1], t[2]) if t is not None and t[0] == "object" else None

    def _class_of(self, node: ast.AST) -> Optional[str]:
        """The class a ``self.<attr>`` belongs to: the innermost enclosing class."""
        scope = self.parents.get(node)
        while scope is not None and not isinstance(scope, ast.ClassDef):
            scope = self.parents.get(scope)
        return scope.name if scope is not None else None

    # -- bindings --------------------------------------------------------------------------
    def _bind(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_fi(a.name):
                    if a.asname:
                        self.names[a.asname] = ("module", a.name)
                    else:
                        self.names[a.name.split(".")[0]] = ("module", ROOT)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_fi(node.module or ""):
            for a in node.names:
                dotted = f"{node.module}.{a.name}"
                self.names[a.asname or a.name] = ("module", dotted) if self.classify(dotted) else \
                    ("object", node.module, (a.name,))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            t = self.typeof(value) if value is not None else None
            if t is None and isinstance(node, ast.AnnAssign):
                t = self._annotation(node.annotation)
            if t is None:
                return
            if t[0] == "member":
                return  # a member's value: its type is the release's business
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Name):
                    self.names[target.id] = t
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    self.attrs[(self._class_of(target), target.attr)] = t
        elif isinstance(node, ast.arg) and node.annotation is not None:
            t = self._annotation(node.annotation)
            if t is not None:
                self.names.setdefault(node.arg, t)

    # -- uses ------------------------------------------------------------------------------
    def _add(self, node: ast.AST, kind: str, module: str, path: tuple[str, ...], keyword: Optional[str] = None):
        if kind in ("attribute", "call", "keyword") and path and self._guarded(node, keyword or path[-1]):
            kind = "guarded"
        self.uses.append(Use(self.rel, node.lineno, kind, module, path, keyword))

    def _guarded(self, node: ast.AST, name: str) -> bool:
        """Inside ``if hasattr(x, "name"):``, or ``if self.<flag>:`` where a probe naming
        ``name`` set the flag (the branch the probe chose)."""
        child, scope = node, self.parents.get(node)
        while scope is not None:
            if isinstance(scope, ast.If) and child in scope.body and any(
                    isinstance(n, ast.Call) and getattr(n.func, "id", None) == "hasattr" and len(n.args) == 2
                    and isinstance(n.args[1], ast.Constant) and n.args[1].value == name
                    or isinstance(n, ast.Attribute) and name in self.flags.get(n.attr, ())
                    for n in ast.walk(scope.test)):
                return True
            child, scope = scope, self.parents.get(scope)
        return False

    def _use(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if _is_fi(a.name):
                    self._add(node, self._import_kind(node), a.name, ())
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_fi(node.module or ""):
            for a in node.names:
                self._add(node, self._import_kind(node), node.module, (a.name,))
        elif isinstance(node, ast.Attribute) and not isinstance(self.parents.get(node), ast.Attribute):
            self._attribute(node, "attribute")
        elif isinstance(node, ast.Call):
            self._call(node)
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts) \
                and _is_fi(node.elts[0].value) and node.elts[1].value.isidentifier():
            self._add(node, "probe", node.elts[0].value, (node.elts[1].value,))

    def _attribute(self, node: ast.Attribute, kind: str) -> None:
        t = self.typeof(node)
        if t is None:
            return
        if t[0] == "module" and isinstance(node.value, (ast.Name, ast.Attribute)):
            self._add(node, kind, t[1], ())
        elif t[0] in ("object", "member"):
            self._add(node, kind, t[1], t[2])
        # A chain reads every link: flashinfer.comm.Mapping reads flashinfer.comm too.
        if isinstance(node.value, ast.Attribute):
            self._attribute(node.value, "attribute")

    def _call(self, node: ast.Call) -> None:
        name = getattr(node.func, "id", None)
        if name in _PROBE_CALLS and len(node.args) >= 2:
            base = self.typeof(node.args[0])
            if base is not None and base[0] in ("module", "object", "instance", "member"):
                for attr in self._literal_names(node.args[1]):
                    path = () if base[0] == "module" else base[2]
                    self._add(node, "probe", base[1], path + (attr,))
            return
        literal = _literal_module(node)
        if literal:
            self._add(node, "probe", literal, ())
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                self._add(node, "probe", literal, (node.args[1].value,))
            return
        t = self.typeof(node.func)
        if t is None or t[0] not in ("object", "member"):
            return
        self._add(node, "call", t[1], t[2])
        for kw in node.keywords:
            if kw.arg is not None:
                self._add(node, "keyword", t[1], t[2], kw.arg)

    def _literal_names(self, node: ast.AST) -> list[str]:
        """A literal attribute name, or each literal a comprehension or loop variable walks."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            scope = self.parents.get(node)
            while scope is not None:
                loops = scope.generators if isinstance(scope, (ast.GeneratorExp, ast.ListComp, ast.SetComp)) else \
                    [scope] if isinstance(scope, ast.For) else []
                for loop in loops:
                    if isinstance(loop.target, ast.Name) and loop.target.id == node.id \
                            and isinstance(loop.iter, (ast.Tuple, ast.List)):
                        return [e.value for e in loop.iter.elts if isinstance(e, ast.Constant)
                                and isinstance(e.value, str)]
                scope = self.parents.get(scope)
        return []

    def _import_kind(self, node: ast.AST) -> str:
        scope = self.parents.get(node)
        while scope is not None:
            if isinstance(scope, ast.If) and "TYPE_CHECKING" in ast.unparse(scope.test):
                return "typing"
            if isinstance(scope, ast.Try) and any(_catches_import_error(h) for h in scope.handlers):
                return "probe"
            scope = self.parents.get(scope)
        return "import"


def _top_name(node: ast.stmt) -> Optional[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _guards_imports(node: ast.stmt) -> bool:
    """A top-level ``if``/``try`` whose body imports FlashInfer (``if TYPE_CHECKING:``)."""
    return isinstance(node, (ast.If, ast.Try)) and any(
        isinstance(n, (ast.Import, ast.ImportFrom)) and _is_fi(getattr(n, "module", None) or
                                                                 (n.names[0].name if isinstance(n, ast.Import) else ""))
        for n in top_level(ast.Module([node], [])))


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)}
    return bool(names & _IMPORT_ERRORS)


def _is_fi(dotted: str) -> bool:
    return dotted == ROOT or dotted.startswith(ROOT + ".")


def _literal_module(node: ast.Call) -> Optional[str]:
    """``f("flashinfer.x", ...)``: the literal module a call names first (import_module,
    find_spec, vLLM's _get_submodule and _lazy_import_wrapper)."""
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
            and re.fullmatch(r"flashinfer(\.\w+)*", node.args[0].value):
        return node.args[0].value
    return None


# --- looking uses up ----------------------------------------------------------------------------

class _FakeSide:
    """The fake under ``install(profile)`` (the caller holds the block)."""

    def lookup(self, use: Use) -> Found:
        try:
            obj = importlib.import_module(use.module)
        except ImportError:
            return Found(False, "no such module")
        owner = None
        for attr in use.path:
            owner = obj
            try:
                obj = _fake_member(obj, attr)
            except (AttributeError, ImportError):
                if inspect.ismodule(owner):
                    try:
                        obj = importlib.import_module(f"{owner.__name__.replace('fakes.', '', 1)}.{attr}")
                        continue
                    except ImportError:
                        pass
                return Found(False)
        if use.keyword is None:
            return Found(True, type(obj).__name__)
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            return Found(True, "no signature")
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return Found(True, "**kwargs")
        return Found(use.keyword in {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY})


_NO_MEMBER = object()


def _fake_member(obj, attr: str):
    """``obj.attr``; for a class also its dataclass fields and the attributes its methods set
    on ``self`` (what an instance of it has), read from the fake's source."""
    value = getattr(obj, attr, _NO_MEMBER)
    if value is not _NO_MEMBER:
        return _instance_class(value)
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
            return None
        for klass in obj.__mro__:
            if klass.__module__.startswith("fakes.") and attr in _self_attributes(klass):
                return None
    raise AttributeError(attr)


def _instance_class(value):
    """What a factory returns, where the fake annotates it (``create_communication``)."""
    if inspect.isfunction(value):
        ret = inspect.signature(value).return_annotation
        if isinstance(ret, str):
            ret = value.__globals__.get(ret.strip("'\""), ret)
        if inspect.isclass(ret) and ret.__module__.startswith("fakes."):
            return _FactoryOf(value, ret)
    return value


class _FactoryOf:
    """A fake factory function: called, it has its own signature; its members are its class's."""

    def __init__(self, fn, cls):
        self.fn, self.cls = fn, cls
        self.__signature__ = inspect.signature(fn)

    def __getattr__(self, attr):
        return _fake_member(self.cls, attr)


def _self_attributes(klass) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError):
        return set()
    return {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self"}


# --- the report -----------------------------------------------------------------------------

VERDICTS = ("FAKE GAP", "FAKE EXTRA", "FINDING", "probed", "follows", "ok")


@dataclass(frozen=True)
class Row:
    use: Use
    real: Found
    fake: Found
    follows: bool = False  # what it reaches is already missing on both sides (its callee, a prefix)

    @property
    def verdict(self) -> str:
        if self.real.present and self.fake.present:
            return "ok"
        if self.real.present:
            return "FAKE GAP"
        if self.fake.present:
            return "FAKE EXTRA"
        if self.follows:
            return "follows"
        return "probed" if self.use.tolerant else "FINDING"


@dataclass(frozen=True)
class ConsumerReport:
    consumer: str
    version: str
    flashinfer: str
    profile: str
    rows: tuple[Row, ...]
    files: tuple[str, ...]

    def count(self, verdict: str) -> int:
        return sum(r.verdict == verdict for r in self.rows)

    @property
    def fake_defects(self) -> int:
        return self.count("FAKE GAP") + self.count("FAKE EXTRA")


def check(source: PackageSource, consumer: Consumer, tree: RealTree, profile: str) -> ConsumerReport:
    """Every use of the consumer's path looked up in the release ``tree`` and in the fake's ``profile``."""
    from fakes.flashinfer import install

    real = RealSide(tree)
    uses = scan(source, consumer, real)
    with install(profile):
        fake = _FakeSide()
        rows = tuple(Row(u, r, f, not r.present and not f.present and _prefix_missing(u, real, fake))
                     for u in uses for r, f in [(real.lookup(u), fake.lookup(u))])
    files = tuple(sorted({u.file for u in uses}))
    return ConsumerReport(consumer.name, source.version, tree.source.version, profile, rows, files)


def _prefix_missing(use: Use, real: "RealSide", fake: "_FakeSide") -> bool:
    """Whether a shorter reach of ``use`` (the callee of a keyword, the module of a name,
    the class of a member) is already missing on both sides: ``use`` is reported with it."""
    if use.keyword is not None:
        callee = dataclasses.replace(use, keyword=None)
        return not real.lookup(callee).present and not fake.lookup(callee).present
    for n in range(1, len(use.path)):  # a missing module is shown at its first name
        shorter = dataclasses.replace(use, path=use.path[:n])
        if not real.lookup(shorter).present and not fake.lookup(shorter).present:
            return True
    return False


def format_consumer_report(report: ConsumerReport, everything: bool = False) -> str:
    counts = ", ".join(f"{report.count(v)} {v}" for v in VERDICTS)
    lines = [f"{report.consumer} {report.version} against flashinfer {report.flashinfer} (fake profile "
             f"{report.profile}): {len(report.rows)} uses in {len(report.files)} files: {counts}"]
    shown = [r for r in report.rows if everything or r.verdict not in ("ok", "follows")]
    for r in sorted(shown, key=lambda r: (VERDICTS.index(r.verdict), r.use.file, r.use.line)):
        lines.append(f"  {r.verdict:<10} {r.use.kind:<9} {r.use.what}  at {r.use.file}:{r.use.line}"
                     f"  (real: {_yes(r.real)}, fake: {_yes(r.fake)})")
    return "\n".join(lines)


def _yes(found: Found) -> str:
    return ("has it" if found.present else "lacks it") + (f" [{found.detail}]" if found.detail and not found.present else "")


def pinned_flashinfer(source: PackageSource) -> Optional[str]:
    """The FlashInfer release the consumer's metadata pins (``flashinfer-python==X``), or None."""
    for line in source.requires():
        m = re.match(r"flashinfer[-_]python(?:\[[^\]]*\])?\s*==\s*([\w.]+)\s*(;|$)", line.strip())
        if m:
            return m.group(1)
    return None


def parse_consumer(spec: str, consumers: dict[str, Consumer]) -> tuple[Consumer, Optional[str]]:
    """``vllm`` or ``vllm=0.33.0|WHEEL|DIR`` -> (its consumer among ``consumers``, its source
    spec or None: the installed copy, else the release the testbed drives)."""
    name, _, where = spec.partition("=")
    if name not in consumers:
        raise ValueError(f"--consumer {spec!r}: known consumers are {', '.join(sorted(consumers))}")
    return consumers[name], where or None


def write_consumer_excerpt(source: PackageSource, consumer: Consumer, out: Path) -> list[Path]:
    """Copies of the consumer's path files (the scanner's whole input) under ``out``."""
    written = []
    for rel, text in _path_files(source, consumer).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# Copy of {consumer.dist} {source.version} ({rel}), Apache-2.0, (c) its authors: the file the "
                  "consumer contract scans.\n")
        path.write_text(header + text)
        written.append(path)
    dist = out / f"{consumer.dist}-{source.version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    pin = pinned_flashinfer(source)
    (dist / "METADATA").write_text(f"Name: {consumer.dist}\nVersion: {source.version}\n"
                                   + (f"Requires-Dist: flashinfer-python=={pin}\n" if pin else ""))
    return written
