"""The engine releases the testbed drives besides the installed ones (vLLM 0.31.0 and 0.32.0 on
FlashInfer 0.7.0.post1, their one-sided manager driving ``MoeAlltoAll`` itself; SGLang 0.5.22 on
0.7.1, without the SP-prefill all-to-all), each from its wheel, fetched and unpacked once into
the testbed's cache. Their matrices, mutants and findings are sweeps (``a2a-testbed sweep``,
:mod:`testbed.harness.sweeps`), which CI runs; here: what each release uses of FlashInfer, read
from its checked-in path files, and how a release is taken in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from testbed import integrations
from testbed.contract import open_source
from testbed.contract.consumer import check, pinned_flashinfer
from testbed.contract.source import open_package
from testbed.contract.tree import RealTree

DATA = Path(__file__).parent / "data"
EXCERPTS = sorted(p.name for p in (DATA / "consumer_excerpts").iterdir() if p.is_dir())


def test_engine_release_every_driven_release_has_its_excerpt():
    """Each release an adapter is written for or drives from its wheel has its path files checked
    in (``a2a-testbed contract --consumer NAME=RELEASE --write-excerpt`` writes them)."""
    driven = {f"{i.name}-{r}" for i in integrations.engines() for r in i.engine.tested + i.engine.other_releases}
    assert driven <= set(EXCERPTS), sorted(driven - set(EXCERPTS))


@pytest.mark.parametrize("excerpt", EXCERPTS)
def test_engine_release_consumer_contract(excerpt):
    """What the release uses of FlashInfer, in its checked-in path files, against its pin's
    checked-in excerpt and the fake's profile of it (no engine imported). A pin with no wheel
    has no source: the release that serves it by evidence stands in for it."""
    from fakes.flashinfer.profiles import WHEELLESS, resolve
    from testbed.contract.serving import evidence

    engine = excerpt.rsplit("-", 1)[0]
    source = open_package(engine, str(DATA / "consumer_excerpts" / excerpt))
    consumer = integrations.get(engine).consumer()
    pin = pinned_flashinfer(source)
    if pin in WHEELLESS:
        pin = evidence(f"{engine} {source.version}", source, consumer, pin).by
    assert pin and (DATA / "flashinfer_excerpts" / pin).is_dir(), pin
    report = check(source, consumer, RealTree(open_source(str(DATA / "flashinfer_excerpts" / pin))), resolve(pin).name)
    # The floor says the check read the release's uses (SGLang 0.5.9 .. 0.5.11's fewest: 40).
    assert report.fake_defects == 0 and report.count("ok") >= 40, report


def test_engine_release_pin_no_profile_serves_is_refused(tmp_path, monkeypatch):
    """An engine whose metadata pins a FlashInfer no profile serves is refused in one line
    naming the engine release, its pin and what the fake serves."""
    from testbed.integrations.vllm.environment import ENGINE, SOURCE_ENV

    root = tmp_path / "checkout"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm-0.99.0.dist-info").mkdir()
    (root / "vllm-0.99.0.dist-info" / "METADATA").write_text(
        "Name: vllm\nVersion: 0.99.0\nRequires-Dist: flashinfer-python==0.9.1\n")
    monkeypatch.setenv(SOURCE_ENV, str(root))
    with pytest.raises(ValueError) as e:
        ENGINE.pinned()
    assert str(e.value).startswith("vLLM 0.99.0 pins flashinfer-python 0.9.1, which no profile of the fake serves: "
                                   "it serves 0.6.3, 0.6.4, ")
    assert "\n" not in str(e.value)


GUARDED = """
import importlib.util

def has_one_sided():
    return importlib.util.find_spec("flashinfer.comm.trtllm_moe_alltoall") is not None

if has_one_sided():
    from flashinfer.comm import Mapping
    from flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll

try:
    from flashinfer.comm.trtllm_alltoall import MnnvlMoe
    two_sided = True
except ImportError:
    two_sided = False
"""


def test_engine_release_guarded_imports_rebound_per_release(tmp_path, monkeypatch):
    """vLLM 0.31/0.32 bind FlashInfer's classes under `if probe():` at import, SGLang under
    `try:`; each scenario re-runs the blocks under its own release, and a block that would not
    bind its names there leaves them unbound, as a fresh import would."""
    import importlib

    import fakes.flashinfer
    from testbed import patch
    from testbed.integrations.engine import guarded_flashinfer_imports

    (tmp_path / "guarded_engine.py").write_text(GUARDED)
    monkeypatch.syspath_prepend(str(tmp_path))
    with fakes.flashinfer.install("0.7.0.post1"):
        module = importlib.import_module("guarded_engine")
        names = guarded_flashinfer_imports(module)
        from flashinfer.comm.trtllm_moe_alltoall import MoeAlltoAll

        assert names["MoeAlltoAll"] is MoeAlltoAll and names["two_sided"] is True and "MnnvlMoe" in names
    with fakes.flashinfer.install("0.7.4"):
        names = guarded_flashinfer_imports(module)
        assert names == {"Mapping": patch.UNBOUND, "MoeAlltoAll": patch.UNBOUND, "two_sided": False}
        undo = [patch.attribute(module, n, v) for n, v in names.items()]
        assert not hasattr(module, "MoeAlltoAll") and module.two_sided is False
        for u in undo:
            u()
    assert module.MoeAlltoAll is not None and module.two_sided is True
    del sys.modules["guarded_engine"]


_OLD_PLATFORMS = '''
def vllm_version_matches_substr(substr):
    return substr in "0.22.0"


def cpu_platform_plugin():
    is_cpu = vllm_version_matches_substr("cpu")
    return "vllm.platforms.cpu.CpuPlatform" if is_cpu else None


VLLM_TARGET_DEVICE = "cpu"
_current_platform = "UnspecifiedPlatform"  # importing vllm resolved it once already
'''


@pytest.mark.parametrize("reads_target", [False, True])
def test_engine_release_cpu_platform_as_the_target_device_asks(tmp_path, reads_target):
    """A vLLM whose CPU platform plugin takes the CPU platform only for a ``+cpu`` build (before
    0.28) resolves to it here as ``VLLM_TARGET_DEVICE=cpu`` asks, its platform resolved again; one
    whose plugin reads the variable is left as it is (a probe of the plugin's source)."""
    import subprocess

    platforms = tmp_path / "vllm" / "platforms"
    platforms.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    body = _OLD_PLATFORMS.replace("is_cpu = vllm", "is_cpu = VLLM_TARGET_DEVICE == 'cpu' and vllm") \
        if reads_target else _OLD_PLATFORMS
    (platforms / "__init__.py").write_text(body)
    code = ("from testbed.integrations.vllm.environment import prepare_environment; prepare_environment(); "
            "import vllm.platforms as p; print(p.cpu_platform_plugin(), p._current_platform)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "A2A_VLLM_SOURCE": str(tmp_path), "VLLM_TARGET_DEVICE": "cpu"},
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    # (the plugin that reads the variable still asks for a +cpu build here: left alone, it says no)
    assert out.stdout.split() == (["None", "UnspecifiedPlatform"] if reads_target
                                  else ["vllm.platforms.cpu.CpuPlatform", "None"])


def test_engine_release_moe_layer_is_probed_by_kind_and_arguments(monkeypatch):
    """vLLM's MoE layer is built through FusedMoEFactory (0.27 on) or a FusedMoE function (0.24 ..
    0.26), or as the FusedMoE module class (0.18 .. 0.23); a release with none of them, or one
    without an argument the layer level needs to hand it, is refused naming it."""
    import types

    import torch

    from testbed.integrations.vllm import environment as env

    def layer(**names):
        module = types.ModuleType(env.LAYER_MODULE)
        module.__dict__.update(names)
        monkeypatch.setitem(sys.modules, env.LAYER_MODULE, module)

    def factory(num_experts, top_k, hidden_size, intermediate_size, *, params_dtype=None, renormalize=True,
                quant_config=None, prefix="", custom_routing_function=None, routed_scaling_factor=1.0,
                apply_routed_scale_to_output=False, apply_router_weight_on_input=False,
                is_sequence_parallel=False, shared_experts=None, reduce_results=True):
        return None

    def without_shared(num_experts, top_k, hidden_size, intermediate_size, params_dtype=None, renormalize=True,
                       quant_config=None, prefix="", custom_routing_function=None, routed_scaling_factor=1.0,
                       apply_routed_scale_to_output=False, apply_router_weight_on_input=False,
                       is_sequence_parallel=False):  # and no reduce_results, as 0.24's (it always reduces)
        return None

    class FusedMoE(torch.nn.Module):  # 0.18 .. 0.23: the layer a module class (shared experts by subclass)
        def __init__(self, num_experts, top_k, hidden_size, intermediate_size, params_dtype=None,
                     reduce_results=False, renormalize=True, quant_config=None, prefix="",
                     custom_routing_function=None, routed_scaling_factor=1.0, apply_router_weight_on_input=False,
                     is_sequence_parallel=False):
            super().__init__()

    class Partial(torch.nn.Module):
        def __init__(self, num_experts, top_k, hidden_size, intermediate_size, params_dtype=None):
            super().__init__()

    layer(FusedMoEFactory=factory, FusedMoE=FusedMoE)
    assert env.moe_factory() is factory and env.moe_class() is None and env.lacks_moe_layer() is None
    layer(FusedMoE=factory)
    assert env.moe_factory() is factory and env.lacks_moe_layer() is None
    layer(FusedMoE=FusedMoE)
    assert env.moe_factory() is None and env.moe_class() is FusedMoE and env.lacks_moe_layer() is None
    layer(FusedMoE=type("FusedMoE", (), {}))  # a class, but no module
    assert env.moe_class() is None and "has no MoE layer" in env.lacks_moe_layer()
    layer(FusedMoE=Partial)
    assert env.lacks_moe_layer() == (f"has a MoE layer {env.LAYER_MODULE}.Partial without renormalize, quant_config, "
                                     "prefix, custom_routing_function, routed_scaling_factor, "
                                     "apply_router_weight_on_input, is_sequence_parallel")
    layer(FusedMoE=without_shared)
    assert env.lacks_moe_layer() == f"has a MoE layer {env.LAYER_MODULE}.without_shared without shared_experts"


def test_engine_release_source_is_what_its_subprocesses_import(tmp_path, monkeypatch):
    """A release under test is what every Python process an engine starts imports too (vLLM
    inspects a model's class in a subprocess of its own): its source leads ``sys.path`` here and
    ``PYTHONPATH`` for children, once, ahead of what was there."""
    import os
    import subprocess

    from testbed.integrations import engine as support

    (tmp_path / "released_probe.py").write_text("WHERE = 'the release under test'\n")
    monkeypatch.setenv("A2A_PROBE_SOURCE", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("A2A_PROBE_UNSET", raising=False)
    assert support.source_first("A2A_PROBE_UNSET") is None and os.environ["PYTHONPATH"] == "/elsewhere"
    assert support.source_first("A2A_PROBE_SOURCE") == str(tmp_path)
    support.source_first("A2A_PROBE_SOURCE")
    assert sys.path[0] == str(tmp_path) and sys.path.count(str(tmp_path)) == 1
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(tmp_path), "/elsewhere"])
    done = subprocess.run([sys.executable, "-c", "import released_probe; print(released_probe.WHERE)"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "the release under test", done.stderr
