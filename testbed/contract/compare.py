"""The contract: a real FlashInfer release against the fake's matching profile.

What is compared (``SCOPES``), each real module with the fake module of the same dotted name
under :func:`fakes.flashinfer.install`:

- ``comm.trtllm_moe_alltoall`` whole: ``__all__``, every public definition either side has,
  and what each looks like (:mod:`testbed.contract.surface`);
- ``comm.trtllm_alltoall``, ``comm.mnnvl``, ``comm.mapping``, ``fused_moe``, ``moe_ep``, the
  root and the quantizers (``quantization``, its ``fp4_quantization`` and ``fp8_quantization``,
  and the root's stubs of both): the names the fake imitates, each of which the release must
  have in the same form;
- re-exports: every name one of these modules imports from a module the fake imitates, where the
  fake imitates that name, must be there on the fake too (``fused_moe.QuantFormat`` from
  ``moe_ep``, the root's ``nvfp4_block_scale_interleave``), and ``comm``'s re-exports are the
  same set on both sides;
- a module the release does not ship must fail to import from the fake too;
- the kernel constants read from the C++ sources (``kMaxTopK``, ``kMaxPayloads``,
  ``kMaxRanks``, the metainfo fields, the ``top_k`` values ``SWITCH_TOP_K`` instantiates).

Names a fake module adds for the testbed's own use are listed in its ``__fake_only__`` and
reported apart, never silently skipped.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Optional

from testbed.contract.source import Source
from testbed.contract.surface import DEPRECATED, describe_fake, describe_real
from testbed.contract.tree import RealTree


@dataclass(frozen=True)
class Scope:
    module: str  # dotted, under ``flashinfer``
    whole: bool  # every public name of the release, both ways; else the fake's names only
    required: tuple[str, ...] = ()  # names the fake must imitate wherever the release has them
    imitated_from: Optional[str] = None  # earlier profiles do not imitate the module (reported)


# The names of flashinfer.moe_ep an NVLink integration uses (issue 10); moe_ep also holds the
# NCCL-EP/NIXL-EP transports and the mega kernels, which the fake does not imitate.
MOE_EP_NVLINK = (
    "BootstrapConfig", "MoEEpCommParams", "MoEEpCommunication", "MoEEpDispatchResult",
    "NVLinkOneSidedAlltoAll", "NVLinkOneSidedConfig", "NVLinkTwoSidedAlltoAll", "NVLinkTwoSidedConfig",
    "available_communication_backends", "create_communication", "register_communication",
)
SCOPES = (
    Scope("", whole=False),
    Scope("comm.trtllm_moe_alltoall", whole=True),
    Scope("comm.trtllm_alltoall", whole=False),
    Scope("comm.mnnvl", whole=False),
    Scope("comm.mapping", whole=False),
    Scope("fused_moe", whole=False),
    Scope("moe_ep", whole=False, required=MOE_EP_NVLINK, imitated_from="0.7.2"),
    Scope("quantization", whole=False),
    Scope("quantization.fp4_quantization", whole=False),
    Scope("quantization.fp8_quantization", whole=False),
    Scope("fp4_quantization", whole=False),
    Scope("fp8_quantization", whole=False),
)
REEXPORTING = "comm"  # the package whose re-exports of the modules above are compared


@dataclass(frozen=True)
class Difference:
    key: str
    real: str
    fake: str


@dataclass(frozen=True)
class Report:
    version: str
    profile: str
    entries: tuple[Difference, ...]  # every comparison, equal or not
    fake_only: tuple[str, ...]
    not_imitated: tuple[str, ...]  # what the release has that the comparison left out, and why

    @property
    def differences(self) -> tuple[Difference, ...]:
        return tuple(e for e in self.entries if e.real != e.fake)

    @property
    def compared(self) -> int:
        """Entries compared, so an empty comparison cannot pass unnoticed."""
        return len(self.entries)


def profile_for(version: str) -> str:
    """The fake profile that serves release ``version`` (its own, or one it is identical to);
    :class:`~fakes.flashinfer.profiles.UnservedRelease` (a ``ValueError``) when none does."""
    from fakes.flashinfer.profiles import resolve

    return resolve(version).name


def compare(source: Source, profile: Optional[str] = None, tree: Optional[RealTree] = None) -> Report:
    """Compare ``source`` with the fake's ``profile`` (default: the one for its version);
    ``tree`` is where the release's modules are parsed (given, it keeps what was read)."""
    from fakes.flashinfer import install

    profile = profile_for(profile or source.version)
    loader = tree or RealTree(source)
    rows: dict[str, tuple[str, str]] = {}
    fake_only: list[str] = []
    not_imitated: list[str] = []
    with install(profile):
        for scope in SCOPES:
            _compare_module(scope, profile, loader, rows, fake_only, not_imitated)
        _compare_reexports(loader, rows)
        _compare_modules(profile, loader, rows, not_imitated)
        for scope in SCOPES:
            _compare_imported_names(scope, loader, rows)
        from fakes.flashinfer.profiles import active
        _compare_kernel_constants(source, active(), rows)
        _compare_workspace_barrier(loader, active(), rows)
    _compare_annotations(profile, loader, rows)
    _compare_setup_calls(profile, loader, rows)
    entries = tuple(Difference(k, r, f) for k, (r, f) in sorted(rows.items()))
    return Report(source.version, profile, entries, tuple(sorted(fake_only)), tuple(not_imitated))


def _compare_annotations(profile: str, loader: RealTree, rows: dict) -> None:
    """The fake's checked-in annotation table of ``profile`` against the release's source."""
    from testbed.contract.annotations import release_annotations
    from fakes.flashinfer.annotations import table

    real = release_annotations((Difference(k, r, f) for k, (r, f) in rows.items()), loader)
    stored = table(profile)
    for key in sorted(set(real) | set(stored)):
        rows[f"flashinfer.{key} annotations"] = (_annotations_text(real.get(key)), _annotations_text(stored.get(key)))


def _compare_setup_calls(profile: str, loader: RealTree, rows: dict) -> None:
    """The communicator calls of the release's MNNVL set-up against the testbed's record of
    them, which the fake is held to in every scenario."""
    from testbed.contract.setup_calls import expected, release_setup_calls

    real = release_setup_calls(loader)
    if real is not None:
        rows["flashinfer.comm.mnnvl.MnnvlMemory.open_mnnvl_memory communicator calls"] = (
            ", ".join(map(str, real)), ", ".join(expected(profile)))


def _annotations_text(params: Optional[dict]) -> str:
    if params is None:
        return MISSING
    return ", ".join(f"{p}: {a}" if a and not a.startswith("=") else f"{p}{a}" if a else p for p, a in params.items())


MISSING = "<absent>"


def _import_fake(dotted: str):
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        return None


def _compare_module(scope: Scope, profile: str, loader: RealTree, rows: dict, fake_only: list,
                    not_imitated: list) -> None:
    from fakes.flashinfer.profiles import release_key

    dotted = f"flashinfer.{scope.module}".rstrip(".")
    real = loader(dotted)
    if scope.imitated_from and release_key(profile) < release_key(scope.imitated_from):
        if real is not None:
            not_imitated.append(f"{dotted}: the fake imitates it from profile {scope.imitated_from} on")
        return
    fake = _import_fake(dotted)
    rows[f"{dotted} (module)"] = ("present" if real else MISSING, "present" if fake else MISSING)
    if real is None:
        return
    if fake is None:  # every name the fake had to imitate is missing
        for name in sorted(set(scope.required) & real.public()):
            for key, desc in describe_real(real, name).items():
                rows[f"{dotted}.{key}"] = (desc, MISSING)
        return
    extras = set(getattr(fake, "__fake_only__", ()))
    fake_only.extend(f"{dotted}.{n}" for n in sorted(extras))
    fake_names = _fake_public(fake) - extras
    names = set(fake_names) | (set(scope.required) & real.public())
    if not scope.whole:
        left = len(real.public() - names)
        if left:
            not_imitated.append(f"{dotted}: {left} of its {len(real.public())} public names")
    if scope.whole:
        names |= real.public() | {n for n, node in real.defs.items() if not n.startswith("_")
                                  and (not isinstance(node, ast.Assign) or n.isupper())}
        rows[f"{dotted}.__all__"] = (repr(sorted(real.public())),
                                     repr(sorted(getattr(fake, "__all__", []))))
    for name in sorted(names):
        real_desc = describe_real(real, name)
        fake_desc = describe_fake(name, getattr(fake, name)) if name in fake_names else {}
        for key in set(real_desc) | set(fake_desc):
            real_text, fake_text = real_desc.get(key, MISSING), fake_desc.get(key, MISSING)
            rows[f"{dotted}.{key}"] = (real_text, _unknown_form_matches(real_text, fake_text))


def _unknown_form_matches(real: str, fake: str) -> str:
    """A real function that returns what another call returns (form ``value``) may return
    anything, so a fake whose forms are among the real ones matches it (``tuple[2]|value``
    covers a fake that returns only another call's value); ``None`` and ``tuple[n]`` alone
    must match exactly."""
    if " -> " not in real or " -> " not in fake:
        return fake
    (real, _), (fake, fake_note) = (x.partition(DEPRECATED)[::2] for x in (real, fake))
    note = DEPRECATED + fake_note if fake_note else ""
    real_forms, fake_forms = (set(x.rsplit(" -> ", 1)[1].split("|")) for x in (real, fake))
    if real_forms == {"value"} or "value" in real_forms and fake_forms <= real_forms:
        return fake.rsplit(" -> ", 1)[0] + " -> " + real.rsplit(" -> ", 1)[1] + note
    return fake + note


def _fake_public(module) -> set[str]:
    """The fake module's own public functions and classes, those it re-exports from the fake
    through its ``__all__`` (a package: only those), and its ALL-CAPS constants; per-profile
    names are listed by the module's ``__dir__``."""
    package = hasattr(module, "__path__")
    exported = set(getattr(module, "__all__", None) or ())
    names = set()
    for name in (exported if package and exported else set(dir(module)) | exported):
        if name.startswith("_"):
            continue
        obj = getattr(module, name, None)
        home = getattr(obj, "__module__", None) or ""
        if inspect.isfunction(obj) or inspect.isclass(obj):
            if home == module.__name__ or (name in exported and home.startswith("fakes.flashinfer")):
                names.add(name)
        elif name.isupper() and isinstance(obj, (int, str, tuple)):
            names.add(name)
    return names


def _compare_reexports(loader: RealTree, rows: dict) -> None:
    dotted = f"flashinfer.{REEXPORTING}"
    real, fake = loader(dotted), _import_fake(dotted)
    sources = {f"flashinfer.{s.module}" for s in SCOPES if s.module}
    real_names = sorted(n for n, (mod, _) in (real.imports.items() if real else ()) if mod in sources)
    for name in real_names:
        real.used.add(name)  # part of the comparison: an excerpt keeps the import
    fake_names = []
    if fake is not None:
        homes = {"fakes." + s for s in sources}
        for name in dir(fake):
            obj = getattr(fake, name)
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") in homes:
                fake_names.append(name)
    rows[f"{dotted} re-exports"] = (repr(real_names), repr(sorted(fake_names)))


def _compare_modules(profile: str, loader: RealTree, rows: dict, not_imitated: list) -> None:
    """Every module of the fake package imports as ``flashinfer.<path>`` under ``install``
    exactly where the release ships it (the fake's own modules never); a module the profile
    declares absent that the release ships is listed as not imitated."""
    from fakes.flashinfer.aliases import _fake_modules
    from fakes.flashinfer.profiles import PROFILES

    declared = PROFILES[profile].absent_modules
    for path in sorted(p for p in _fake_modules() if p):
        dotted = f"flashinfer.{path}"
        real, fake = loader(dotted) is not None, _import_fake(dotted) is not None
        if not fake and any(path == a or path.startswith(a + ".") for a in declared):
            # absent by the profile's declaration: where the release ships it, not imitated
            if real and path in declared and not any(n.startswith(f"{dotted}:") for n in not_imitated):
                not_imitated.append(f"{dotted}: the release ships it; this profile does not imitate it")
            if real or path not in declared:
                continue
        rows[f"{dotted} (module)"] = ("present" if real else MISSING, "present" if fake else MISSING)


def _compare_imported_names(scope: Scope, loader: RealTree, rows: dict) -> None:
    """A name the real module imports from a module the fake imitates, where the fake's
    module has that name, must be reachable from the fake's module too, and be the same object."""
    dotted = f"flashinfer.{scope.module}".rstrip(".")
    real, fake = loader(dotted), _import_fake(dotted)
    if real is None or fake is None:
        return
    for name, (src, orig) in sorted(real.imports.items()):
        home = _import_fake(src) if src != dotted else None
        if home is None or name.startswith("_") or not _has(home, orig):
            continue
        real.used.add(name)
        same = _has(fake, name) and getattr(fake, name) is getattr(home, orig)
        rows[f"{dotted}.{name} (from {src})"] = ("re-exported", "re-exported" if same else
                                                  "same object missing" if _has(fake, name) else MISSING)


def _has(module, name: str) -> bool:
    try:
        getattr(module, name)
    except AttributeError:
        return False
    return True


_CONSTANT = re.compile(r"static\s+constexpr\s+int\s+(kMax\w+)\s*=\s*(\d+)")
# Field indices only: 0.7.4's list goes on with kernel limits (``{"MOE_A2A_MAX_RANKS", kMaxRanks}``).
_METAINFO = re.compile(r'\{"MOE_A2A_(\w+?)(?:_OFFSET_INDEX)?",\s*(?!k)\w+\}')
_SWITCH = re.compile(r"#define\s+SWITCH_TOP_K\(.*?(?=\n\s*\n|\n#)", re.S)
CONSTANT_PATTERNS = (_CONSTANT, _METAINFO, _SWITCH)  # what an excerpt of a C++ file keeps


def _compare_kernel_constants(source: Source, profile, rows: dict) -> None:
    header = source.find("moeAlltoAllKernels.h")
    kernels = source.find("moeAlltoAllKernels.cu")
    meta = source.find("moeAlltoAllMeta.h")
    if header is None and kernels is None and meta is None:
        return  # a release without the TRT-LLM one-sided kernels
    real = dict(_CONSTANT.findall(header or ""))
    fake = {"kMaxTopK": profile.k_max_top_k, "kMaxPayloads": profile.k_max_payloads,
            "kMaxRanks": profile.k_max_ranks}
    for name, value in fake.items():
        rows[f"csrc {name}"] = (real.get(name, MISSING), str(value))
    fields = [f for f in _METAINFO.findall(meta or "") if f != "NUM_METAINFO_FIELDS"]
    rows["csrc metainfo fields"] = (repr(fields), repr(list(_fake_metainfo_fields(profile))))
    switch = _SWITCH.search(kernels or "")
    cases = sorted(int(c) for c in re.findall(r"case\s+(\d+)\s*:", switch.group(0))) if switch else []
    rows["csrc SWITCH_TOP_K cases"] = (repr(cases), repr(sorted(profile.top_k_kernels)))


def _compare_workspace_barrier(loader: RealTree, profile, rows: dict) -> None:
    """Whether ``MoeAlltoAll``'s workspace set-up (the method that allocates the MNNVL memory
    and initializes it) barriers after ``moe_a2a_initialize``, so no peer publishes into a
    row before its memset is done, against what the profile's fake does."""
    module = loader("flashinfer.comm.trtllm_moe_alltoall")
    found = module.resolve("MoeAlltoAll") if module is not None else None
    if found is None or not isinstance(found[1], ast.ClassDef):
        return  # a release without the one-sided MoeAlltoAll
    home, cls = found
    home.whole.add("MoeAlltoAll")  # the method bodies are read: an excerpt keeps them
    real = MISSING
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef):
            continue
        calls = [(n.lineno, ast.unparse(n.func).split(".")[-1]) for n in ast.walk(method) if isinstance(n, ast.Call)]
        names = {c for _, c in calls}
        if "MnnvlMemory" in names and "moe_a2a_initialize" in names:
            first = min(line for line, c in calls if c == "moe_a2a_initialize")
            real = "yes" if any(c == "barrier" and line > first for line, c in calls) else "no"
    rows["flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll workspace set-up: barrier after moe_a2a_initialize"] = (
        real, "yes" if profile.init_barrier else "no")


def _fake_metainfo_fields(profile) -> tuple[str, ...]:
    if profile.moe_ep_kernels:
        from fakes.flashinfer.moe_ep import one_sided_ops

        return one_sided_ops.METAINFO_FIELDS
    from fakes.flashinfer.comm import moe_a2a_kernels

    return moe_a2a_kernels.metainfo_fields(profile)


def served(report: Report) -> str:
    """The profile compared, and whether it is the release's own or one serving it."""
    from fakes.flashinfer.profiles import serving

    if report.profile == report.version:
        return report.profile
    serves = serving(report.version) == report.profile
    return f"{report.profile} ({'which serves' if serves else 'chosen for'} {report.version})"


def format_report(report: Report, everything: bool = False) -> str:
    """A verdict line, the differences (``everything``: every entry) as a table with the
    real value over the fake's, then the fake-only and not-imitated names."""
    lines = [f"flashinfer {report.version} against fake profile {served(report)}: "
             f"{report.compared} entries compared, {len(report.differences)} differ"]
    shown = report.entries if everything else report.differences
    if shown:
        width = max(len(d.key) for d in shown)
        lines.append(f"{'name':<{width}}  real / fake")
        for d in shown:
            mark = "  " if d.real == d.fake else "!="
            lines.append(f"{d.key:<{width}}  {d.real}\n{'':<{width - 2}}{mark}  {d.fake}")
    if report.fake_only:
        lines.append("fake-only (testbed hooks, not compared): " + ", ".join(report.fake_only))
    for item in report.not_imitated:
        lines.append(f"not imitated: {item}")
    return "\n".join(lines)
