"""The sweeps: catalogues run whole, each an ``a2a-testbed`` command judged from the JSON it
writes. The sweeps of one group run one after another in a process of their own, so an engine
release is imported, and its rank pool's fork server started, once for all of them.

The catalogue is derived, never listed, and nothing of it is sampled. impl's matrix runs as it
is and moved to the newest FlashInfer release, and the model matrix on impl with every release.
For every engine integration installed here, its whole history (:attr:`Engine.history`, each
release on the FlashInfer its own metadata pins) is one sweep, ``a2a-testbed history
--findings``: each release's matrix, mutants and findings' survey in a process of the release's
own, several at once, a release whose engine code is identical to an earlier one's taking its
verdicts; each release is then held to the judges of a matrix, a hunt and a survey held to
``docs/findings.md``'s lineage table. The installed release's matrix runs again through the reuse
differential, and an integration with an engine level has its engine matrix on the installed
and the newest release, and a served one its serve matrix on both and its served mutants. A
release added to an adapter joins the sweeps with no edit here, in the tests or in CI.
``a2a-testbed sweep`` runs them (``--shard I/N`` splits the groups over machines) and fails on
any problem; ``tests/`` check the machinery on small cases and never run a catalogue.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

from testbed import integrations

ROOT = Path(__file__).resolve().parents[2]
FINDINGS_DOC = ROOT / "docs" / "findings.md"
# Per sweep, a hang's bound, not a speed goal (the runners' speed varies 2x from day to day):
# the slowest of them (vLLM 0.34.0's engine matrix) took 408 s on 2 cores one day, 635 s another.
SWEEP_TIMEOUT_S = 1800.0

SERVED_MATRIX_S = 3000.0
# An engine's history, its releases two at once beside the other groups: vLLM's 24 took
# 1882 s with their findings' surveys on 2 cores, and ~2x that on a slow day's runner.
HISTORY_S = 5400.0
# The model matrix with every release: 179 scenarios, ~7 min alone on 2 cores.
MODELS_S = 1800.0
HISTORY_JOBS = 2
Judge = Callable[[dict, str], list[str]]  # (its JSON, its stdout) -> problems


@dataclass(frozen=True)
class Sweep:
    name: str  # "vllm 0.31.0 mutants"
    argv: tuple[str, ...]  # after ``a2a-testbed``, without ``--json``
    judge: Judge
    engine: Optional[str] = None  # the engine integration it needs installed
    group: str = ""  # the sweeps of one group share a process ("vllm 0.31.0"); "": its own name
    least_s: float = 0.0  # its own time limit where it needs more than the sweeps' (a served matrix)
    keeps: bool = False  # its command keeps what it ran in a folder (``--keep``) beside its JSON

    @property
    def command(self) -> str:
        return "a2a-testbed " + " ".join(self.argv)


@dataclass
class Outcome:
    sweep: Sweep
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    summary: str = ""  # its command's last line
    log: str = ""  # where its whole output is

    @property
    def passed(self) -> bool:
        return not self.problems


# -- the catalogue ---------------------------------------------------------------------------
def releases(engine) -> list[tuple[str, Optional[str]]]:
    """``(release, --<engine>-source value or None for the installed one)`` of every release
    the adapter drives, the installed one first."""
    return [(engine.release()[0], None)] + [(r, r) for r in engine.releases()]


def catalogue() -> list[Sweep]:
    """Every sweep this machine can run, a group's together: those of the engines not
    installed are left out (``a2a-testbed sweep --list`` says which and why)."""
    from fakes.flashinfer.profiles import distinct_alltoalls, release_key

    newest = max(distinct_alltoalls(), key=release_key)
    # The installed releases' matrices and impl's run again on fresh process groups (reuse
    # differential): a verdict that differs fails the sweep (its exit status).
    differential = ("--reuse-differential",)
    sweeps = [Sweep("impl matrix", ("run", *differential), judge_whole, group="impl"),
              Sweep(f"impl matrix on {newest}", ("run", "--matrix-profile", newest), judge_moved, group="impl"),
              Sweep("models", ("run", "--models"), judge_whole, least_s=MODELS_S)]
    for integration in integrations.engines():
        engine = integration.engine
        if importlib.util.find_spec(engine.name) is None:
            continue
        installed, pin = engine.release()
        sweeps.append(Sweep(f"{engine.name} history", ("history", "--integration", engine.name, "--jobs",
                                                       str(HISTORY_JOBS)) + (("--findings",) if integration.findings()
                                                                              else ()),
                            judge_history(integration), engine.name, least_s=HISTORY_S, keeps=True))
        sweeps.append(Sweep(f"{engine.name} {installed} reuse differential",
                            ("run", "--integration", engine.name, *differential),
                            judge_matrix(pin or engine.default_pin), engine.name))
        newest_release = max(engine.releases(), key=release_key, default=None)
        newer = newest_release is not None and release_key(newest_release) > release_key(installed)
        on = [(installed, ())] + ([(newest_release, (f"--{engine.name}-source", newest_release))] if newer else [])
        if integration.has_engine_level():
            for release, flag in on:
                sweeps.append(Sweep(f"{engine.name} {release} engine matrix",
                                    ("engine", "--integration", engine.name, *flag), judge_engine(integration),
                                    engine.name))
        if engine.serving is not None:
            for release, flag in on:
                # ~11 min alone on 2 cores (DP 4 starts 13 processes); beside three other groups, more.
                sweeps.append(Sweep(f"{engine.name} {release} serve matrix", ("serve", "--integration", engine.name,
                                                                              *flag),
                                    judge_serve(integration), engine.name, least_s=SERVED_MATRIX_S))
            sweeps.append(Sweep(f"{engine.name} serve mutants", ("serve", "--integration", engine.name, "--mutants"),
                                judge_mutants(engine, None), engine.name))
    return sweeps


def groups(sweeps: list[Sweep]) -> list[list[Sweep]]:
    """``sweeps`` by the process they share, the heaviest first (:func:`weight`; catalogue order
    among equals): run N at once, a heavy group started last would end the whole alone."""
    by: dict[str, list[Sweep]] = {}
    for sweep in sweeps:
        by.setdefault(sweep.group or sweep.name, []).append(sweep)
    return sorted(by.values(), key=lambda group: -sum(map(weight, group)))


def weight(sweep: Sweep) -> int:
    """A sweep's rough cost, in units of a release's matrix: an engine's history three per
    release (matrix, mutants, findings), the model matrix six, an engine matrix three, a matrix
    run again by the reuse differential two, a served matrix (its engine's processes started
    anew per entry) eight, a served hunt two."""
    if sweep.argv[0] == "history":
        return 3 * len(integrations.get(sweep.engine).engine.history)
    if sweep.argv[0] == "serve":
        return 2 if "--mutants" in sweep.argv else 8
    if "--models" in sweep.argv:
        return 6
    if sweep.argv[0] == "engine":
        return 3
    return 2 if "--reuse-differential" in sweep.argv else 1


def missing() -> list[str]:
    """Why the sweeps of an engine are not in :func:`catalogue` here (one line each)."""
    return [f"{i.name}: {i.engine.label} is not installed (`./dev setup --{i.name}`)" for i in integrations.engines()
            if importlib.util.find_spec(i.engine.name) is None]


# -- the judges ------------------------------------------------------------------------------
def _first_line(failures: list[dict]) -> str:
    return "; ".join(f"[{f['invariant']}] {f['evidence'].splitlines()[0][:200]}" for f in failures[:2])


def _verdict_problems(ran: list[dict]) -> list[str]:
    """Every failed scenario, and every passing one the dense reference did not judge."""
    problems = [(f"TESTBED ERROR {s['label']}: {s['testbed_error'].splitlines()[0][:200]}" if s.get("testbed_error")
                 else f"FAIL {s['label']}: {_first_line(s['failures'])}") + f"  reproduce: a2a-testbed {s['cli']}"
                for s in ran if not s["passed"]]
    unjudged = [s["label"] for s in ran if s["passed"] and not s["known"]
                and (not s["layer_errors"] or not isinstance(s["worst_x_tolerance"], (int, float))
                     or s["worst_x_tolerance"] > 1.0)]
    if unjudged:
        problems.append(f"passed without a comparison with the dense reference within tolerance: {unjudged[:3]}")
    return problems + ([] if ran else ["no scenario ran"])


def judge_whole(data: dict, stdout: str) -> list[str]:
    """A matrix run whole (impl's, the models'): every scenario passes, compared with the
    dense reference, and none is left out."""
    problems = _verdict_problems(data["scenarios"])
    if "NOT RUN" in stdout:
        problems.append("the matrix left scenarios out: " + next(
            line for line in stdout.splitlines() if line.startswith("NOT RUN")))
    return problems


def judge_moved(data: dict, stdout: str) -> list[str]:
    """impl's matrix moved to another release: every scenario that release takes passes
    (those it refuses are the scenario model's rules, which ``tests/`` hold)."""
    return _verdict_problems(data["scenarios"])


def judge_matrix(pin: str) -> Judge:
    """An engine release's matrix: every scenario passes or fails exactly as its known
    findings say (the runner judges that), each on the release's own pin, each verdict line
    naming the profile that serves a pin no profile has by name."""
    def judge(data: dict, stdout: str) -> list[str]:
        from fakes.flashinfer.profiles import serving

        ran = data["scenarios"]
        problems = _verdict_problems(ran)
        off = [s["label"] for s in ran if f"--profile {pin} " not in s["cli"] + " "]
        if off:
            problems.append(f"{len(off)} scenarios not on the release's pin {pin}: {off[:3]}")
        served = serving(pin)
        if served is None and f"{pin} (no wheel; served by " not in stdout:
            problems.append(f"the verdict lines do not say which profile serves the wheelless pin {pin}, and why")
        elif served not in (None, pin) and f"{pin} (served by {served})" not in stdout:
            problems.append(f"the verdict lines do not say that {served} serves the pin {pin}")
        return problems
    return judge


def judge_mutants(engine, source: Optional[str]) -> Judge:
    """An engine release's mutants: every one killed, each by the failure it names; one is
    left out (N/A) as absent only where the release's source of its target has none of the
    code it changes, and as equivalent, masked or unbuilt only with its reason."""
    def judge(data: dict, stdout: str) -> list[str]:
        from testbed.contract.source import open_package
        from testbed.harness import mutants

        flag = f" --{engine.name}-source {source}" if source else ""
        problems = [f"{m['mutant']} SURVIVED: {m['by']}  reproduce: a2a-testbed mutants --integration "
                    f"{engine.name}{flag} --only {m['mutant']}" for m in data["mutants"] if not m["killed"]]
        if not data["mutants"]:
            problems.append("no mutant was hunted")
        package = None
        for absent in data["not_applicable"]:
            m = mutants.get(absent["mutant"])
            # Its code is there: the probe names the guard or finding (unbuilt: the package its module lacks).
            if absent["kind"] in ("equivalent", "masked", "unbuilt", "served"):
                if not absent["why"]:
                    problems.append(f"{m.name} was left out as {absent['kind']} without a reason")
                continue
            package = package or open_package(engine.name, source)
            for module in m.target.partition(":")[0].split("|"):
                try:
                    text = package.read(module.replace(".", "/") + ".py")
                except (KeyError, FileNotFoundError):  # the module came later (or moved)
                    continue
                present = [old for old in (m.old,) + tuple(old for old, _ in m.forms) if old in text]
                if present:
                    problems.append(f"{m.name} was left out as N/A ({absent['why']}), but {module} of this "
                                    f"release holds the code it changes: {present[0][:80]!r}")
        return problems
    return judge


def judge_engine(integration) -> Judge:
    """The engine matrix: every entry passes or reproduces its findings, had rounds to judge
    (a dispatch and a combine per MoE layer, forward and rank on the one-sided path), and its
    ranks stepped as the integration's step rule says (:func:`_step_problems`), and under
    sequence parallel each TP rank's prepares received its share of its DP rank's tokens."""
    def judge(data: dict, stdout: str) -> list[str]:
        entries = {es.describe(): es for es in integration.engine_matrix()}  # imports the engine: once, here
        problems = []
        for v in data["verdicts"]:
            es = entries.get(v["scenario"])
            if es is None:
                problems.append(f"{v['scenario']}: not an entry of the engine matrix")
                continue
            if not v["passed"]:
                problems.append(f"FAIL {v['scenario']}: {_first_line(v['failures'])}  reproduce: {v['reproduce']}")
                continue
            forwards = len(v["steps"]["0"])
            layers, world = es.checkpoint().layers, es.layout.world_size
            if forwards < 2 or v["events"].get("forward") != forwards * layers * world:
                problems.append(f"{v['scenario']}: {forwards} forwards and {v['events'].get('forward')} MoE forwards "
                                f"({layers} layers on {world} ranks): the invariants had no rounds to judge")
            if es.path == "one_sided" and not v["events"].get("dispatch") == v["events"].get("combine") \
                    == v["events"].get("forward"):
                problems.append(f"{v['scenario']}: dispatches, combines and MoE forwards differ: {v['events']}")
            problems += _step_problems(integration, v)
            for rank, steps in v["steps"].items():
                dp_rank = int(rank) // es.tp
                for step in steps:
                    counts = step["dp_tokens"]
                    share = -(-counts[dp_rank] // es.tp) if es.tp > 1 else counts[dp_rank]
                    if step["rows"] != share:
                        problems.append(f"{v['scenario']}: rank {rank} forward {step['forward']} prepared "
                                        f"{step['rows']} rows of DP tokens {counts}, not the step rule's {share}")
                        break
        missed = set(entries) - {v["scenario"] for v in data["verdicts"]}
        problems += [f"entries not run: {sorted(missed)}"] if missed else []
        # A person reads the testbed's lines: the engine's own output goes to the log it names.
        lines = stdout.splitlines()
        if not lines or "own output: " not in lines[0]:
            problems.append("the engine command's first line does not name the log of the engine's own output")
        strays = [line for line in lines if re.match(r"\(a2atb-rank|INFO |WARNING |nanobind|Traceback", line)]
        if strays:
            problems.append(f"the engine's own output reached the terminal: {strays[0][:120]!r}")
        return problems
    return judge


def _step_problems(integration, v: dict) -> list[str]:
    """Whether every engine process of verdict ``v`` stepped every forward, all of them with
    the same DP token counts, and those counts a forward the integration's step rule runs
    (:meth:`testbed.scenario.model.IntegrationRules.engine_passes`: vLLM's idle DP rank
    enters with its 1-token dummy batch, SGLang's with its 0-token idle batch)."""
    steps = {rank: [tuple(step["dp_tokens"]) for step in s] for rank, s in v["steps"].items()}
    if not steps or len({len(s) for s in steps.values()}) != 1 or not next(iter(steps.values())):
        return [f"{v['scenario']}: not every engine process stepped every forward: "
                + ", ".join(f"rank {r} {len(s)} forwards" for r, s in steps.items())]
    forwards = next(iter(steps.values()))
    differ = next((r for r, s in steps.items() if s != forwards), None)
    if differ is not None:
        return [f"{v['scenario']}: rank {differ}'s forwards had other DP token counts than rank "
                f"{next(iter(steps))}'s"]
    # The rule reads a scenario's passes only.
    ruled = integration.engine_passes(SimpleNamespace(passes=tuple(forwards)))
    if tuple(ruled) != tuple(forwards):
        bad = next(c for c, r in zip(forwards + [None], tuple(ruled) + (None,)) if c != r)
        return [f"{v['scenario']}: a forward with DP token counts {bad}, which {integration.name}'s step rule "
                "does not run (an idle DP rank without its dummy batch, or every DP rank idle)"]
    return []


def judge_serve(integration) -> Judge:
    """The serve matrix: every entry passes or reproduces its findings, every engine process
    of every rank recorded rounds and stepped every forward as the integration's step rule
    says (:func:`_step_problems`), and a person reads at most 15 lines per entry, the verdict
    last, none of the engine's own."""
    def judge(data: list, stdout: str) -> list[str]:
        problems = []
        for v in data:
            if not v["passed"]:
                problems.append(f"FAIL {v['scenario']}: {_first_line(v['failures']) or v.get('testbed_error', '')}  "
                                f"reproduce: {v['reproduce']}")
                continue
            if not v["dispatches_per_rank"] or min(v["dispatches_per_rank"].values()) < 1:
                problems.append(f"{v['scenario']}: an engine process recorded no round: {v['dispatches_per_rank']}")
            problems += _step_problems(integration, v)
        return problems + _serve_output_problems(data, stdout)
    return judge


def _serve_output_problems(data: list, stdout: str) -> list[str]:
    problems = []
    lines = stdout.splitlines()
    verdicts = [i for i, line in enumerate(lines) if re.match(r"(PASS|KNOWN|FAIL|ERROR) +\d+/", line)]
    if len(verdicts) != len(data):
        problems.append(f"{len(verdicts)} verdict lines for {len(data)} entries")
    for a, b in zip([1] + [i + 1 for i in verdicts], verdicts):
        if b - a + 1 > 15:
            problems.append(f"{b - a + 1} lines for the entry ending {lines[b][:80]!r} (at most 15)")
    strays = [line for line in lines if re.match(r"\(\w+ pid=|INFO |WARNING |Traceback", line)]
    if strays:
        problems.append(f"the engine's own output reached the terminal: {strays[0][:120]!r}")
    return problems


def judge_history(integration) -> Judge:
    """An engine's whole history: every release of it driven (none refused, none left out),
    and each held to what its matrix, its hunt and its findings' survey wrote, by the judges
    of a release's matrix (:func:`judge_matrix`, on the release's own pin), mutants
    (:func:`judge_mutants`) and findings (:func:`judge_lineage`); a release that took an
    identical earlier release's verdicts is held to them as its own."""
    def judge(data: dict, stdout: str) -> list[str]:
        engine = integration.engine
        installed = engine.release()[0]
        rows = {row["release"]: row for row in data["releases"]}
        problems = [f"{r}: not in the history's rows" for r in engine.history if r not in rows]
        for release, row in rows.items():
            if row["refused"]:
                problems.append(f"{release}: refused: {row['refused']}")
                continue
            source = None if release == installed else release
            flag = f" --{engine.name}-source {source}" if source else ""
            judges = {"matrix": judge_matrix(engine.release(source)[1] or engine.default_pin),
                      "mutants": judge_mutants(engine, source)}
            if integration.findings():
                judges["findings"] = judge_lineage(integration, release)
            kept = Path(row.get("kept") or "")
            for name, judge_one in judges.items():
                out = kept / f"{name}.json"
                if not row.get("kept") or not out.is_file():
                    problems.append(f"{release} {name}: no JSON was kept  reproduce: a2a-testbed history "
                                    f"--integration {engine.name} --release {release}")
                    continue
                found = judge_one(json.loads(out.read_text()), (kept / f"{name}.txt").read_text())
                problems += [f"{release} {name}: {p}" + ("" if "reproduce:" in p else
                                                         f"  (a2a-testbed {'run' if name == 'matrix' else name} "
                                                         f"--integration {engine.name}{flag})") for p in found]
            problems += [f"{release}: {f}" for f in row["failures"] if f.startswith(("REUSE DIFFERS", "mutants did",
                                                                                    "findings did"))]
        return problems + ([] if rows else ["no release ran"])
    return judge


def documented_first() -> dict[str, str]:
    """Per finding, where ``docs/findings.md``'s lineage table says it first appears."""
    rows = re.findall(r"^\| ([A-Z]+-[\w-]+?)(?: \(latent\))? \| ([^|]+?) \|", FINDINGS_DOC.read_text(), re.M)
    return dict(rows)


def judge_lineage(integration, release: str) -> Judge:
    """An engine release's findings survey against ``docs/findings.md``'s lineage table, which
    says where each finding first appears (an engine release, then a FlashInfer release): on
    an earlier engine release it reproduces on no FlashInfer release; on that one, first on
    that FlashInfer release; later ones are not bound. So each release is judged alone, and
    the releases can be surveyed apart; a first appearance on a release the adapter does not
    drive is a problem of the table."""
    def judge(data, stdout: str) -> list[str]:
        from fakes.flashinfer.profiles import release_key
        from testbed.harness import lineage

        label = integration.engine.label
        cells = [lineage.Cell(**c) for c in data]
        driven = {r for r, _ in releases(integration.engine)}
        written = documented_first()
        problems = []
        for finding in dict.fromkeys(c.finding for c in cells):
            hit = lineage.first(cells, finding)
            seen = f"{hit.engine} on FlashInfer {hit.flashinfer}" if hit else "on no FlashInfer release"
            doc = written.get(finding)
            born = re.fullmatch(rf"{re.escape(label)} (\S+) on FlashInfer (\S+)", doc or "")
            if born is None:
                problems.append(f"{finding}: docs/findings.md's lineage table says {doc or 'nothing (no row)'}, not "
                                f"'{label} <release> on FlashInfer <release>'")
            elif born.group(1) not in driven:
                problems.append(f"{finding}: docs/findings.md says it first appears on {label} {born.group(1)}, "
                                f"which the adapter does not drive ({', '.join(sorted(driven, key=release_key))})")
            elif release_key(release) < release_key(born.group(1)) and hit:
                problems.append(f"{finding} reproduces on {seen}, before where docs/findings.md says it first "
                                f"appears ({doc})")
            elif release == born.group(1) and (hit is None or hit.flashinfer != born.group(2)):
                problems.append(f"{finding} first reproduces {seen}; docs/findings.md says {doc}")
        return problems + ([] if cells else ["no cell was surveyed"])
    return judge


# -- running ---------------------------------------------------------------------------------
# The commands whose engine's (or ranks') own output goes to a file (``--log``): beside the
# sweep's log, not left in the temporary folder.
OWN_OUTPUT = ("run", "mutants", "engine", "serve")
END = "\x1ea2a-testbed sweep: command ended "  # + exit code and seconds: a line of the group's stdout


def run(group: list[Sweep], log_dir: str, timeout_s: float = SWEEP_TIMEOUT_S) -> list[Outcome]:
    """Run a group's commands one after another in a process of its own (``timeout_s`` each),
    the whole output to a log file in ``log_dir``, and judge what each wrote."""
    name = group[0].group or group[0].name
    log = Path(log_dir) / f"{_stem(name)}.log"
    outs = [Path(log_dir) / f"{_stem(sweep.name)}.json" for sweep in group]
    argvs = [[*sweep.argv, "--json", str(out)] + (["--keep", str(out.with_suffix(""))] if sweep.keeps else [])
             + (["--log", str(out.with_suffix(".output.log"))] if sweep.argv[0] in OWN_OUTPUT else [])
             for sweep, out in zip(group, outs)]
    limit = sum(max(timeout_s, sweep.least_s) for sweep in group)
    stdout, stderr, finished = call_group(argvs, limit)
    log.write_text("".join(f"$ {sweep.command}\n" for sweep in group) + stdout + "\n-- stderr --\n" + stderr)
    ended = ended_commands(stdout)
    outcomes = []
    for n, (sweep, out) in enumerate(zip(group, outs)):
        outcome = Outcome(sweep, log=str(log))
        outcomes.append(outcome)
        if n >= len(ended):
            outcome.problems.append(f"did not finish in {limit:.0f} s" if not finished and n == len(ended)
                                    else "did not run: its group's process ended before it (see its log)")
            continue
        text, (code, seconds) = ended[n][0], ended[n][1].split()
        outcome.seconds = float(seconds)
        lines = [line for line in text.splitlines() if line.strip()]
        outcome.summary = lines[-1][:160] if lines else ""
        if not out.is_file():
            outcome.problems.append(f"exited {code} without writing its JSON (see {log})")
            continue
        outcome.problems += sweep.judge(json.loads(out.read_text()), text)
        if code != "0" and not outcome.problems:
            outcome.problems.append(f"exited {code} though its JSON shows no problem (see {log})")
    return outcomes


def call_group(argvs: list[list[str]], limit: float) -> tuple[str, str, bool]:
    """``a2a-testbed`` commands ``argvs`` one after another in one process of their own
    (:mod:`testbed.sweep_group`): its stdout, its stderr, and whether it ended within ``limit``."""
    try:
        proc = subprocess.run([sys.executable, "-m", "testbed.sweep_group", json.dumps(argvs)], cwd=ROOT,
                              capture_output=True, text=True, timeout=limit,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        return proc.stdout, proc.stderr, True
    except subprocess.TimeoutExpired as e:
        return _text(e.stdout), _text(e.stderr) or f"error: did not finish in {e.timeout:.0f} s", False


def ended_commands(stdout: str) -> list[tuple[str, str]]:
    """``(a command's stdout, "exit-code seconds")`` of each command of a group that ended."""
    pieces = re.split(rf"^{re.escape(END)}(.*)\n?", stdout, flags=re.M)
    return list(zip(pieces[0:-1:2], pieces[1::2]))


def _stem(name: str) -> str:
    return re.sub(r"[^\w.]+", "-", name)


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def shard(items: list, spec: str) -> list:
    """Items ``I`` of every ``N`` (``spec`` ``"I/N"``, 1 <= I <= N), in order: the groups of
    sweeps one machine of ``N`` runs."""
    m = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard: I/N with 1 <= I <= N, got {spec!r}")
    i, n = int(m.group(1)), int(m.group(2))
    return items[i - 1::n]


def default_log_dir() -> str:
    return tempfile.mkdtemp(prefix="a2atb-sweep-")
