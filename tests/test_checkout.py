"""An engine's git checkout, as its developer has it, judged as a release: where its package
lies, what it says its version is, the FlashInfer its own files pin, and a refusal asking for
``--profile`` where they pin none, never a default release imitated."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testbed.contract.consumer import pinned_flashinfer
from testbed.contract.source import checkout_version, open_package, package_root


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


VLLM = {"vllm/__init__.py": "", "vllm/config.py": "x = 1\n",
        "requirements/common.txt": "numpy\n", "requirements/cuda.txt": "# NVIDIA\ntorch==2.14.0\n"
                                                                         "flashinfer-python==0.7.3  # the kernels\n"}
SGLANG = {"python/sglang/__init__.py": "", "python/sglang/version.py": "",
          "python/pyproject.toml": '[project]\nname = "sglang"\ndependencies = [\n  "torch==2.9.1",\n'
                                   '  "flashinfer_python[cu13]==0.7.2",\n]\n'}


def test_checkout_package_found_at_the_root_under_python_or_as_the_package(tmp_path):
    vllm = _tree(tmp_path / "vllm-repo", VLLM)
    sglang = _tree(tmp_path / "sglang-repo", SGLANG)
    assert package_root("vllm", vllm) == vllm and package_root("vllm", vllm / "vllm") == vllm
    assert package_root("sglang", sglang) == sglang / "python"
    assert package_root("sglang", sglang / "python" / "sglang") == sglang / "python"
    assert package_root("vllm", sglang) is None


def test_checkout_pin_read_where_the_checkout_keeps_it(tmp_path):
    vllm = open_package("vllm", str(_tree(tmp_path / "v", VLLM)))
    sglang = open_package("sglang", str(_tree(tmp_path / "s", SGLANG)))
    assert (pinned_flashinfer(vllm), pinned_flashinfer(sglang)) == ("0.7.3", "0.7.2")
    assert vllm.version == sglang.version == "checkout (version unknown)"


def test_checkout_version_from_git_describe_then_the_version_file(tmp_path):
    root = _tree(tmp_path / "v", VLLM)
    assert checkout_version(root, "vllm") == "(version unknown)"
    checkout_version.cache_clear()  # asked once per checkout and process; the tree changes here
    (root / "vllm" / "_version.py").write_text("__version__ = version = '0.34.0.dev3'\n")
    assert checkout_version(root, "vllm") == "0.34.0.dev3"
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "one")
    _git(root, "tag", "v0.34.0")
    checkout_version.cache_clear()
    assert checkout_version(root, "vllm") == "0.34.0"
    (root / "vllm" / "config.py").write_text("x = 2\n")
    _git(root, "commit", "-qam", "two")
    checkout_version.cache_clear()
    assert checkout_version(root, "vllm") == f"0.34.0+g{_git(root, 'rev-parse', '--short', 'HEAD')}"
    assert open_package("vllm", str(root)).version.startswith("checkout 0.34.0+g")


def test_checkout_without_a_pin_is_refused_asking_for_profile(tmp_path, monkeypatch):
    from fakes.flashinfer.profiles import UnservedRelease
    from testbed import integrations
    from testbed.integrations.engine import CHECKOUT_PIN_ENV

    engine = integrations.get("vllm").engine
    files = dict(VLLM, **{"requirements/cuda.txt": "torch==2.14.0\nflashinfer-python\n"})
    root = str(_tree(tmp_path / "v", files))
    monkeypatch.delenv(CHECKOUT_PIN_ENV, raising=False)
    with pytest.raises(UnservedRelease, match=r"vLLM checkout \(version unknown\) \(.*\) pins no FlashInfer in its "
                                              r"requirements/\*\.txt or pyproject\.toml: name the release it runs on "
                                              r"with --profile RELEASE"):
        engine.pinned(root)
    monkeypatch.setenv(CHECKOUT_PIN_ENV, "0.7.2.post1")
    assert engine.pinned(root) == "0.7.2.post1"
    assert engine.release(str(_tree(tmp_path / "w", VLLM)))[1] == "0.7.3"  # its own pin wins over --profile


@pytest.mark.needs("vllm")
def test_checkout_shaped_vllm_judged_as_its_release(tmp_path):
    """vLLM 0.34.0 as a checkout: no ``.dist-info``, no ``_version.py``, the pin in
    ``requirements/cuda.txt``; the same verdict as the release's wheel, the report naming the
    pin (each in a process of its own: a run makes its process run the release it names)."""
    import json
    import os
    import shutil
    import sys

    from testbed.contract.source import unpacked

    root = tmp_path / "vllm"
    shutil.copytree(unpacked("vllm", "0.34.0") / "vllm", root / "vllm",
                    ignore=shutil.ignore_patterns("__pycache__", "_version.py", "*.so"))
    _tree(root, {"requirements/cuda.txt": "torch==2.14.0\nflashinfer-python==0.7.3\n"})
    verdicts = {}
    for name, source in (("checkout", str(root)), ("wheel", "0.34.0")):
        done = subprocess.run([sys.executable, "-m", "testbed", "run", "--integration", "vllm", "--vllm-source", source,
                               "--layout", "2,1,2,1", "--stages", "bf16:16", "--tokens", "5,7",
                               "--json", str(tmp_path / f"{name}.json")],
                              capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        verdicts[name] = [(s["passed"], s["known"], s["builds"])
                          for s in json.loads((tmp_path / f"{name}.json").read_text())["scenarios"]]
        if name == "checkout":
            assert (f"vLLM checkout (version unknown) ({root}): FlashInfer 0.7.3, the release its requirement files "
                    "pin") in done.stdout
    assert verdicts["checkout"] == verdicts["wheel"] and verdicts["wheel"][0][0]
