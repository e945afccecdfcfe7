"""A FlashInfer pin with no wheel (0.7.3) is served by evidence: the profile nearest it under
which every use the engine release's all-to-all path makes of FlashInfer is there, named in
every report with its count; a use no profile has is refused by name (no engine imported:
the engines' checked-in path files and synthetic releases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.flashinfer import profiles
from fakes.flashinfer.profiles import WHEELLESS, Evidence, UnservedRelease
from testbed import integrations
from testbed.contract.consumer import Consumer, PathFile
from testbed.contract.serving import evidence, missing, uses
from testbed.contract.source import open_package

EXCERPTS = Path(__file__).parent / "data" / "consumer_excerpts"
TOY = Consumer("toy", "toy", (PathFile("toy/a2a.py"),))


def _release(tmp_path, code: str, pin: str = "0.7.3"):
    (tmp_path / "toy").mkdir(parents=True)
    (tmp_path / "toy" / "__init__.py").write_text("")
    (tmp_path / "toy" / "a2a.py").write_text(code)
    (tmp_path / "toy-1.0.0.dist-info").mkdir()
    (tmp_path / "toy-1.0.0.dist-info" / "METADATA").write_text(
        f"Name: toy\nVersion: 1.0.0\nRequires-Dist: flashinfer-python=={pin}\n")
    return open_package("toy", str(tmp_path))


def test_serving_vllm_0_34_0_by_0_7_4_for_every_use_it_makes():
    source = open_package("vllm", str(EXCERPTS / "vllm-0.34.0"))
    consumer = integrations.get("vllm").consumer()
    found = evidence("vLLM 0.34.0", source, consumer, "0.7.3")
    needed = uses(source, consumer)
    assert found == Evidence("0.7.3", "0.7.4", len(needed), "vLLM 0.34.0") and len(needed) >= 60
    # The older neighbour lacks the keywords 0.34.0 passes (its probes accept 0.7.2 all the same).
    lacking = {u.what for u in missing(needed, "0.7.2.post1")}
    assert {"flashinfer.moe_ep.NVLinkOneSidedConfig(cft=)", "flashinfer.moe_ep.NVLinkOneSidedConfig(lamport=)"} <= lacking
    assert any(w.endswith("dispatch(runtime_max_tokens_per_rank=)") for w in lacking)


def test_serving_takes_the_nearest_profile_with_every_use(tmp_path):
    source = _release(tmp_path, "from flashinfer.moe_ep import NVLinkOneSidedConfig\n"
                                "NVLinkOneSidedConfig(cft=False)\n")
    assert evidence("toy 1.0.0", source, TOY, "0.7.3").by == "0.7.4"
    older = _release(tmp_path / "old", "from flashinfer.comm import MoeAlltoAll\nMoeAlltoAll.dispatch\n")
    assert evidence("toy 1.0.0", older, TOY, "0.7.3").by == "0.7.2.post1"  # 0.7.4 removed MoeAlltoAll


def test_serving_refuses_a_use_no_profile_has_by_name(tmp_path):
    source = _release(tmp_path, "from flashinfer.moe_ep import NoSuchClass\n")
    with pytest.raises(UnservedRelease) as e:
        evidence("toy 1.0.0", source, TOY, "0.7.3")
    message = str(e.value)
    assert message.startswith("toy 1.0.0 pins flashinfer-python 0.7.3, which has no wheel (")
    assert "flashinfer.moe_ep.NoSuchClass (toy/a2a.py:1): no profile has it" in message and "\n" not in message


def test_serving_never_for_a_release_with_a_wheel(tmp_path):
    source = _release(tmp_path, "from flashinfer.moe_ep import NVLinkOneSidedConfig\n", pin="0.9.1")
    assert "0.9.1" not in WHEELLESS
    with pytest.raises(UnservedRelease, match="pins flashinfer-python 0.9.1, which no profile of the fake serves"):
        evidence("toy 1.0.0", source, TOY, "0.9.1")
    with pytest.raises(ValueError, match="has a wheel"):
        profiles.serve_by_evidence(Evidence("0.9.1", "0.7.4", 1, "toy 1.0.0"))


def test_serving_is_named_everywhere_and_inherited(monkeypatch):
    # set, then emptied: the teardown then removes what serve_by_evidence writes below (a delenv of
    # an absent variable records nothing to undo, and the evidence would serve 0.7.3 to every
    # later test of this process)
    monkeypatch.setenv(profiles.EVIDENCE_ENV, "")
    with pytest.raises(UnservedRelease):
        profiles.resolve("0.7.3")
    profiles.serve_by_evidence(Evidence("0.7.3", "0.7.4", 78, "vLLM 0.34.0"))
    assert profiles.resolve("0.7.3").name == "0.7.4"
    assert profiles.served_by("0.7.3") == "0.7.3 (no wheel; served by 0.7.4 for the 78 uses vLLM 0.34.0 makes)"
    assert "0.7.3=0.7.4=78=vLLM 0.34.0" in profiles.os.environ[profiles.EVIDENCE_ENV]  # what ranks inherit
