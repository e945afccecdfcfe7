"""``a2a-testbed serve``: the engine's own server with DP + EP on the fake, in its own
processes, answering an OpenAI client (:mod:`testbed.harness.serve`); the process tree it
starts and does not own (:mod:`testbed.harness.session`)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fakes.arena import PREFIX_ROOT, SHM_DIR, pid_alive
from testbed.harness import mutants, serve, session
from testbed.harness.invariants import Failure
from testbed.integrations.base import Mutant
from testbed.scenario.model import ScenarioInputError

ROOT = Path(__file__).resolve().parents[1]


# --- the scenario and its client's load ----------------------------------------------------


@pytest.mark.parametrize("fields, flag", [(dict(dp=0), "--dp"), (dict(dp=2, requests=0), "--requests"),
                                          (dict(dp=2, path="naive"), "--path"), (dict(dp=2, dtype="fp8"), "--dtype"),
                                          (dict(dp=2, profile="0.1.0"), "--profile"), (dict(dp=2, tp=0), "--tp"),
                                          (dict(dp=2, integration="sglang", offline=True), "--offline"),
                                          (dict(dp=1, integration="sglang", late_zeroing=True), "--late-zeroing")])
def test_serve_scenario_bad_input_names_the_flag(fields, flag):
    with pytest.raises(ScenarioInputError, match=flag):
        serve.ServeScenario(**fields)


@pytest.mark.parametrize("requests, dp", [(3, 2), (2, 4), (7, 3), (1, 1), (0, 2)])
def test_serve_offline_share_splits_the_requests_as_the_example(requests, dp):
    """Each request on exactly one DP rank, contiguous, the shares differing by at most one and
    the larger first (vLLM's example: floor, plus one for the first ``remainder`` ranks)."""
    from testbed.integrations.vllm.offline import share

    shares = [share(requests, dp, r) for r in range(dp)]
    assert [i for s in shares for i in s] == list(range(requests))
    assert [len(s) for s in shares] == sorted((len(s) for s in shares), reverse=True)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_serve_requests_rebuilt_from_the_seed_whatever_the_deployment():
    a = serve.ServeScenario(dp=2, requests=3, seed=5)
    b = serve.ServeScenario(dp=4, tp=2, path="two_sided", requests=6, seed=5)
    vocab = a.engine_scenario().checkpoint().vocab
    for i in range(3):
        assert a.request(i) == b.request(i)
        rq = a.request(i)
        assert 2 <= len(rq.prompt_P) <= serve.MAX_PROMPT and 1 <= rq.max_tokens <= serve.MAX_GENERATED
        assert all(3 <= t < vocab for t in rq.prompt_P)
        assert rq.stream == (i % 2 == 1)
    assert a.request(0) != serve.ServeScenario(dp=2, seed=6).request(0)
    # every request fits the server's model length
    es = a.engine_scenario()
    assert all(len(a.request(i).prompt_P) + a.request(i).max_tokens <= es.max_model_len for i in range(50))


def test_serve_matrix_has_an_idle_dp_rank_on_each_path_and_tp_beside_dp():
    entries = serve.matrix("vllm", "0.7.2.post1")
    for path in ("one_sided", "two_sided"):
        assert any(e.path == path and e.requests < e.dp for e in entries)
        assert any(e.path == path and e.dp == 2 and e.requests > 1 for e in entries)
    assert any(e.tp == 2 and e.dp == 2 for e in entries)
    assert len({e.label for e in entries}) == len(entries)
    # offline data parallel too, with ranks on the example's placeholder
    assert any(e.offline and e.requests < e.dp and e.to_cli().endswith("--offline") for e in entries)


# --- the verdict ----------------------------------------------------------------------------


def _answer(ids, top2=None, prompt=None):
    return serve.Answer(list(ids), top2 or [[-1.0, -5.0]] * len(ids), prompt)


def test_serve_answers_differ_beyond_a_near_tie_fail_and_a_near_tie_does_not():
    ss = serve.ServeScenario(dp=2)
    want = {0: _answer([5, 6, 7], [[-1.0, -5.0], [-2.0, -2.00001], [-1.0, -4.0]], [-3.0, -4.0]),
            1: _answer([9, 9], prompt=None)}
    v = serve.ServeVerdict(ss)
    serve._compare(ss, {0: _answer([5, 8, 1], prompt=[-3.00001, -4.0]), 1: _answer([9, 9])}, want, v)
    assert v.passed, v.failures  # token 1 is a near tie of the reference's; after it nothing is compared
    v = serve.ServeVerdict(ss)
    serve._compare(ss, {0: _answer([6, 6, 7], prompt=[-3.0, -4.0]), 1: _answer([9])}, want, v)
    assert [f.invariant for f in v.failures] == ["answers"]
    assert "request 0 token 0: generated 6, the reference 5" in v.failures[0].evidence
    assert "request 1: 1 tokens generated, the reference 2" in v.failures[0].evidence
    v = serve.ServeVerdict(ss)
    serve._compare(ss, {0: _answer([5, 6, 7], prompt=[-3.0, -4.5])}, want, v)
    assert "prompt token 2: logprob -4.5000, the reference -4.0000" in v.failures[0].evidence
    assert v.worst_logprob == pytest.approx(0.5)


def test_serve_port_below_the_ephemeral_range_and_free():
    """A server's port as users pick one: below 32768, so every port the engine derives from it
    stays valid (SGLang 0.5.11 .. 0.5.15 check port + 10000), and free on the loopback address."""
    import socket

    ports = {serve._free_port() for _ in range(20)}
    assert all(p in serve.SERVER_PORTS and p + 10000 <= 65535 for p in ports) and len(ports) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


class _Starting:
    """A server process that is still running: its wait always times out at once."""

    returncode = None

    def poll(self):
        return None

    def wait(self, timeout=None):
        raise subprocess.TimeoutExpired("server", timeout)


@pytest.mark.parametrize("has_ready", [True, False])
def test_serve_ready_at_the_first_path_the_release_has(has_ready):
    """SGLang before 0.5.20 has no /ready (a 404): readiness moves on to /v1/models; where
    /ready exists, a 503 (not ready yet) keeps the wait on it."""
    import http.server
    import threading

    asked = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            ready = len(asked) > 2
            code = (200 if ready else 503) if self.path == "/ready" and has_ready else \
                404 if self.path == "/ready" else 200
            self.send_response(code)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert serve._ready(_Starting(), server.server_port, ("/ready", "/v1/models"), time.monotonic() + 30) is None
    finally:
        server.shutdown()
        server.server_close()
    assert asked == (["/ready"] * 3 if has_ready else ["/ready", "/v1/models"])
    assert "before the server was ready at /ready or /v1/models" in serve._ready(
        _Starting(), server.server_port, ("/ready", "/v1/models"), time.monotonic())


def test_serve_report_at_most_15_lines_verdict_last():
    ss = serve.ServeScenario(dp=4, requests=2, label="one_sided DP4 idle")
    v = serve.ServeVerdict(ss, failures=[Failure(f"inv{i}", "line\n" * 30) for i in range(9)],
                           rounds={r: 10 for r in range(4)},
                           steps={r: [(p, 1, (1, 1, 1, 5)) for p in range(40)] for r in range(4)})
    lines = serve.report_lines(3, 5, v, mutant="v-x")
    assert len(lines) <= 15
    assert lines[-1].startswith("FAIL   3/5") and "DP4" in lines[-1]
    assert any("--mutant v-x" in line for line in lines)
    v = serve.ServeVerdict(ss, testbed_error="mutant v-x could not be applied")
    assert serve.report_lines(1, 1, v)[-1].startswith("ERROR") and not v.passed
    late = serve.ServeScenario(dp=4, requests=2, integration="sglang", late_zeroing=True)
    v = serve.ServeVerdict(late, failures=v.failures, rounds={r: 10 for r in range(4)},
                           released_by="entered monitored_barrier on ranks [0,1,2,3] from sglang/x.py:1 in f")
    lines = serve.report_lines(1, 1, v)
    assert len(lines) <= 15 and "late zeroing: the first EP rank had entered monitored_barrier" in "\n".join(lines)
    assert lines[-1].endswith("the last EP rank zeroing late  (a DP rank idle)")
    assert "--late-zeroing" in late.to_cli()


def _step(log, p: int, group: tuple, *, end: bool = True) -> None:
    """One MoE layer call of forward ``p`` as an engine rank records it: begun, dispatched,
    combined and (``end``) ended."""
    from testbed.scenario.events import Collective, ForwardEnd, ForwardStart

    log.write(ForwardStart(pass_index=p, layer=0, reduced=True, pending=False, sp=False))
    log.write(Collective(op="moe_a2a_dispatch", group=group, site=None))
    if end:
        log.write(Collective(op="moe_a2a_combine", group=group, site=None))
        log.write(ForwardEnd(pass_index=p, layer=0))


def _engine_logs(run_dir: Path, forwards: dict[int, int], *, begun: tuple = ()) -> None:
    """Two EP ranks' event and step logs: ``forwards[r]`` whole forwards on rank r, then one
    dispatch begun with no combine on each rank of ``begun`` (a peer it waits for never came)."""
    from testbed.scenario.events import EventLog

    group = tuple(sorted(forwards))
    for r, n in forwards.items():
        log = EventLog(str(run_dir / f"rank{r}.jsonl"))
        for p in range(n):
            _step(log, p, group)
        if r in begun:
            _step(log, n, group, end=False)
        log.close()
        (run_dir / f"steps{r}.jsonl").write_text("".join("[0, 1, [1, 1]]\n" for _ in range(n + (r in begun))))


def test_serve_rest_is_a_cut_no_round_crosses(tmp_path):
    _engine_logs(tmp_path, {0: 3, 1: 3})
    assert serve._come_to_rest(str(tmp_path), 2, time.monotonic() + 5) == {0: (12, 3), 1: (12, 3)}
    logs, steps = serve._logs(str(tmp_path), 2)
    assert serve._at_rest(logs, steps)
    _engine_logs(tmp_path, {0: 3, 1: 3}, begun=(0,))  # rank 0's lone round: on GPUs, a hang
    logs, steps = serve._logs(str(tmp_path), 2)
    assert not serve._at_rest(logs, steps)
    assert serve._come_to_rest(str(tmp_path), 2, time.monotonic() + 1) is None


@pytest.mark.needs("vllm")  # the rounds' scenario is validated against vLLM's all-to-all API
@pytest.mark.parametrize("rested", [True, False])
def test_serve_round_begun_after_the_rest_is_cut_else_judged(monkeypatch, rested):
    """A round a rank began after the ranks came to rest (the server's stop cut it) is counted
    and not judged; where they never came to rest, the same lone round fails the judge."""
    ss = serve.ServeScenario(dp=2, requests=1)

    def served(ss, run_dir, **kw):
        _engine_logs(Path(run_dir), {0: 3, 1: 3}, begun=(0,))
        return serve.Served(answers={0: _answer([5])}, rest={0: (12, 3), 1: (12, 3)} if rested else None)

    monkeypatch.setattr(serve, "_serve", served)
    v = serve.run(ss, reference={0: _answer([5])})
    rounds = [f for f in v.failures if f.invariant in ("collectives", "engine-steps")]
    if rested:
        assert v.cut == {0: 1, 1: 0} and v.rounds == {0: 3, 1: 3} and not rounds, v.failures
        assert "1 begun after the ranks came to rest" in "\n".join(serve.report_lines(1, 1, v))
    else:
        assert v.rounds == {0: 4, 1: 3} and rounds and not v.passed, v.failures
        assert "did not come to rest" in "\n".join(serve.report_lines(1, 1, v))


# --- mutants only a served engine reaches --------------------------------------------------


def test_serve_only_mutant_is_not_applicable_below_and_hunted_served():
    m = Mutant.of("x", "d", "m:f", "a", "b", ("completes", "timed out"), served="the engine core's busy loop")
    kind, why = m.not_applicable()
    assert kind == "served" and "a2a-testbed serve --mutant x" in why
    assert m.not_applicable_served() is None
    absent = Mutant.of("y", "d", "m:f", "a", "b", ("completes", ""), served="z", requires=lambda: "no such code")
    assert absent.not_applicable() == ("absent", "no such code") == absent.not_applicable_served()


def _wrapping(fn):
    def wrapper(*a):
        return fn(*a)
    return wrapper


def _keeping(fn):
    @functools.wraps(fn)
    def wrapper(*a):
        return fn(*a)
    return wrapper


def test_mutant_source_is_the_decorated_function_s_own():
    @_wrapping
    def loop(x):
        return x + 1

    @_keeping
    def other(x):
        return x + 2

    assert "return x + 1" in "".join(__import__("inspect").getsourcelines(mutants._undecorated(loop, "loop"))[0])
    assert "return x + 2" in "".join(__import__("inspect").getsourcelines(mutants._undecorated(other, "other"))[0])


# --- a process tree the testbed does not own -----------------------------------------------


def test_session_kill_leaves_no_process_of_the_tree(tmp_path):
    """Every process of the session goes, one that left the leader's process group too (its
    own ``setpgid``, as a server's worker may); the tree says when it stands, no shell's timing
    is guessed."""
    ready = tmp_path / "pids"
    script = ("import os, subprocess, sys\n"
              "kids = [subprocess.Popen(['sleep', '60']), subprocess.Popen(['sleep', '60'], process_group=0)]\n"
              f"open({str(ready)!r} + '.part', 'w').write(' '.join(str(k.pid) for k in kids))\n"
              f"os.rename({str(ready)!r} + '.part', {str(ready)!r})\n"
              "kids[0].wait()\n")
    with open(tmp_path / "out", "wb") as out:
        proc = session.start([sys.executable, "-c", script], env=dict(os.environ), cwd=tmp_path, out=out)
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert proc.poll() is None, (tmp_path / "out").read_text()
                assert time.monotonic() < deadline, "the tree did not start within 60 s"
                time.sleep(0.05)
            kids = [int(p) for p in ready.read_text().split()]
            members = session.members(proc.pid)
            assert {proc.pid, *kids} <= set(members)
            assert os.getpgid(kids[1]) != proc.pid
        finally:
            session.kill(proc)
    assert not [p for p in members if pid_alive(p)]


def test_session_leader_dies_with_the_testbed(tmp_path):
    """The testbed killed with SIGKILL: the session it started goes too (its leader's
    parent-death signal), so no engine server outlives it."""
    script = (f"import sys, os; sys.path.insert(0, {str(ROOT)!r})\n"
              "from testbed.harness import session\n"
              f"p = session.start(['sleep', '60'], env=dict(os.environ), cwd='.', out=open(os.devnull, 'wb'))\n"
              "print(p.pid, flush=True)\n"
              "import time; time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert pid_alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


def test_session_keeps_inductors_kernels_where_inductor_keeps_them(tmp_path):
    """A session's temporary files go in a folder of its own, removed with it, but inductor's
    compiled kernels stay where inductor keeps them for the caller (torch's own default, read
    here), built so that their cache keys do not name that folder: the next run's processes
    load what an earlier one compiled instead of compiling it again."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    script = ("import json, tempfile\n"
              "from torch._inductor import config\n"
              "from torch._inductor.runtime.cache_dir_utils import cache_dir\n"
              "print(json.dumps([tempfile.gettempdir(), cache_dir(), config.cpp_cache_precompile_headers]))\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    with open(tmp_path / "out", "wb") as out:
        proc = session.start([sys.executable, "-c", script], env=env, cwd=tmp_path, out=out)
        try:
            assert proc.wait(timeout=120) == 0, (tmp_path / "out").read_text()
        finally:
            session.kill(proc)
    scratch, cache, headers = json.loads((tmp_path / "out").read_text().splitlines()[-1])
    assert scratch != tempfile.gettempdir() and not os.path.exists(scratch), "no temporary folder of its own"
    assert (cache, headers) == (default_cache_dir(), False)


# --- vLLM served -------------------------------------------------------------------------------


def _servers_of_this_test() -> list[int]:
    """The processes of every session this test process leads the start of (the servers it
    started; another test's servers, in another process, are not among them)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        if int(fields[1]) == os.getpid() and int(fields[3]) == pid:  # a child leading its own session
            found += session.members(pid)
    return found


def _segments() -> set[str]:
    return {p.name for p in SHM_DIR.glob(f"{PREFIX_ROOT}-{os.getpid()}-serve*")}


def _killed_once_ready(monkeypatch) -> list[int]:
    """Every process of the servers this test started SIGKILLed once ready, before the client
    asks; returns the pids killed (filled as it happens)."""
    ask, killed = serve._ask, []

    def kill_then_ask(ss, port, deadline, *how):
        for pid in _servers_of_this_test():
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return ask(ss, port, deadline, *how)

    monkeypatch.setattr(serve, "_ask", kill_then_ask)
    return killed


@pytest.fixture
def registered(monkeypatch):
    """What the served runs' processes noted in their arenas' registers (vLLM's message
    queues, multiprocessing's semaphores), read as each arena ends."""
    from fakes import arena

    names, unlink = [], arena.unlink_prefix

    def unlink_prefix(prefix):
        names.extend(arena._registered(SHM_DIR / (prefix + arena.CREATED)))
        return unlink(prefix)

    monkeypatch.setattr(arena, "unlink_prefix", unlink_prefix)
    return names


@pytest.mark.needs("vllm")
def test_serve_vllm_dp2_every_engine_process_recorded_and_answers_match_dp1(tmp_path, registered):
    ss = serve.ServeScenario(dp=2, requests=3)
    v = serve.run(ss, log=tmp_path / "engine.log", timeout_s=300)
    assert v.passed, "\n".join(serve.report_lines(1, 1, v)) + f"\nlog: {(tmp_path / 'engine.log').read_text()[-3000:]}"
    assert len(v.served.answers) == 3 and not v.served.trouble
    assert set(v.rounds) == {0, 1} and all(n > 0 for n in v.rounds.values())
    assert len(set(v.served.pids.values())) == 2  # two engine processes, each one rank
    assert all(steps and all(min(dp) >= 1 for _, _, dp in steps) for steps in v.steps.values())
    assert not [p for p in v.served.pids.values() if pid_alive(p)]
    assert not _segments()
    assert any(p.name.startswith("psm_") for p in registered)  # vLLM's message queues, noted where made
    assert not [p for p in registered if p.exists()]


@pytest.mark.needs("vllm")
def test_serve_vllm_offline_dp_each_rank_process_recorded_and_answers_match_dp1(tmp_path, registered):
    """vLLM's offline data parallel as its example runs it: a process per DP rank with
    VLLM_DP_*, each an LLM generating its share; the same fake, arena and recorders reach every
    process vLLM starts below them, and the processes end by themselves."""
    ss = serve.ServeScenario(dp=2, requests=3, offline=True)
    assert ss.to_cli().endswith(" --offline")
    v = serve.run(ss, log=tmp_path / "engine.log", timeout_s=300)
    assert v.passed, "\n".join(serve.report_lines(1, 1, v)) + f"\nlog: {(tmp_path / 'engine.log').read_text()[-3000:]}"
    assert sorted(v.served.answers) == [0, 1, 2] and not v.served.trouble and v.served.rest is None
    assert set(v.rounds) == {0, 1} and all(n > 0 for n in v.rounds.values())
    assert len(set(v.served.pids.values())) == 2
    # rank 0 generates requests 0 and 1, rank 1 request 2: unequal counts, then one rank's dummy batches
    counts = [dp for _, _, dp in v.steps[0]]
    assert any(a != b for a, b in counts) and all(min(dp) >= 1 for dp in counts)
    assert not [p for p in v.served.pids.values() if pid_alive(p)]
    assert not _segments()
    assert not [p for p in registered if p.exists()]


@pytest.mark.needs("vllm")
def test_serve_vllm_timeout_names_every_stuck_process_and_leaves_none(tmp_path, registered):
    """The served-only mutant: an idle engine core stops stepping, its peer's forward waits;
    the run times out, every process of the run reports where it waits, none survives."""
    ss = serve.ServeScenario(dp=2, requests=1)
    v = serve.run(ss, reference={}, mutant="v-dp-wave-decided-locally", log=tmp_path / "engine.log", timeout_s=30)
    completes = [f.evidence for f in v.failures if f.invariant == "completes"]
    assert completes and "request 0: no answer within 30 s" in completes[0], serve.report_lines(1, 1, v)
    assert completes[0].count("process ") >= 4  # API server, engine cores, workers: each with its frame
    assert not [p for p in v.served.pids.values() if pid_alive(p)]
    assert not _segments()
    assert registered and not [p for p in registered if p.exists()]


@pytest.mark.needs("vllm")
def test_serve_vllm_engine_processes_killed_midway_leave_nothing(tmp_path, monkeypatch, registered):
    killed = _killed_once_ready(monkeypatch)
    v = serve.run(serve.ServeScenario(dp=2, requests=2), reference={}, log=tmp_path / "engine.log", timeout_s=120)
    assert len(killed) >= 5, killed  # the API server, its DP coordinator and API servers, engine cores, workers
    assert not v.passed and v.served.trouble
    assert not [p for p in killed if pid_alive(p)]
    assert not _servers_of_this_test()
    assert not _segments()
    assert registered and not [p for p in registered if p.exists()]


@pytest.mark.needs("sglang")
@pytest.mark.parametrize("release, why", [
    ("0.5.9", "SGLang 0.5.9 has no sglang.srt.plugins"),  # no general plugins: no way in for the testbed
    ("0.5.12", "SGLang 0.5.12's start-up refuses FlashInfer MoE A2A with the MoE runner"),  # CUTLASS / CuTe DSL only
    ("0.5.16", "SGLang 0.5.16's CPU platform cannot run DP attention"),  # SGL-013 before 0.5.19
])
def test_serve_sglang_release_it_cannot_serve_refused_naming_the_flag(release, why):
    """A release the testbed cannot serve is refused in one line naming the source flag and why,
    before any server starts."""
    done = subprocess.run([sys.executable, "-m", "testbed", "serve", "--integration", "sglang", "--sglang-source",
                           release, "--dp", "2"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("a2a-testbed serve: error: ")]
    assert f"--sglang-source {release}: " in line and why in line
    assert "served on" not in done.stdout


@pytest.mark.needs("sglang")
def test_serve_sglang_dp2_every_scheduler_recorded_and_answers_match_dp1(tmp_path, registered):
    """SGLang's own server (DP attention, FlashInfer's all-to-all) on the fake: each scheduler
    process records its rounds, the answers and prompt logprobs match DP 1, and what SGLang's
    processes made in /dev/shm (its load snapshots, multiprocessing's semaphores) is gone after."""
    ss = serve.ServeScenario(dp=2, requests=3, integration="sglang", profile="0.7.2")
    v = serve.run(ss, log=tmp_path / "engine.log", timeout_s=300)
    assert v.passed, "\n".join(serve.report_lines(1, 1, v)) + f"\nlog: {(tmp_path / 'engine.log').read_text()[-3000:]}"
    assert len(v.served.answers) == 3 and all(a.prompt_logprobs for i, a in v.served.answers.items() if i % 2 == 0)
    assert set(v.rounds) == {0, 1} and all(n > 0 for n in v.rounds.values())
    assert len(set(v.served.pids.values())) == 2  # two scheduler processes, each one rank
    assert not [p for p in v.served.pids.values() if pid_alive(p)]
    assert not _segments()
    assert any(p.name.startswith("sglang_loads_") for p in registered)  # SGLang's own file, noted where made
    assert not [p for p in registered if p.exists()]


@pytest.mark.needs("sglang")
def test_serve_sglang_late_zeroing_ordered_by_its_own_engine(tmp_path, registered):
    """SGL-003 served: on a FlashInfer before 0.7.1 SGLang's dispatcher builds MoeAlltoAll
    without an EP barrier. With the last EP rank's zeroing held, in its own scheduler process,
    until the first has moved on, what SGLang's engine does between building its layers and
    its first forward orders them: the first rank had entered a collective spanning the late
    one from SGLang's own code, every round completes and the answers match DP 1; only the
    contract breach shows."""
    ss = serve.ServeScenario(dp=2, requests=3, integration="sglang", profile="0.7.0", late_zeroing=True)
    v = serve.run(ss, log=tmp_path / "engine.log", timeout_s=300)
    report = "\n".join(serve.report_lines(1, 1, v))
    assert v.known == ["SGL-003"] and not v.failures, report
    assert {f.invariant for f in v.known_failures} == {"collectives"}, report
    assert v.released_by.startswith("entered ") and " from sglang/" in v.released_by, report
    assert len(v.served.answers) == 3 and all(n > 0 for n in v.rounds.values())
    assert not [p for p in v.served.pids.values() if pid_alive(p)] and not _segments()


@pytest.mark.needs("sglang")
def test_serve_sglang_idle_rank_decided_locally_times_out_naming_every_process(tmp_path, registered):
    """The served-only mutant: an idle DP rank's scheduler runs no idle batch, its peer's forward
    waits in the all-to-all; the run times out, every process reports where it waits, none survives."""
    ss = serve.ServeScenario(dp=2, requests=1, integration="sglang", profile="0.7.2")
    v = serve.run(ss, reference={}, mutant="s-dp-idle-decided-locally", log=tmp_path / "engine.log", timeout_s=30)
    completes = [f.evidence for f in v.failures if f.invariant == "completes"]
    assert completes and "request 0: no answer within 30 s" in completes[0], serve.report_lines(1, 1, v)
    assert completes[0].count("process ") >= 4  # server, DP controller, schedulers, detokenizer: each with its frame
    assert not [p for p in v.served.pids.values() if pid_alive(p)]
    assert not _segments()
    assert registered and not [p for p in registered if p.exists()]


@pytest.mark.needs("sglang")
def test_serve_sglang_engine_processes_killed_midway_leave_nothing(tmp_path, monkeypatch, registered):
    """Every process of SGLang's server SIGKILLed once it is ready (none unlinks what it made):
    no process of the run is left, nor any of its files in /dev/shm (SGLang's load snapshots
    and multiprocessing's semaphores among them)."""
    killed = _killed_once_ready(monkeypatch)
    ss = serve.ServeScenario(dp=2, requests=2, integration="sglang", profile="0.7.2")
    v = serve.run(ss, reference={}, log=tmp_path / "engine.log", timeout_s=120)
    assert len(killed) >= 5, killed  # the server, its DP controller, two schedulers, the detokenizer
    assert not v.passed and v.served.trouble
    assert not [p for p in killed if pid_alive(p)]
    assert not _servers_of_this_test()
    assert not _segments()
    assert any(p.name.startswith("sglang_loads_") for p in registered) and not [p for p in registered if p.exists()]
