"""An engine served as users serve it, judged: the engine's own server (``vllm serve``) with
data and expert parallel on the fake FlashInfer, in the engine's own processes, answering a
real OpenAI-compatible client on the loopback address.

What the testbed does around the server:

- writes a tiny checkpoint and a tokenizer of its ids (:mod:`testbed.scenario.checkpoint`);
- starts the server in a session of its own (:mod:`testbed.harness.session`) with the fake of
  the engine's pin in every process it starts, the shared-memory arena of this run, stand-in
  accelerators (:mod:`fakes.spawned`) and the run's directory (the integration's serving
  plugin reads it there: its glue, the run's mutant, and each rank's recorders once the
  engine's groups form, :func:`start_rank`);
- sends concurrent requests of different lengths, streamed and not, with prompt logprobs, so
  the engine's load balancer gives the DP ranks unequal counts and, with fewer requests than
  DP ranks, leaves one idle (stepping dummy batches for its peers' all-to-alls);
- stops the server, kills what is left of its session, unlinks the arena's segments.

A served scenario is checked for:

- ``completes``: the server ready and every request answered within the time limit; on a
  timeout every process of the run writes its stacks and the report names each;
- every invariant that judges rounds from the event logs
  (:func:`testbed.harness.invariants.check_rounds`), on the run as a layer scenario whose passes
  are the DP token counts each rank's forward context gave, and the engine-step rule
  (:func:`testbed.harness.engine.rounds_scenario`);
- ``answers``: each request's generated ids and prompt logprobs against the same requests
  served at DP 1 with expert parallel off (no all-to-all at all): ids equal but where the
  reference's two best differ by less than the tolerance (a near tie), logprobs within
  :data:`testbed.harness.engine.LOGPROB_TOLERANCE`.

Legend: P prompt tokens, N generated tokens.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

import torch

from testbed import integrations
from testbed.integrations import served
from testbed.integrations.engine import SERVE_RUN_ENV
from testbed.harness import engine, invariants, late_zeroing, session
from testbed.harness.invariants import Failure
from testbed.scenario import checkpoint
from testbed.scenario.engine import FIRST_TOKEN_ID, EngineScenario
from testbed.scenario.events import Collective, ForwardEnd, ForwardStart, LogTail
from testbed.scenario.model import Scenario, ScenarioInputError

DEFAULT_TIMEOUT_S = 240.0  # from the server's readiness to its last answer
# The server's start-up, its own limit: DP 4 starts 13 processes, each importing vLLM and torch
# (measured 70-118 s on 2 cores); a hang there is not a hang of the answers.
STARTUP_TIMEOUT_S = 400.0
TIMED_OUT = "timed out"  # in a run's trouble where its time ran out (the watchdog's stacks follow)
# The recorders' collective of each API's dispatch: MoeAlltoAll's, moe_ep's, MnnvlMoe's (two-sided).
DISPATCH_OPS = ("moe_a2a_dispatch", "moe_ep_dispatch", "mnnvl_moe_alltoallv")
STOP_GRACE_S = 20.0  # the server's own shutdown, before the rest of its session is killed
# After the last answer a DP engine steps dummy batches until its peers agree the wave is done
# (vLLM checks every 32 steps); stopping it mid-step would cut a round some ranks began.
REST_TIMEOUT_S = 120.0
REST_POLL_S = 0.25
MAX_PROMPT = 24
MAX_GENERATED = 8


@dataclass(frozen=True)
class Request:
    """One client request: its prompt ids ``prompt_P``, ``max_tokens`` generated greedily
    (end of sequence ignored), ``stream``ed or not."""

    prompt_P: tuple[int, ...]
    max_tokens: int
    stream: bool


@dataclass(frozen=True)
class ServeScenario:
    """A server deployment and its client's load: ``requests`` concurrent requests (request
    ``i`` the same in every scenario of one ``seed``, :meth:`request`)."""

    dp: int
    tp: int = 1
    path: str = "one_sided"
    requests: int = 3
    integration: str = "vllm"
    dtype: str = "bfloat16"  # as models are served (float32: see docs/findings.md, VLLM-017)
    profile: str = "0.7.2.post1"
    seed: int = 0
    # The engine's offline data parallel as its documentation shows it (a process per DP rank,
    # each generating its share of the requests), not its server and an HTTP client.
    offline: bool = False
    # The last EP rank's workspace zeroing held until the first has moved on (the race FlashInfer
    # before 0.7.1 leaves its caller to order, testbed.harness.late_zeroing), in the engine's
    # own processes: whatever the engine does between building its layers and its first
    # dispatch is what must order it.
    late_zeroing: bool = False
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.requests, bool) or not isinstance(self.requests, int) or self.requests < 1:
            raise ScenarioInputError("--requests", f"must be a positive integer, got {self.requests!r}")
        self.engine_scenario()  # the deployment's own checks (--dp, --tp, --path, --dtype, --profile)
        serving = integrations.get(self.integration).engine.serving
        if self.offline and serving.offline is None:
            raise ScenarioInputError("--offline", f"--integration {self.integration} has no offline data parallel "
                                     "the testbed runs")
        if self.path not in serving.paths:
            raise ScenarioInputError("--path", f"--integration {self.integration} serves {', '.join(serving.paths)}, "
                                     f"got {self.path!r}")
        if self.late_zeroing:
            self.recorded().validate()  # --late-zeroing's own rules

    def recorded(self) -> Scenario:
        """The run as the recorders in the engine's processes take it: a layer scenario whose
        passes are left to the engine (one forward of one token per DP rank stands for them),
        with the late zeroing where asked."""
        sc = self.engine_scenario().scenario(passes=((1,) * self.dp,), sequence_parallel=False)
        return replace(sc, late_zeroing=True) if self.late_zeroing else sc

    def engine_scenario(self) -> EngineScenario:
        """The deployment as the engine level describes it: its layout, checkpoint, budget, and
        the rounds of a run as a layer scenario."""
        return EngineScenario(dp=self.dp, tp=self.tp, path=self.path, prompts=((2,),) * self.dp,
                              max_tokens=(1,) * self.dp, integration=self.integration, dtype=self.dtype,
                              profile=self.profile, seed=self.seed, label=self.label)

    def request(self, i: int) -> Request:
        """Request ``i`` of this seed: 2 .. :data:`MAX_PROMPT` prompt tokens, 1 .. :data:`MAX_GENERATED`
        generated, every other one streamed (any process can rebuild any request)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 7919 * i + 1)
        length = int(torch.randint(2, MAX_PROMPT + 1, (1,), generator=g))
        generated = int(torch.randint(1, MAX_GENERATED + 1, (1,), generator=g))
        vocab = self.engine_scenario().checkpoint().vocab
        prompt = tuple(torch.randint(FIRST_TOKEN_ID, vocab, (length,), generator=g).tolist())
        return Request(prompt, generated, stream=i % 2 == 1)

    def describe(self) -> str:
        late = ", the last EP rank zeroing late" if self.late_zeroing else ""
        if self.offline:  # the example's placeholder request keeps a rank without one stepping
            idle = "  (a DP rank on a placeholder)" if self.requests < self.dp else ""
            return (f"{self.integration} {self.path} DP{self.dp} TP{self.tp} {self.dtype}: {self.requests} requests, "
                    f"offline data parallel{late}{idle}")
        idle = "  (a DP rank idle)" if self.requests < self.dp else ""
        return (f"{self.integration} {self.path} DP{self.dp} TP{self.tp} {self.dtype}: {self.requests} concurrent "
                f"requests{late}{idle}")

    def to_cli(self) -> str:
        line = (f"a2a-testbed serve --integration {self.integration} --dp {self.dp} --tp {self.tp} --path {self.path} "
                f"--requests {self.requests} --dtype {self.dtype} --seed {self.seed}")
        return line + (f" --profile {self.profile}" if self.profile != ServeScenario.profile else "") + \
            (" --offline" if self.offline else "") + (" --late-zeroing" if self.late_zeroing else "")


def matrix(integration: str, profile: str, dtype: str = "bfloat16", seed: int = 0) -> list[ServeScenario]:
    """The integration's serve matrix (:attr:`testbed.integrations.engine.Serving.shapes`; vLLM's:
    each path at DP 2 with unequal counts (3 requests), at DP 4 with a DP rank idle (2
    requests), and one-sided at TP 2 x DP 2), then its offline entries (``offline_shapes``)."""
    serving = integrations.get(integration).engine.serving
    return [ServeScenario(dp=dp, tp=tp, path=path, requests=n, integration=integration, dtype=dtype, profile=profile,
                          seed=seed, offline=offline, label=("offline " if offline else "") + f"{path} DP{dp}"
                          + (f" TP{tp}" if tp > 1 else "") + (" idle" if n < dp else ""))
            for offline, shapes in ((False, serving.shapes), (True, serving.offline_shapes))
            for path, dp, tp, n in shapes]


@dataclass
class Answer:
    """A request's answer: the generated ids, for each the logprobs of the best two (where
    the server gave them), and the prompt's logprobs after its first token (None: not asked,
    streamed)."""

    ids_N: list[int]
    top2_N: list[list[float]]
    prompt_logprobs: Optional[list[float]]


@dataclass
class Served:
    """What one server run gave: the answers by request, the server's processes' event logs
    and steps by global rank, why it went wrong (or None) and its timings."""

    answers: dict[int, Answer] = field(default_factory=dict)
    trouble: Optional[str] = None
    testbed_error: str = ""
    ready_s: float = 0.0
    answered_s: float = 0.0
    pids: dict[int, int] = field(default_factory=dict)  # global rank -> the engine process that was it
    # global rank -> (events, steps) of its logs when the ranks came to rest after the last
    # answer, the cut that is judged; None where they did not within REST_TIMEOUT_S
    rest: Optional[dict[int, tuple[int, int]]] = None
    rest_s: float = 0.0


@dataclass
class ServeVerdict:
    serve: ServeScenario
    scenario: object = None  # the rounds as a layer scenario
    failures: list[Failure] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    known_failures: list[Failure] = field(default_factory=list)
    steps: dict[int, list] = field(default_factory=dict)
    generate_from: int = 0
    rounds: dict[int, int] = field(default_factory=dict)  # global rank -> the dispatches it recorded
    cut: dict[int, int] = field(default_factory=dict)  # global rank -> its dispatches begun after the rest, not judged
    worst_logprob: float = 0.0
    served: Served = field(default_factory=Served)
    reference_s: float = 0.0
    # With the late zeroing: how the first EP rank had moved on when the last zeroed (what
    # ordered them), or None where no late rank was held.
    released_by: Optional[str] = None
    testbed_error: str = ""  # the testbed could not serve the scenario as asked: never the engine's failure

    @property
    def passed(self) -> bool:
        return not self.failures and not self.testbed_error


# --- in the engine's processes ------------------------------------------------------------


@dataclass
class ServedRank:
    """An engine process's rank, as the recorders take a rank pool's context: its global
    rank, the world, the expert-parallel group's global ranks (the engine's own), the seed;
    what they would undo at a scenario's end lives as long as the process."""

    rank: int
    world_size: int
    group_ranks: dict
    seed: int

    def add_cleanup(self, fn) -> None:
        pass


def start_process(run_dir: str) -> None:
    """Called by the integration's serving plugin as each process of the server starts: the
    run's mutant applied to the engine's code, for the process's life."""
    plan = served.plan(run_dir)
    if plan["mutant"]:
        from testbed.harness import mutants

        integrations.register(plan["module"])
        mutants.apply(plan["mutant"])  # a MutantError: the testbed's (the plugin writes it down)


def start_rank(run_dir: str, rank: int, world_size: int, ep_ranks: tuple[int, ...]):
    """Called by the integration's serving plugin in an engine process once the engine's
    groups are formed: that rank's recorders, as a rank program's (:func:`program.record_engine_rank`);
    returns its event log."""
    from testbed.harness import program

    plan = served.plan(run_dir)
    ss = ServeScenario(**plan["serve"])
    sc = ss.recorded()
    ctx = ServedRank(rank, world_size, {"ep": tuple(ep_ranks)}, ss.seed)
    with open(os.path.join(run_dir, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    return program.record_engine_rank(ctx, sc, run_dir, plan["module"])


# --- in the testbed's process -------------------------------------------------------------


def run(ss: ServeScenario, *, code: Optional[Path] = None, reference: Optional[dict[int, Answer]] = None,
        mutant: Optional[str] = None, timeout_s: float = DEFAULT_TIMEOUT_S, log: Optional[Path] = None,
        live: bool = False) -> ServeVerdict:
    """Serve ``ss`` (the engine's code from ``code`` first on the path, or the installed one),
    optionally against ``mutant``; judge it against ``reference`` (the answers of
    :func:`serve_reference`, computed here where not given)."""
    v = ServeVerdict(ss)
    started = time.monotonic()
    if reference is None:
        reference, trouble = serve_reference(ss, ss.requests, code=code, timeout_s=timeout_s, log=log, live=live)
        if trouble:
            v.failures.append(Failure("completes", f"the reference server (DP 1, expert parallel off): {trouble}"))
    v.reference_s = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="a2atb-serve-") as run_dir:
        v.served = _serve(ss, run_dir, code=code, mutant=mutant, timeout_s=timeout_s, log=log, live=live)
        logs, steps = _logs(run_dir, ss.dp * ss.tp)
        if ss.late_zeroing:
            v.released_by = late_zeroing.released_by(run_dir, 0)  # rank 0 leads its EP group
    if v.served.rest is not None:  # what began after the rest, the stop cut: judged is the rest
        v.cut = {r: _dispatches(logs[r][n:]) for r, (n, _) in v.served.rest.items()}
        logs = {r: logs[r][:n] for r, (n, _) in v.served.rest.items()}
        steps = {r: steps[r][:m] for r, (_, m) in v.served.rest.items()}
    results = [{"prepares": steps[r], "generate_from": 0} for r in range(ss.dp * ss.tp)]
    v.rounds = {r: _dispatches(events) for r, events in logs.items()}
    if v.served.testbed_error:
        v.testbed_error = v.served.testbed_error
        return v
    error = ServedTrouble(v.served.trouble) if v.served.trouble else None
    shadow = engine.EngineVerdict(ss.engine_scenario())
    sc = engine.rounds_scenario(ss.engine_scenario(), logs, results, shadow) if any(logs.values()) else None
    v.steps, v.failures = shadow.steps, v.failures + shadow.failures
    if sc is not None:
        v.scenario = sc
        v.failures += invariants.check_rounds(sc, logs, error).failures  # its "completes" says the trouble
    elif error is not None:
        v.failures.append(Failure("completes", f"{type(error).__name__}: {error}"))
    _compare(ss, v.served.answers, reference, v)
    if v.scenario is not None:
        engine.judge_known(v)
    return v


class ServedTrouble(RuntimeError):
    """Why a server run went wrong, as the invariants take a rank pool's error: no rank is
    certain to have finished, and none reported (the engine's processes are its own)."""

    reports: dict = {}
    finished: frozenset = frozenset()


def serve_reference(ss: ServeScenario, requests: int, **kw) -> tuple[dict[int, Answer], Optional[str]]:
    """Requests ``0 .. requests-1`` of ``ss``'s seed served at DP 1 with expert parallel off:
    the answers, and why the run went wrong (or None)."""
    one = replace(ss, dp=1, tp=1, requests=requests, offline=False, late_zeroing=False)
    with tempfile.TemporaryDirectory(prefix="a2atb-serve-ref-") as run_dir:
        served = _serve(one, run_dir, reference=True, **kw)
    return served.answers, served.trouble


def _steps(run_dir: str, rank: int) -> list:
    try:
        with open(os.path.join(run_dir, f"steps{rank}.jsonl")) as f:
            return [(layer, rows, tuple(counts) if counts is not None else None)
                    for layer, rows, counts in (json.loads(line) for line in f if line.endswith("\n"))]
    except FileNotFoundError:
        return []


def _logs(run_dir: str, world: int, tails: Optional[dict] = None) -> tuple[dict[int, list], dict[int, list]]:
    """Each global rank's events and steps (its forward contexts, layer by layer) so far."""
    tails = tails if tails is not None else {r: LogTail(os.path.join(run_dir, f"rank{r}.jsonl")) for r in range(world)}
    return {r: list(t.events()) for r, t in tails.items()}, {r: _steps(run_dir, r) for r in range(world)}


def _dispatches(events: list) -> int:
    return sum(isinstance(e, Collective) and e.op in DISPATCH_OPS for e in events)


def _at_rest(logs: dict[int, list], steps: dict[int, list]) -> bool:
    """Whether the logs are a cut no round crosses: every rank between forwards (each layer
    call it began, ended), as many forward contexts on each, and every member of each group
    with as many collectives of each kind on it as the others."""
    if len({len(s) for s in steps.values()}) != 1:
        return False
    counts: dict = {}
    for rank, events in logs.items():
        open_calls = 0
        for e in events:
            if isinstance(e, ForwardStart):
                open_calls += 1
            elif isinstance(e, ForwardEnd):
                open_calls -= 1
            elif isinstance(e, Collective):
                counts.setdefault((e.group, e.op), {}).setdefault(rank, 0)
                counts[(e.group, e.op)][rank] += 1
        if open_calls:
            return False
    return all(len({per.get(r, 0) for r in group}) == 1 for (group, _), per in counts.items())


def _come_to_rest(run_dir: str, world: int, deadline: float) -> Optional[dict[int, tuple[int, int]]]:
    """Each rank's (events, steps) once the engine's processes stand at a cut no round crosses
    and it held over one poll (DP engines stepping dummy batches until their wave ends pass
    such cuts only between steps); None where they did not by ``deadline``: a rank waiting
    on peers that never come (on GPUs, a hang) is judged on what it recorded."""
    tails = {r: LogTail(os.path.join(run_dir, f"rank{r}.jsonl")) for r in range(world)}
    seen = None
    while time.monotonic() < deadline:
        logs, steps = _logs(run_dir, world, tails)
        now = {r: (len(logs[r]), len(steps[r])) for r in range(world)}
        if now == seen and _at_rest(logs, steps):
            return now
        seen = now
        time.sleep(REST_POLL_S)  # an observation of quiescence: only time can show nothing more comes
    return None


# A server's port: below the kernel's ephemeral ports (32768 on), as users pick one (SGLang's
# 30000, vLLM's 8000), where an engine's own derived ports stay valid too (SGLang 0.5.11 ..
# 0.5.15 refuse to start on one above 55535: they check port + 10000 for a gRPC server that
# does not run).
SERVER_PORTS = range(20000, 32768)


def _free_port() -> int:
    pick = random.Random(os.urandom(8))  # parallel runs never share a seeded sequence
    for port in pick.sample(SERVER_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on the loopback address among 200 of {SERVER_PORTS}")


def _serve(ss: ServeScenario, run_dir: str, *, code: Optional[Path], mutant: Optional[str] = None,
           reference: bool = False, timeout_s: float, log: Optional[Path], live: bool) -> Served:
    """One server of ``ss`` (``reference``: DP 1, expert parallel off) from start to its last
    process gone, answering requests ``0 .. ss.requests-1``."""
    from fakes import spawned
    from fakes.arena import scenario_prefix, sweep_orphans, unlink_prefix
    from fakes.stacks import STACKS_ENV

    sweep_orphans()  # of a run whose testbed was killed

    module = integrations.module_of(ss.integration)
    es = ss.engine_scenario()
    model_dir = os.path.join(run_dir, "model")
    ck = es.checkpoint()
    checkpoint.write(ck, model_dir)
    checkpoint.write_tokenizer(ck, model_dir)
    offline = ss.offline and not reference
    # The engine's own processes generate an offline run's requests: the plan names them.
    requests = {"offline_requests": [{"prompt": list(rq.prompt_P), "max_tokens": rq.max_tokens}
                                     for rq in map(ss.request, range(ss.requests))],
                "offline_timeout_s": STARTUP_TIMEOUT_S + timeout_s} if offline else {}
    with open(os.path.join(run_dir, "plan.json"), "w") as f:
        json.dump({"serve": {k: v for k, v in asdict(ss).items() if k != "label"}, "module": module,
                   "path": ss.path, "mutant": None if reference else mutant,
                   "start_process": f"{__name__}:start_process",
                   "start_rank": "" if reference else f"{__name__}:start_rank"} | requests, f)
    port = _free_port()
    serving = integrations.get(ss.integration).engine.serving
    argv = serving.offline(es, model_dir, run_dir) if offline else serving.command(es, model_dir, port, reference)
    env = session.engine_environment(code) | serving.environment(es, reference)
    prefix = scenario_prefix(os.getpid(), f"serve{port}")
    # its hook first, then the code
    spawned.enable(ss.profile, env, arena=prefix, devices=es.layout.world_size if serving.devices else None,
                   prepare=serving.prepare or None)
    stacks = Path(run_dir) / "stacks"
    stacks.mkdir()
    env |= {SERVE_RUN_ENV: run_dir, STACKS_ENV: str(stacks)}
    served = Served()
    out = open(log, "ab") if log else open(os.devnull, "wb")
    with out:
        out.write(f"\n=== {'reference ' if reference else ''}{' '.join(argv)}\n".encode())
        out.flush()
        proc = session.start(argv, env=env, cwd=run_dir, out=out, live=live)
        try:
            began = time.monotonic()
            if offline:
                served.trouble = _generated(proc, began + STARTUP_TIMEOUT_S + timeout_s)
                served.answered_s = time.monotonic() - began
                served.answers, missing = _offline_answers(run_dir, ss.dp)
                served.trouble = served.trouble or missing
            else:
                served.trouble = _ready(proc, port, serving.ready, began + STARTUP_TIMEOUT_S)
                served.ready_s = time.monotonic() - began
            if served.trouble is None and not offline:
                began = time.monotonic()
                served.answers, served.trouble = _ask(ss, port, began + timeout_s, serving.prompt_logprobs)
                served.answered_s = time.monotonic() - began
                if served.trouble is None and not reference:
                    began = time.monotonic()
                    served.rest = _come_to_rest(run_dir, es.layout.world_size, began + REST_TIMEOUT_S)
                    served.rest_s = time.monotonic() - began
            if served.trouble and TIMED_OUT in served.trouble:
                served.trouble += "; the run's processes, killed, were at:\n" + "\n".join(session.stuck(proc, stacks, out))
        finally:
            _stop(proc)
            unlink_prefix(prefix)
    error = Path(run_dir) / "testbed-error"
    if error.is_file():
        served.testbed_error = error.read_text().splitlines()[0]
    for r in range(es.layout.world_size):
        pid = Path(run_dir) / f"pid{r}"
        if pid.is_file():
            served.pids[r] = int(pid.read_text())
    return served


def _ready(proc, port: int, paths: tuple[str, ...], deadline: float) -> Optional[str]:
    """None once the server answers 200 at the first of ``paths`` it has (a 404 moves on);
    else why not (it exited, or the time ran out)."""
    paths = list(paths)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"the server exited with {proc.returncode} before it was ready (its log says why)"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{paths[0]}", timeout=2) as r:
                if r.status == 200:
                    return None
        except urllib.error.HTTPError as e:
            if e.code == 404 and len(paths) > 1:  # a release without this path
                paths.pop(0)
        except OSError:
            pass
        try:  # a readiness probe, not a synchronisation: the server's exit ends the wait at once
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:  # still starting
            pass
    return f"{TIMED_OUT} before the server was ready at {' or '.join(paths)} ({STARTUP_TIMEOUT_S:.0f} s)"


def _generated(proc, deadline: float) -> Optional[str]:
    """None once the offline DP launcher ended well (every DP rank's process generated its
    share, and the engine's processes below them shut down); else why not."""
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return f"{TIMED_OUT}: the DP ranks' processes had not ended"
    return f"the offline data parallel exited with {proc.returncode} (its log says why)" if proc.returncode else None


def _offline_answers(run_dir: str, dp: int) -> tuple[dict[int, Answer], Optional[str]]:
    """The answers every DP rank's process wrote, and which wrote none (or None)."""
    answers, missing = {}, []
    for d in range(dp):
        try:
            with open(served.answers_path(run_dir, d)) as f:
                written = json.load(f)
        except FileNotFoundError:
            missing.append(d)
            continue
        answers |= {int(i): Answer(a["ids"], a["top2"], a["prompt_logprobs"]) for i, a in written.items()}
    return answers, f"DP ranks {missing} wrote no answers" if missing else None


def _ask(ss: ServeScenario, port: int, deadline: float, prompt_logprobs: str) -> tuple[dict[int, Answer], Optional[str]]:
    """Every request of ``ss`` at once, each by a client of its own, all answered by
    ``deadline``; the answers and the first error (or None). ``prompt_logprobs``: how the
    server gives a prompt's logprobs (:class:`testbed.integrations.engine.Serving`)."""
    from openai import OpenAI

    started = time.monotonic()
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="testbed", max_retries=0)
    try:
        model = client.models.list(timeout=max(1.0, deadline - time.monotonic())).data[0].id
    except Exception as e:  # noqa: BLE001  (the server gone or refusing: the run's trouble)
        return {}, f"the server's model list: {type(e).__name__}: {e}"

    def one(i: int) -> Answer:
        rq = ss.request(i)
        left = max(1.0, deadline - time.monotonic())
        echo = prompt_logprobs == "echo" and not rq.stream
        extra = {"ignore_eos": True} | ({} if rq.stream or echo else {"prompt_logprobs": 0})
        kw = dict(model=model, prompt=list(rq.prompt_P), max_tokens=rq.max_tokens, temperature=0.0, logprobs=2,
                  timeout=left, extra_body=extra) | ({"echo": True} if echo else {})
        if rq.stream:
            ids, top2 = [], []
            for chunk in client.completions.create(stream=True, **kw):
                for choice in chunk.choices:
                    _read_choice(choice, ids, top2)
            return Answer(ids, top2, None)
        choice = client.completions.create(**kw).choices[0]
        ids, top2 = [], []
        _read_choice(choice, ids, top2)
        if echo:  # the prompt's tokens first (the first without a logprob), then the generated ones
            prompt = [float(lp) for lp in choice.logprobs.token_logprobs[1:len(rq.prompt_P)]]
            ids, top2 = ids[len(rq.prompt_P):], top2[len(rq.prompt_P):]
        else:
            entries = (choice.model_extra or {}).get("prompt_logprobs") or []
            prompt = [entry[str(token)]["logprob"] for token, entry in zip(rq.prompt_P[1:], entries[1:])]
        return Answer(ids, top2, prompt)

    answers, trouble = {}, None
    with ThreadPoolExecutor(ss.requests) as pool:
        futures = {i: pool.submit(one, i) for i in range(ss.requests)}
        for i, fut in futures.items():
            try:
                answers[i] = fut.result()
            except Exception as e:  # noqa: BLE001  (an HTTP error, a timeout: the run's trouble)
                timed_out = "timed out" in str(e).lower() or "timeout" in type(e).__name__.lower()
                trouble = trouble or (f"request {i}: no answer within {deadline - started:.0f} s of the server's "
                                      f"readiness ({TIMED_OUT})" if timed_out else
                                      f"request {i}: {type(e).__name__}: {e}")
    return answers, trouble


def _read_choice(choice, ids: list[int], top2: list[list[float]]) -> None:
    lp = choice.logprobs
    for k, word in enumerate(lp.tokens if lp else []):
        ids.append(int(word.removeprefix(checkpoint.token_word(0)[:-1])))
        best = sorted((lp.top_logprobs[k] or {}).values(), reverse=True)[:2] if lp.top_logprobs else []
        top2.append(best)


def _stop(proc) -> None:
    """The server's own shutdown (SIGTERM, as a user's Ctrl-C or an orchestrator), then what is
    left of its session killed."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=STOP_GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    session.kill(proc)


def _compare(ss: ServeScenario, got: dict[int, Answer], want: dict[int, Answer], v: ServeVerdict) -> None:
    tolerance = engine.LOGPROB_TOLERANCE[ss.dtype]
    bad = []
    for i in sorted(got):
        a, b = got[i], want.get(i)
        if b is None:
            continue
        for j, (x, y) in enumerate(zip(a.ids_N, b.ids_N)):
            if x != y:
                near_tie = len(b.top2_N[j]) == 2 and b.top2_N[j][0] - b.top2_N[j][1] < tolerance
                if not near_tie:
                    bad.append(f"request {i} token {j}: generated {x}, the reference {y} (its best two "
                               f"{b.top2_N[j]})")
                break
        if len(a.ids_N) != len(b.ids_N):
            bad.append(f"request {i}: {len(a.ids_N)} tokens generated, the reference {len(b.ids_N)}")
        for j, (x, y) in enumerate(zip(a.prompt_logprobs or [], b.prompt_logprobs or [])):
            v.worst_logprob = max(v.worst_logprob, abs(x - y))
            if abs(x - y) > tolerance:
                bad.append(f"request {i} prompt token {j + 1}: logprob {x:.4f}, the reference {y:.4f} "
                           f"(|diff| {abs(x - y):.3g} > {tolerance} for {ss.dtype})")
    if bad:
        more = f"\n(+{len(bad) - 8} more)" if len(bad) > 8 else ""
        v.failures.append(Failure("answers", "\n".join(bad[:8]) + more))


# --- the report -----------------------------------------------------------------------------


def report_lines(index: int, total: int, v: ServeVerdict, mutant: Optional[str] = None) -> list[str]:
    """At most 15 lines, the verdict last (``mutant``: the one served against)."""
    ss, s = v.serve, v.served
    status = "ERROR" if v.testbed_error else "FAIL" if not v.passed else "KNOWN" if v.known else "PASS"
    if v.testbed_error:
        return [f"  the testbed's error, not the engine's: {v.testbed_error}",
                f"{status} {index:>3}/{total:<3} {ss.describe()}"]
    reference = f"; reference (DP 1) {v.reference_s:.1f} s" if v.reference_s >= 0.1 else ""
    lines = [f"  the DP ranks' processes generated {len(s.answers)}/{ss.requests} requests in {s.answered_s:.1f} s"
             f"{reference}" if ss.offline else
             f"  server ready in {s.ready_s:.1f} s, {len(s.answers)}/{ss.requests} requests answered in "
             f"{s.answered_s:.1f} s{reference}"]
    per = ", ".join(f"rank {r}{f' (pid {s.pids[r]})' if r in s.pids else ''} {n}" for r, n in sorted(v.rounds.items()))
    lines.append(f"  dispatches recorded per engine process: {per}{_rest_text(v)}")
    if v.steps:
        counts = [c for _, _, c in next(iter(v.steps.values()))]
        shown = ", ".join(str(tuple(c)) for c in counts[:6]) + (f", ... ({len(counts)} in all)" if len(counts) > 6 else "")
        lines.append(f"  DP token counts per forward: {shown}")
    if ss.late_zeroing:
        lines.append("  late zeroing: " + (f"the first EP rank had {v.released_by} when the last zeroed its row"
                                           if v.released_by else "no EP rank's zeroing was held (no MoeAlltoAll "
                                           "workspace was zeroed after the first rank's)"))
    for f in v.failures[:4]:
        text = f.evidence.splitlines()
        lines.append(f"  [{f.invariant}] {text[0][:300]}" + (f" (+{len(text) - 1} lines)" if len(text) > 1 else ""))
    if len(v.failures) > 4:
        lines.append(f"  ... {len(v.failures) - 4} more failures (--json holds every one)")
    if not v.passed:
        lines.append(f"  reproduce: {ss.to_cli()}" + (f" --mutant {mutant}" if mutant else ""))
    known = f"  {', '.join(v.known)} (docs/findings.md)" if v.known else ""
    lines.append(f"{status} {index:>3}/{total:<3} {ss.describe()}{known}")
    return lines


def _rest_text(v: ServeVerdict) -> str:
    """What the report says of the rest after the last answer: the rounds the stop cut after
    it, or that the ranks never came to rest; nothing where there is nothing to say."""
    s, cut = v.served, sum(v.cut.values())
    if s.rest is not None:
        return (f"; {cut} begun after the ranks came to rest ({s.rest_s:.1f} s after the last answer), cut by the "
                "server's stop, not judged") if cut else ""
    if s.answers and s.trouble is None and not v.serve.offline:  # offline, the processes ended by themselves
        return (f"; the ranks did not come to rest within {REST_TIMEOUT_S:.0f} s of the last answer: judged as the "
                "stop left them")
    return ""


def as_json(v: ServeVerdict) -> dict:
    return {"label": v.serve.label, "scenario": v.serve.describe(), "reproduce": v.serve.to_cli(), "passed": v.passed,
            "known": v.known, "testbed_error": v.testbed_error, "ready_s": round(v.served.ready_s, 3), "answered_s": round(v.served.answered_s, 3),
            "reference_s": round(v.reference_s, 3), "worst_logprob": v.worst_logprob,
            "dispatches_per_rank": {str(r): n for r, n in v.rounds.items()},
            "cut_after_rest": {str(r): n for r, n in v.cut.items() if n},
            "rest_s": round(v.served.rest_s, 3) if v.served.rest is not None else None,
            "pids": {str(r): p for r, p in v.served.pids.items()},
            "late_zeroing_released_by": v.released_by,
            "failures": [{"invariant": f.invariant, "evidence": f.evidence} for f in v.failures],
            "steps": {str(r): [{"forward": p, "rows": rows, "dp_tokens": list(dp)} for p, rows, dp in s]
                      for r, s in v.steps.items()}}

