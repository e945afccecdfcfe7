"""The zygote (:mod:`testbed.cluster.zygote`): the rank pools' fork server forked from a
process before it imports an engine, with what it imported before and the environment it has
when the first pool starts; each case in a fresh interpreter of its own (a fork needs a
process without threads, which pytest's is not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import select
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(tmp_path, *body: str) -> dict:
    """Run ``body`` in a fresh interpreter with two modules beside it (``before_fork`` and
    ``after_fork``); it prints one JSON line last, returned."""
    (tmp_path / "before_fork.py").write_text("")
    (tmp_path / "after_fork.py").write_text("")
    (tmp_path / "zygote_probe.py").write_text(textwrap.dedent("""
        import os, sys

        def probe(conn):
            conn.send({"env": os.environ.get("ZYGOTE_PROBE"), "cwd": os.getcwd(), "server": os.getppid(),
                       "before": "before_fork" in sys.modules, "after": "after_fork" in sys.modules})
    """))
    script = textwrap.dedent(f"""
        import json, multiprocessing, os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from testbed.cluster import zygote
        from zygote_probe import probe
    """) + "\n".join(textwrap.dedent(part) for part in body)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"stdout": done.stdout}


WORKER = """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([])
    ours, theirs = ctx.Pipe()
    p = ctx.Process(target=probe, args=(theirs,))
    p.start()
    got = ours.recv() if ours.poll(30) else None
    p.join(30)
    from multiprocessing import forkserver
"""


def test_zygote_is_the_fork_server_with_what_came_before_and_the_environment_after(tmp_path):
    got = _python(tmp_path, """
        import before_fork
        print("buffered before the fork", end="")  # not flushed: a fork must not write it again
        print()
        assert zygote.start(["before_fork"])
        pid = zygote._waiting[0]
        import after_fork  # the engine, say: the fork server must not have it
        os.environ["ZYGOTE_PROBE"] = "set after the fork"
        os.chdir(os.path.join(sys.path[0]))
    """, WORKER, """
        print(json.dumps({"worker": got, "zygote": pid, "server": forkserver._forkserver._forkserver_pid,
                          "cwd": os.getcwd()}))
    """)
    worker = got["worker"]
    assert worker is not None
    assert got["server"] == got["zygote"] == worker["server"]  # the zygote became the fork server
    assert worker["before"] and not worker["after"]
    assert worker["env"] == "set after the fork" and worker["cwd"] == got["cwd"]
    assert got["stdout"].count("buffered before the fork") == 1


def test_zygote_off_or_in_a_threaded_process_leaves_the_stdlib_fork_server(tmp_path, monkeypatch):
    for setup in ("os.environ['A2A_ZYGOTE'] = '0'",
                  "import threading; threading.Thread(target=threading.Event().wait, args=(30,), daemon=True).start()"):
        got = _python(tmp_path, setup, """
        started = zygote.start([])
    """, WORKER, """
        print(json.dumps({"started": started, "worker": got, "server": forkserver._forkserver._forkserver_pid}))
    """)
        assert got["started"] is False and got["worker"]["server"] == got["server"]
        assert not got["worker"]["before"]


def test_zygote_never_used_ends_with_its_parent(tmp_path):
    got = _python(tmp_path, """
        assert zygote.start([])
        print(json.dumps({"zygote": zygote._waiting[0]}))
    """)
    try:
        fd = os.pidfd_open(got["zygote"])
    except ProcessLookupError:
        return  # gone already
    try:
        ended, _, _ = select.select([fd], [], [], 30)
    finally:
        os.close(fd)
    assert ended, f"the unused zygote {got['zygote']} outlived its parent by 30 s"


@pytest.mark.parametrize("name", [pytest.param("vllm", marks=pytest.mark.needs("vllm")),
                                  pytest.param("sglang", marks=pytest.mark.needs("sglang"))])
def test_zygote_engine_dependencies_are_what_its_import_loads_anyway(name):
    """Importing an engine's :attr:`~testbed.integrations.engine.Engine.dependencies` before
    it changes the order of its import, never what it loads."""
    from testbed import integrations

    engine = integrations.get(name).engine
    assert engine.dependencies
    script = (f"import sys; import {engine.preload_module}; "
              f"print(sorted(set({list(engine.dependencies)!r}) - set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
