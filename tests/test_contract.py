"""The fake against the real releases' sources (checked-in excerpts, no network), the comparer
finding each kind of difference, and ``import flashinfer`` resolving to the fake."""

from __future__ import annotations

import dataclasses
import importlib
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakes.flashinfer import install, profiles
from testbed.contract import compare, open_source
from testbed.contract.compare import SCOPES
from testbed.contract.tree import RealTree
from testbed.contract.excerpt import excerpt_dirs, write_excerpt

EXCERPTS = Path(__file__).parent / "data" / "flashinfer_excerpts"
RELEASES = {p.name: p for p in excerpt_dirs(EXCERPTS)}


def test_contract_excerpts_cover_every_served_release():
    assert set(RELEASES) == set(profiles.served_releases())
    assert set(profiles.PROFILES) <= set(RELEASES)


@pytest.mark.parametrize("version", sorted(RELEASES, key=profiles.release_key))
def test_contract_release_matches_the_profile_serving_it(version):
    report = compare(open_source(str(RELEASES[version])))
    assert report.version == version and report.profile == profiles.resolve(version).name
    assert report.compared > 100  # an empty comparison must not pass
    assert not report.differences, "\n".join(f"{d.key}: real {d.real} / fake {d.fake}" for d in report.differences)


def _mutated(tmp_path: Path, version: str, rel: str, old: str, new: str) -> str:
    root = tmp_path / version
    shutil.copytree(RELEASES[version], root)
    path = root / "flashinfer" / rel
    if old is None:  # the release no longer ships the file
        path.unlink()
        return str(root)
    text = path.read_text()
    assert old in text, f"{old!r} not in the excerpt of {rel}"
    path.write_text(text.replace(old, new, 1))
    return str(root)


A2A = "comm/trtllm_moe_alltoall.py"
KERNELS_H = "data/csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.h"
KERNELS_CU = "data/csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu"
MUTATIONS = [  # (what changes in the release, file, old, new, the entry that must differ)
    ("parameter renamed", A2A, "def moe_a2a_initialize(workspace:", "def moe_a2a_initialize(ws:",
     "flashinfer.comm.trtllm_moe_alltoall.moe_a2a_initialize"),
    ("default changed", A2A, "extra_payload_bytes_per_token: int=0", "extra_payload_bytes_per_token: int=16",
     "flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll.get_moe_workspace_size_per_rank"),
    ("keyword-only marker", A2A, "=None, *, use_low_precision", "=None, use_low_precision",
     "flashinfer.comm.trtllm_moe_alltoall.moe_a2a_combine"),
    ("return form", A2A, "return (output_payloads, combine_payload_offset, eplb_gathered_stats)",
     "return (output_payloads, combine_payload_offset)", "flashinfer.comm.trtllm_moe_alltoall.moe_a2a_dispatch"),
    ("public name added", A2A, "'MoeAlltoAll',", "'MoeAlltoAll', 'moe_a2a_new',",
     "flashinfer.comm.trtllm_moe_alltoall.__all__"),
    ("constant", KERNELS_H, "kMaxTopK = 22", "kMaxTopK = 16", "csrc kMaxTopK"),
    ("top_k instantiations", KERNELS_CU, "case 18:", "case 20:", "csrc SWITCH_TOP_K cases"),
    ("enum value", "tllm_enums.py", "Unspecified = (10,)", "Unspecified = (11,)",
     "flashinfer.fused_moe.RoutingMethodType.Unspecified"),
    ("class kind", "comm/abstractions.py", "class CommBackend(Protocol)", "class CommBackend(ABC)",
     "flashinfer.comm.mnnvl.CommBackend"),
    ("method became a property", "comm/mapping.py", "def has_tp(self)", "@property\n    def has_tp(self)",
     "flashinfer.comm.mapping.Mapping.has_tp"),
    ("re-export added", "__init__.py", "from .quantization.fp8_quantization import mxfp8_quantize",
     "from .quantization.fp8_quantization import mxfp8_quantize\nfrom .comm.mapping import Mapping",
     "flashinfer.Mapping (from flashinfer.comm.mapping)"),
    ("annotation changed", A2A, "input_payloads: list[torch.Tensor], runtime_max_tokens_per_rank: int, "
     "invalid_token_expert_id", "input_payloads: list[torch.Tensor], runtime_max_tokens_per_rank: float, "
     "invalid_token_expert_id", "flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll.dispatch annotations"),
    ("module the fake has, gone from the release", "comm/comm_backend.py", None, None,
     "flashinfer.comm.comm_backend (module)"),
    ("barrier after the workspace memset removed", A2A, "            MnnvlMemory.allocated_map[mnnvl_mem.ptr].comm.barrier()\n", "",
     "flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll workspace set-up: barrier after moe_a2a_initialize"),
    ("class deprecation removed", A2A, '@deprecated("MoeAlltoAll is', '@_kept("MoeAlltoAll is',
     "flashinfer.comm.trtllm_moe_alltoall.MoeAlltoAll"),
    ("deprecation message changed", "comm/trtllm_alltoall.py", "Its implementation will move into that class.",
     "It is gone in 0.8.", "flashinfer.comm.trtllm_alltoall.MnnvlMoe.get_moe_workspaces"),
    ("set-up call added", "comm/mnnvl.py", "all_rank_allocate_sizes = comm.allgather(size)",
     "all_rank_allocate_sizes = comm.allgather(size)\n        comm.barrier()",
     "flashinfer.comm.mnnvl.MnnvlMemory.open_mnnvl_memory communicator calls"),
]


@pytest.mark.parametrize("what, rel, old, new, key", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_contract_finds_a_changed_release(tmp_path, what, rel, old, new, key):
    report = compare(open_source(_mutated(tmp_path, "0.7.2.post1", rel, old, new)))
    differing = {d.key for d in report.differences}
    assert key in differing, f"{what}: {key} not among {sorted(differing)}"


def test_contract_finds_an_edited_wheel(tmp_path):
    """0.7.2.post1 as a wheel with the barrier after the workspace memset and every
    ``@deprecated`` decorator taken out: each removal is a difference."""
    import zipfile

    root = RELEASES["0.7.2.post1"]
    wheel = tmp_path / "flashinfer_python-0.7.2.post1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            text = path.read_text()
            text = re.sub(r"^\s*MnnvlMemory\.allocated_map\[mnnvl_mem\.ptr\]\.comm\.barrier\(\)\n", "", text,
                          flags=re.M)
            text = re.sub(r"^\s*@deprecated\(.*\)\n", "", text, flags=re.M)
            zf.writestr(str(path.relative_to(root)), text)
    original = {d.key: d for d in compare(open_source(str(root))).entries}
    report = compare(open_source(str(wheel)))
    assert report.profile == "0.7.2.post1" and report.compared == len(original)
    a2a, two_sided = "flashinfer.comm.trtllm_moe_alltoall", "flashinfer.comm.trtllm_alltoall"
    assert {d.key for d in report.differences} == {
        f"{a2a}.MoeAlltoAll workspace set-up: barrier after moe_a2a_initialize", f"{a2a}.MoeAlltoAll",
        f"{two_sided}.MnnvlMoe", f"{two_sided}.MnnvlMoe.get_moe_workspaces",
        f"{two_sided}.MnnvlMoe.get_moe_prepare_workspace"}
    assert all(original[d.key].real.endswith(d.real + " deprecated: " + original[d.key].fake.split(" deprecated: ")[1])
               for d in report.differences if "deprecated" in d.fake)


def test_contract_finds_a_fake_that_drifted(monkeypatch):
    # The fake's 0.6.16 profile with 0.6.8's top_k kernels: a fidelity bug the contract must see.
    drifted = dataclasses.replace(profiles.PROFILES["0.6.16"], top_k_kernels=profiles.PROFILES["0.6.8"].top_k_kernels)
    monkeypatch.setitem(profiles.PROFILES, "0.6.16", drifted)
    report = compare(open_source(str(RELEASES["0.6.16"])))
    assert [d.key for d in report.differences] == ["csrc SWITCH_TOP_K cases"]


def test_contract_reports_what_it_does_not_imitate():
    report = compare(open_source(str(RELEASES["0.6.14"])))
    assert "flashinfer.moe_ep: the fake imitates it from profile 0.7.2 on" in report.not_imitated
    assert not any(d.key.startswith("flashinfer.moe_ep") for d in report.entries)
    assert {s.module for s in SCOPES} >= {"comm.trtllm_moe_alltoall", "moe_ep"}


def test_contract_excerpt_rewrite_keeps_the_comparison(tmp_path):
    source = open_source(str(RELEASES["0.6.16"]))
    tree = RealTree(source)
    before = compare(source, tree=tree)
    write_excerpt(tree, tmp_path / "again")
    after = compare(open_source(str(tmp_path / "again")))
    assert before.entries == after.entries and before.not_imitated == after.not_imitated


def test_contract_bad_source_is_a_clear_error(tmp_path):
    from testbed.contract import SourceError

    with pytest.raises(SourceError, match="no flashinfer/__init__.py"):
        open_source(str(tmp_path))
    with pytest.raises(SourceError, match="expected a release number"):
        open_source("latest")
    with pytest.raises(ValueError, match="FlashInfer release '0.7.3' is not served by the fake: it serves 0.6.3, 0.6.4, "):
        from testbed.contract import profile_for

        profile_for("0.7.3")


def test_install_resolves_flashinfer_to_the_fake(tmp_path, monkeypatch):
    # An engine's own module, importing FlashInfer by its real names.
    (tmp_path / "engine_a2a.py").write_text(textwrap.dedent("""
        import inspect
        import flashinfer
        from flashinfer.comm import Mapping, MoeAlltoAll
        from flashinfer.comm.trtllm_moe_alltoall import moe_a2a_get_workspace_size_per_rank
        COMBINE_KWS = set(inspect.signature(MoeAlltoAll.combine).parameters)
        SIZE = moe_a2a_get_workspace_size_per_rank(8, 16, 256, 128)
        ROOT = flashinfer
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for profile, has_output_kw in (("0.6.8", False), ("0.7.2", True)):
        with install(profile):
            engine = importlib.import_module("engine_a2a")
            from fakes.flashinfer.comm import trtllm_moe_alltoall as fake

            assert engine.ROOT is sys.modules["fakes.flashinfer"]
            assert ("output" in engine.COMBINE_KWS) is has_output_kw
            assert engine.SIZE == fake.moe_a2a_get_workspace_size_per_rank(8, 16, 256, 128) > 0
        del sys.modules["engine_a2a"]
        assert not any(n == "flashinfer" or n.startswith("flashinfer.") for n in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("flashinfer")  # nothing left behind (no real FlashInfer here)


def test_install_refuses_what_the_release_does_not_ship():
    with install("0.6.8"):
        with pytest.raises(ModuleNotFoundError, match="flashinfer.moe_ep"):
            importlib.import_module("flashinfer.moe_ep")
        with pytest.raises(ImportError):
            from flashinfer.comm import moe_a2a_active_rank_mask  # noqa: F401  (0.6.16 on)
        with pytest.raises(RuntimeError, match="already active"):
            with install("0.7.2"):
                pass
    with pytest.raises(ValueError, match="'0.9' is not served by the fake"):
        with install("0.9"):
            pass


def test_install_hides_the_fakes_own_modules():
    """What no release ships does not import under the real name (the fake is not more
    lenient than the release), while the fake still reaches it under its own."""
    with install("0.7.2"):
        for name in ("flashinfer.profiles", "flashinfer.comm.moe_a2a_kernels", "flashinfer.annotations"):
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(name)
        importlib.import_module("fakes.flashinfer.comm.moe_a2a_kernels")
        importlib.import_module("flashinfer.comm.comm_backend")  # shipped from 0.6.16
    with install("0.6.8"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("flashinfer.comm.comm_backend")


def test_install_entered_without_with_exits_cleanly():
    """A script that enters install() and never leaves it: the generator is closed at
    interpreter exit and must say nothing there."""
    code = ("from fakes.flashinfer import install\n"
            "block = install('0.7.2')\n"
            "block.__enter__()\n"
            "import flashinfer.comm\n"
            "print(flashinfer.__version__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0 and proc.stdout.strip() == "0.7.2", proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def test_install_pytest_plugin_option(tmp_path):
    (tmp_path / "test_engine.py").write_text(textwrap.dedent("""
        def test_engine_sees_the_fake():
            import flashinfer
            from flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll
            assert flashinfer.__version__ == "0.6.14"
            assert "output" not in MoeAlltoAll.combine.__code__.co_varnames
    """))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--fake-flashinfer=0.6.14", str(tmp_path / "test_engine.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_fake_deprecation_warnings_only_on_0_7():
    import warnings

    from fakes.flashinfer.comm import trtllm_alltoall, trtllm_moe_alltoall

    calls = {"MoeAlltoAll": lambda: trtllm_moe_alltoall.MoeAlltoAll(None, 4, 2, 8, hidden_size=16),
             "MnnvlMoe": lambda: trtllm_alltoall.MnnvlMoe.get_moe_workspaces(None)}
    for profile in ("0.6.16", "0.7.2"):
        for name, call in calls.items():
            with profiles.fake_profile(profile), warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                with pytest.raises(AttributeError, match="'NoneType' object"):  # no mapping: only the warning matters
                    call()
            deprecations = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
            if profile == "0.7.2":
                assert deprecations and deprecations[0].startswith(f"{name} is deprecated; use flashinfer.moe_ep")
            else:
                assert deprecations == [], (profile, name)


def test_contract_reader_follows_star_imports():
    """``from .x import *`` binds x's public names (``__all__`` when it has one), as Python does."""
    import ast as _ast

    from testbed.contract.surface import RealModule

    sources = {
        "pkg": ("from .enums import *\nfrom .hidden import *\n", True),
        "pkg.enums": ("__all__ = ['Kind']\nclass Kind: pass\nclass Other: pass\n", False),
        "pkg.hidden": ("def _private(): pass\ndef shown(): pass\n", False),
    }
    modules: dict = {}

    def load(name):
        if name not in modules and name in sources:
            text, is_package = sources[name]
            modules[name] = RealModule(_ast.parse(text), name, is_package, load)
        return modules.get(name)

    pkg = load("pkg")
    assert pkg.resolve("Kind")[0].name == "pkg.enums"
    assert pkg.resolve("shown")[0].name == "pkg.hidden"
    assert pkg.resolve("Other") is None and pkg.resolve("_private") is None
