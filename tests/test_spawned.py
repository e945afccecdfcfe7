"""The fake in every process started below a run (:mod:`fakes.spawned`): whoever starts a
Python process, with ``spawn`` or ``subprocess``, it has the fake of the run's release before
its first import; without the run's variable, nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from fakes import spawned

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A child started with `spawn` and a grandchild started with `subprocess` each say what their
# `import flashinfer` is, and what they read in the run's arena, where they joined one, from the
# segment the script itself wrote there first; the script as well.
REPORT = textwrap.dedent("""
    import json, multiprocessing, subprocess, sys

    def what():
        try:
            import flashinfer
        except ImportError as e:
            return {"error": type(e).__name__, "fakes": "fakes" in sys.modules}
        from fakes.arena import ShmArena

        found = {"module": flashinfer.__name__, "version": flashinfer.__version__}
        if ShmArena._current is not None:
            found["arena"] = int(ShmArena.current().attach("written-first").sum())
        return found

    def child(queue):
        queue.put(what())

    if __name__ == "__main__":
        if "fakes.arena" in sys.modules and sys.modules["fakes.arena"].ShmArena._current is not None:
            sys.modules["fakes.arena"].ShmArena.current().create("written-first", 4).fill_(1)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        p = ctx.Process(target=child, args=(queue,))
        p.start()
        spawned = queue.get(timeout=120)
        p.join(60)
        grandchild = subprocess.run([sys.executable, "-c", "import json; from report import what; "
                                     "print(json.dumps(what()))"], capture_output=True, text=True, timeout=120)
        print(json.dumps({"self": what(), "spawned": spawned,
                          "subprocess": json.loads(grandchild.stdout) if grandchild.returncode == 0
                          else grandchild.stderr}))
""")


def _run(tmp_path, env: dict) -> subprocess.CompletedProcess:
    (tmp_path / "report.py").write_text(REPORT)
    return subprocess.run([sys.executable, str(tmp_path / "report.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (spawned.INSTALL_ENV, "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra.pop("PYTHONPATH", ""), ROOT]))
    return env | extra


def test_spawned_every_started_process_imports_the_fake_and_joins_the_arena(tmp_path):
    from fakes.arena import SHM_DIR, scenario_prefix, unlink_prefix

    env = _env()
    prefix = scenario_prefix(os.getpid(), f"spawned{os.urandom(4).hex()}")
    spawned.enable("0.6.16", env, arena=prefix)
    try:
        done = _run(tmp_path, env)
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        for who in ("self", "spawned", "subprocess"):
            assert got[who] == {"module": "fakes.flashinfer", "version": "0.6.16", "arena": 4}, (who, got[who])
    finally:
        left = unlink_prefix(prefix)  # the owner's end of the run
    assert left == [prefix + "written-first"] and not list(SHM_DIR.glob(prefix + "*"))
    with pytest.raises(ValueError, match="is not a prefix"):
        spawned.enable("0.6.16", {}, arena="not-a-prefix")


def test_spawned_inert_without_the_run_variable(tmp_path):
    env = _env(PYTHONPATH=str(spawned.STARTUP_DIR))
    done = _run(tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for who in ("self", "spawned", "subprocess"):
        assert got[who].get("module") != "fakes.flashinfer" and not got[who].get("fakes"), (who, got[who])


def test_spawned_unserved_release_ends_the_process_in_one_line(tmp_path):
    env = _env(PYTHONPATH=str(spawned.STARTUP_DIR), **{spawned.INSTALL_ENV: "0.1.0"})
    done = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "ran" not in done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"{spawned.INSTALL_ENV}=0.1.0: FlashInfer release '0.1.0' is not served by the fake")
    with pytest.raises(ValueError, match="not served by the fake"):
        spawned.enable("0.1.0", {})


def test_spawned_shadowed_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.SHADOWED_RAN = True\n")
    env = _env(PYTHONPATH=str(other))
    spawned.enable("0.7.2", env)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(spawned.STARTUP_DIR), str(other)]
    done = subprocess.run([sys.executable, "-c", "import builtins, flashinfer; "
                           "print(flashinfer.__version__, getattr(builtins, 'SHADOWED_RAN', False))"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0.7.2", "True"]
    spawned.disable(env)
    assert spawned.INSTALL_ENV not in env and str(spawned.STARTUP_DIR) not in env["PYTHONPATH"]


def test_spawned_pytest_fake_flashinfer_reaches_the_tests_own_spawned_processes(tmp_path):
    (tmp_path / "test_engine_own.py").write_text(textwrap.dedent("""
        import multiprocessing

        def version(queue):
            try:
                import flashinfer
            except ImportError as e:
                queue.put(str(e))
            else:
                queue.put(flashinfer.__version__)

        def test_a_spawned_worker_imports_flashinfer():
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            p = ctx.Process(target=version, args=(queue,))
            p.start()
            assert queue.get(timeout=120) == "0.7.2.post1"
            p.join(60)
            assert p.exitcode == 0
    """))
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull,
            str(tmp_path)]
    done = subprocess.run(base + ["--fake-flashinfer=0.7.2.post1"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    without = subprocess.run(base, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert without.returncode == 1 and "No module named 'flashinfer'" in without.stdout, without.stdout[-3000:]


LEAVES_BEHIND = '''
import multiprocessing as mp, os, signal, sys
from multiprocessing import resource_tracker, shared_memory
segment = shared_memory.SharedMemory(create=True, size=64)
lock = mp.get_context("spawn").Lock()
# A file of its own in /dev/shm, as SGLang writes its load snapshots.
name = "a2atb-test-file-%d" % os.getpid()
os.close(os.open("/dev/shm/" + name, os.O_RDWR | os.O_CREAT, 0o600))
print(segment._name, "/sem." + lock._semlock.name.lstrip("/"), "/" + name, flush=True)
# As a session killed whole: the resource tracker that would unlink them at exit goes first.
os.kill(resource_tracker._resource_tracker._pid, signal.SIGKILL)
os._exit(0)
'''


def test_spawned_what_a_process_creates_in_dev_shm_goes_with_the_arena(tmp_path):
    """An engine's process killed before its clean-up leaves its POSIX shared memory, named
    semaphores and files of its own in /dev/shm behind: each is noted in the arena's register as
    it is made, and removed at the arena's end."""
    from fakes.arena import SHM_DIR, scenario_prefix, unlink_prefix

    env = _env()
    prefix = scenario_prefix(os.getpid(), f"leaves{os.urandom(4).hex()}")
    spawned.enable("0.6.16", env, arena=prefix)
    (tmp_path / "leaves.py").write_text(LEAVES_BEHIND)
    try:
        done = subprocess.run([sys.executable, str(tmp_path / "leaves.py")], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        names = done.stdout.split()
        left = [SHM_DIR / n.lstrip("/") for n in names]
        assert len(names) == 3 and all(p.exists() for p in left), names
    finally:
        removed = unlink_prefix(prefix)
    assert sorted(removed) == sorted(p.name for p in left)
    assert not [p for p in left if p.exists()] and not list(SHM_DIR.glob(prefix + "*"))


def test_spawned_prepare_runs_before_the_main_module_with_the_fake(tmp_path):
    """The run's preparation (``module:name``) is called in every started process once its fake
    is installed, before its main module; a malformed name is refused."""
    (tmp_path / "prep.py").write_text("import builtins, sys\n"
                                      "def here():\n"
                                      "    builtins.PREPARED = ('flashinfer' in sys.modules, '__main__' in sys.modules "
                                      "and hasattr(sys.modules['__main__'], 'MAIN'))\n")
    env = _env(PYTHONPATH=str(tmp_path))
    spawned.enable("0.7.2", env, prepare="prep:here")
    done = subprocess.run([sys.executable, "-c", "MAIN = 1; import builtins; print(builtins.PREPARED)"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "(True, False)"
    spawned.disable(env)
    assert spawned.PREPARE_ENV not in env
    with pytest.raises(ValueError, match="prepare: 'prep' is not 'module:name'"):
        spawned.enable("0.7.2", {}, prepare="prep")
