"""FlashInfer releases by name: every release 0.6.3 .. 0.7.4 is served by a profile (its own, or
one the contract finds identical to it), a profile is its base plus declared deltas, and every
way to name a release the fake does not serve (the profile option, the pytest option, the
environment variable, the contract's specs, the installed FlashInfer, an engine's pin) is
answered with one line naming what it serves and exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.flashinfer import profiles
from testbed.harness import lineage

ROOT = Path(__file__).resolve().parent.parent
UNSERVED = "0.9.0"  # a release no profile serves (and not one without a wheel, which is served by evidence)
# The flashinfer-python releases on PyPI from 0.6.3 to 0.7.4 (pip index versions, 2026-12-05).
PYPI_0_6_3_TO_0_7_4 = (
    "0.6.3 0.6.4 0.6.5 0.6.6 0.6.7 0.6.7.post1 0.6.7.post2 0.6.7.post3 0.6.8 0.6.8.post1 0.6.9 0.6.10 0.6.10.post1 0.6.11 0.6.11.post1 0.6.11.post2 0.6.11.post3 0.6.12 0.6.13 0.6.14 "
    "0.6.15 0.6.15.post1 0.6.16 0.6.16.post1 0.6.16.post2 0.6.16.post3 0.6.16.post4 0.6.17 0.6.18 0.6.18.post1 0.7.0 "
    "0.7.0.post1 0.7.1 0.7.2 0.7.2.post1 0.7.4").split()


def _one_line_refusal(proc: subprocess.CompletedProcess) -> str:
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert f"'{UNSERVED}'" in out or f" {UNSERVED}," in out, out
    assert "it serves 0.6.3, 0.6.4, 0.6.5, " in out and out.endswith("0.7.2.post1, 0.7.4"), out
    return out


def _here(capsys, *argv: str) -> subprocess.CompletedProcess:
    """``a2a-testbed ARGV`` in this process (where the flag, not the environment, names the release)."""
    from testbed.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


def _run(*argv: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=240, cwd=cwd,
                          env={**os.environ, **(env or {})})


def test_releases_every_one_from_0_6_3_to_0_7_4_is_served():
    assert profiles.served_releases() == tuple(PYPI_0_6_3_TO_0_7_4)
    for release in PYPI_0_6_3_TO_0_7_4:
        served = profiles.resolve(release)
        assert release == served.name or release in served.serves
    assert sorted(profiles.PROFILES, key=profiles.release_key) == list(profiles.PROFILES)


def test_releases_profile_is_its_base_plus_deltas():
    """Each derived profile names a neighbour as base, toward its root (0.6.8 from either side,
    or 0.7.4); a table without an entry for it answers with its nearest base's entry."""
    for p in profiles.PROFILES.values():
        chain = [q.name for q in profiles.chain(p)]
        assert chain[0] == p.name and len(set(chain)) == len(chain)
        assert chain[-1] in ("0.6.8", "0.7.4")
        keys = [profiles.release_key(n) for n in chain]
        assert keys == sorted(keys, reverse=keys[0] > keys[-1])
    assert profiles.pick({"0.6.7": "old", "0.6.8": "root"}, profiles.resolve("0.6.3")) == "old"
    assert profiles.pick({"0.6.7": "old", "0.6.8": "root"}, profiles.resolve("0.6.9")) == "root"
    table = {"0.6.8": "a", "0.7.0": "b"}
    assert profiles.pick(table, profiles.resolve("0.7.2.post1")) == "b"
    assert profiles.pick(table, profiles.resolve("0.6.16.post3")) == "a"
    with pytest.raises(KeyError):
        profiles.pick(table, profiles.resolve("0.7.4"))  # a profile of its own, no base


def _tables() -> dict:
    from fakes.flashinfer import tllm_enums
    from fakes.flashinfer.comm import mnnvl, trtllm_moe_alltoall
    from fakes.flashinfer.fused_moe import core
    from fakes.flashinfer.quantization import fp4_quantization
    from testbed.contract import setup_calls

    return {"tllm_enums members": tllm_enums._MEMBERS, "enum repr": tllm_enums._EVAL_SAFE,
            "fused MoE missing parameters": core._MISSING, "routed pair": core._READS_PAIR,
            "fp4_quantize": fp4_quantization._FP4_QUANTIZE, "MnnvlMemory": mnnvl._MNNVL_MEMORY,
            "comm names": trtllm_moe_alltoall._BY_PROFILE, "comm __all__": trtllm_moe_alltoall._ALL,
            "comm names from mnnvl": trtllm_moe_alltoall._FROM_MNNVL, "set-up calls": setup_calls.SETUP_CALLS}


@pytest.mark.parametrize("what", sorted(_tables()))
def test_releases_table_entry_only_where_the_release_differs(what):
    """A per-release table declares a release only where it differs from the nearest base that
    has an entry: a repeated entry would hide which release changed what."""
    table = _tables()[what]
    assert set(table) <= set(profiles.PROFILES), sorted(set(table) - set(profiles.PROFILES))
    for name, entry in table.items():
        base = next((p.name for p in list(profiles.chain(profiles.PROFILES[name]))[1:] if p.name in table), None)
        assert base is None or table[base] != entry, f"{what}: {name}'s entry repeats {base}'s"


def test_releases_served_release_is_named_in_reports():
    assert profiles.served_by("0.6.16.post3") == "0.6.16.post3 (served by 0.6.16)"
    assert profiles.served_by("0.7.2.post1") == "0.7.2.post1"
    with profiles.fake_profile("0.6.16.post3"):
        import fakes.flashinfer as fi

        assert fi.__version__ == "0.6.16.post3" and profiles.active().name == "0.6.16"


def test_releases_profile_option_takes_pip_version_strings():
    # In a process of its own: a run here would start this test process's fork server (one per
    # process, its preload fixed at its start) without the engines the session's pool preloads,
    # and engine tests later in this process would import their engine in ranks shared across
    # profiles.
    proc = _run(sys.executable, "-m", "testbed", "run", "--profile", "0.6.16.post3", "--layout", "2,1,2,1",
                "--stages", "bf16:8", "--tokens", "3,2")
    assert proc.returncode == 0 and "0.6.16.post3 (served by 0.6.16)" in proc.stdout, proc.stdout + proc.stderr


def test_releases_unserved_profile_option_one_line(capsys):
    out = _one_line_refusal(_here(capsys, "run", "--profile", UNSERVED, "--layout", "2,1,2,1", "--stages", "bf16:8",
                                  "--tokens", "3,2"))
    assert out.startswith("a2a-testbed run: error: --profile: FlashInfer release")


def test_releases_unserved_matrix_profile_one_line(capsys):
    _one_line_refusal(_here(capsys, "run", "--matrix-profile", UNSERVED))


def test_releases_unserved_environment_variable_one_line():
    out = _one_line_refusal(_run(sys.executable, "-m", "testbed", "version",
                                 env={"A2A_FAKE_FLASHINFER_PROFILE": UNSERVED}))
    assert out.startswith("a2a-testbed: error: A2A_FAKE_FLASHINFER_PROFILE: ")


def test_releases_unserved_pytest_option_and_environment_one_line(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    pytest_cmd = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist")
    out = _one_line_refusal(_run(*pytest_cmd, f"--fake-flashinfer={UNSERVED}", cwd=tmp_path))
    assert out.startswith("Exit: --fake-flashinfer: ")
    out = _one_line_refusal(_run(*pytest_cmd, env={"A2A_FAKE_FLASHINFER_PROFILE": UNSERVED}, cwd=tmp_path))
    assert out.startswith("Exit: A2A_FAKE_FLASHINFER_PROFILE: ")
    ok = _run(*pytest_cmd, "--fake-flashinfer=0.7.2.post1", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_releases_unserved_contract_specs_one_line(tmp_path, capsys):
    _one_line_refusal(_here(capsys, "contract", "--flashinfer", UNSERVED))
    _one_line_refusal(_here(capsys, "contract", "--flashinfer", "0.7.2", "--profile", UNSERVED))
    engine = tmp_path / "site"
    (engine / "vllm").mkdir(parents=True)
    (engine / "vllm" / "__init__.py").write_text("")
    (engine / "vllm-0.99.0.dist-info").mkdir()
    (engine / "vllm-0.99.0.dist-info" / "METADATA").write_text(
        f"Name: vllm\nVersion: 0.99.0\nRequires-Dist: flashinfer-python=={UNSERVED}\n")
    out = _one_line_refusal(_here(capsys, "contract", "--consumer", f"vllm={engine}"))
    assert f"vllm 0.99.0 pins flashinfer-python {UNSERVED}, which no profile of the fake serves" in out
    # the same checkout as the engine to run: refused before any rank starts (in a process of its
    # own: taking a checkout sets the environment every later pool would inherit)
    out = _one_line_refusal(_run(sys.executable, "-m", "testbed", "run", "--integration", "vllm", "--vllm-source",
                                 str(engine)))
    assert f"vLLM 0.99.0 pins flashinfer-python {UNSERVED}" in out


def test_releases_unserved_installed_flashinfer_one_line(monkeypatch):
    from testbed import gpu_env

    monkeypatch.setattr(gpu_env.metadata, "version", lambda dist: UNSERVED)
    with pytest.raises(ValueError) as e:
        gpu_env.installed_profile()
    assert str(e.value).startswith(f"the installed flashinfer-python '{UNSERVED}' is not served by the fake: ")
    monkeypatch.setattr(gpu_env.metadata, "version", lambda dist: "0.6.16.post3")
    assert gpu_env.installed_profile() == "0.6.16.post3"


def test_releases_lineage_first_release_and_table():
    cells = [lineage.Cell("X-1", "vLLM 0.32.0", "0.7.4", "reproduces"),
             lineage.Cell("X-1", "vLLM 0.32.0", "0.7.0.post1", "passes"),
             lineage.Cell("X-1", "vLLM 0.31.0", "0.7.4", "reproduces"),
             lineage.Cell("X-1", "vLLM 0.31.0", "0.6.8", "fails otherwise", "completes: AssertionError: no module"),
             lineage.Cell("X-2", "vLLM 0.31.0", "0.6.8", "not run", "--layout: a rule")]
    assert lineage.first(cells, "X-1") == cells[2] and lineage.first(cells, "X-2") is None
    table = lineage.format_table(cells, {"X-1": "a finding"})
    assert "first: vLLM 0.31.0 on FlashInfer 0.7.4" in table and "reproduces on none of these" in table
    assert "  vLLM 0.31.0      0.6.8 F  0.7.4 R" in table and "F on 0.6.8: completes: AssertionError" in table
    assert lineage.releases("0.7.0.post1")[:4] == ["0.6.3", "0.6.8", "0.6.14", "0.6.16"]
    assert "0.7.0.post1" in lineage.releases("0.7.0.post1") and "0.7.0" not in lineage.releases("0.7.0.post1")


@pytest.mark.needs("vllm")
def test_releases_lineage_survey_runs_each_scenario_once_with_the_same_cells(monkeypatch):
    """Findings whose reproducer is a matrix scenario share it: each distinct scenario (its
    label aside) runs once per process, one the matrix ran is not run again, and every cell
    is what running each cell on its own gives."""
    import dataclasses

    from testbed.harness import runner
    from testbed.harness.invariants import Failure, Verdict

    def verdict(sc):  # a stand-in run: the scenario's own fields decide, as a rank's would
        v = Verdict(sc)
        if sc.passes[0][0] % 2:
            v.failures.append(Failure("collectives", f"odd on {sc.profile}"))
        return v

    runs = []

    def run(pool, sc, timeout_s, mutant=None):
        runs.append(dataclasses.replace(sc, label=""))
        return verdict(sc)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(runner, "_UNMUTATED", {})
    shared = lineage.survey(None, "vllm")
    assert len(runs) == len(set(runs)) and len(runs) < len(shared)  # some findings share a scenario
    ran_before = runs[0]
    runs.clear()
    monkeypatch.setattr(runner, "_UNMUTATED", {ran_before: verdict(ran_before)})
    assert lineage.survey(None, "vllm") == shared and ran_before not in runs
    monkeypatch.setattr(runner, "unmutated", lambda pool, sc, timeout_s: verdict(sc))
    assert lineage.survey(None, "vllm") == shared  # each cell run on its own


@pytest.mark.needs("vllm")
def test_releases_lineage_finding_whose_code_is_absent_runs_on_the_pin_alone(monkeypatch):
    """Off the engine's pin, a finding whose code the release lacks cannot reproduce: its cells
    are not run, named so, and the lineage is what running them gives."""
    import dataclasses

    from testbed import integrations
    from testbed.harness import findings, runner
    from testbed.harness.invariants import Failure, Verdict

    def verdict(sc):
        v = Verdict(sc)
        if sc.passes[0][0] % 2:  # some cells fail, as a release's would
            v.failures.append(Failure("collectives", f"odd on {sc.profile}"))
        return v

    monkeypatch.setattr(runner, "unmutated", lambda pool, sc, timeout_s: verdict(sc))
    integration = integrations.get("vllm")
    cells = lineage.survey(None, "vllm")
    absent = {f.id: why for f in integration.findings() if (why := findings.gone(integration, f))}
    assert absent  # the installed release lacks the code of some findings
    for c in cells:
        if c.finding in absent and not c.pinned and c.detail.startswith(lineage.ABSENT):
            assert c.outcome == "not run" and absent[c.finding] in c.detail
    skipped = [c for c in cells if c.detail.startswith(lineage.ABSENT)]
    assert skipped and {c.finding for c in skipped} <= set(absent) and not [c for c in skipped if c.pinned]
    assert all(any(c.finding == s.finding and c.pinned and c.outcome != "not run" for c in cells) for s in skipped)
    # Each skipped cell run after all: never "reproduces", and the lineage the same.
    by_id = {f.id: f for f in integration.findings()}
    filled = []
    for c in cells:
        if c in skipped:
            base = lineage.reproducer("vllm", by_id[c.finding], integration.engine.pinned())
            result, detail = lineage.outcome(by_id[c.finding], verdict(dataclasses.replace(base, profile=c.flashinfer)),
                                             absent[c.finding])
            assert result != "reproduces"
            c = dataclasses.replace(c, outcome=result, detail=detail)
        filled.append(c)
    assert lineage.markdown(filled) == lineage.markdown(cells)
    assert [lineage.first(filled, f) for f in by_id] == [lineage.first(cells, f) for f in by_id]


def test_releases_lineage_lifespan_on_the_engines_own_pins():
    """Born: the first engine release whose own pin reproduces; gone: the first after it whose
    own pin passes (a failure of another kind, or a cell off the pin, decides neither)."""
    C = lineage.Cell
    cells = [C("X-1", "vLLM 0.25.0", "0.6.3", "reproduces"),  # off the pin: not its birth
             C("X-1", "vLLM 0.25.0", "0.6.13", "passes", pinned=True),
             C("X-1", "vLLM 0.27.0", "0.6.16.post3", "reproduces", pinned=True),
             C("X-1", "vLLM 0.31.0", "0.7.0.post1", "fails otherwise", "completes: ...", pinned=True),
             C("X-1", "vLLM 0.34.0", "0.7.3", "passes", pinned=True),
             C("X-2", "vLLM 0.27.0", "0.6.16.post3", "reproduces", pinned=True)]
    assert lineage.lifespan(cells, "X-1") == (cells[2], cells[4]) and lineage.lifespan(cells, "X-2") == (cells[5], None)
    table = lineage.format_table(cells, {})
    assert "born vLLM 0.27.0 (FlashInfer 0.6.16.post3), gone from vLLM 0.34.0 (FlashInfer 0.7.3)" in table
    assert "born vLLM 0.27.0 (FlashInfer 0.6.16.post3), still in vLLM 0.27.0" in table and "0.6.13* ." in table
    rows = lineage.markdown(cells).splitlines()
    assert rows[2] == "| X-1 | vLLM 0.25.0 on FlashInfer 0.6.3 | vLLM 0.27.0 (0.6.16.post3) | vLLM 0.34.0 (0.7.3) |"
    assert rows[3] == ("| X-2 | vLLM 0.27.0 on FlashInfer 0.6.16.post3 | vLLM 0.27.0 (0.6.16.post3) | "
                       "not gone by vLLM 0.27.0 |")
