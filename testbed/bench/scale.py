"""Scale: pool start, rendezvous and integration scenarios per EP world size, and memory.

First ``preload_s``: this process's fork server importing torch and the testbed, which the
first pool of a process pays once. Then per world size W, on a fresh
:class:`testbed.cluster.pool.RankPool`: ``start_s`` (W rank processes forked and ready),
``rendezvous_s`` (a scenario that does nothing: the gloo rendezvous and every group of the
layout, which the ranks keep for the next scenarios), ``scenario_s`` (one integration
scenario on EP W, ``4 * W`` experts, top_k 8, an nvfp4 and a bf16 layer, run and checked
against every invariant, as ``a2a-testbed run`` pays for it: the first on these ranks, so it
pays each process's first use of every op), ``ranks_s`` (its ranks' part: from the job's
start to the last rank's result, without the parent's checks), ``warm_scenario_s`` and
``warm_ranks_s`` (medians of ``--repeats`` more, other seeds) and ``rank_uss_mb`` (unique
set size of each rank after them: the memory that is that rank's alone; mean and max over
ranks). ``scaling``: from the smallest to the largest world, the growth of each time over the
growth of the world (1.0 is linear).

Every world gives its ranks the same load: rank ``d`` has ``LOAD[d % 8]`` tokens (a 0-token
rank in every 8), so the per-rank work is the same at every multiple of 8 and what grows with
the world is what the world costs, not the tokens.
"""

from __future__ import annotations

import threading
import time

from testbed.cluster.layout import ParallelLayout
from testbed import integrations
from testbed.harness import runner
from testbed.scenario import footprint
from testbed.scenario.model import MAX_EP_RANKS, Layer, Scenario, ScenarioInputError
from testbed.scenario.models import MODELS

DEFAULT_WORLDS = "8,16,32,64"
MODEL_WORLDS = "8,16,32,72"
MODEL_TOKENS = 16
TIMEOUT_S = 300.0
LOAD = (0, 5, 7, 9, 11, 13, 15, 16)  # tokens per rank, by rank modulo 8; the layers' budget is 16


def add_arguments(parser) -> None:
    parser.add_argument("--worlds", default=None, metavar="W,W,...",
                        help=f"EP world sizes (default: {DEFAULT_WORLDS}; with --model {MODEL_WORLDS})")
    parser.add_argument("--repeats", type=int, default=3, metavar="N",
                        help="warm scenarios per world, after the first (default: %(default)s)")
    parser.add_argument("--model", choices=tuple(MODELS), default=None,
                        help="a real model's shape instead of the toy one: its hidden, top_k and first dispatch "
                             "format, its experts rounded up to a multiple of the world (the redundant experts an "
                             "EPLB deployment adds: DeepSeek-V3's 256 become 288 at EP 72), 16 tokens on every rank; "
                             "FlashInfer 0.7.2 (MoeAlltoAll) up to its 64 ranks, 0.7.4's moe_ep beyond "
                             "(default worlds then 8,16,32,72)")
    parser.add_argument("--integration", choices=integrations.names(), default="impl",
                        help="whose code runs the scenario: impl (default) or the installed vLLM's or SGLang's "
                             "classes (an nvfp4 layer then a bf16 one where the integration runs that without "
                             "a known finding, else two bf16 layers; the fork server imports the engine, in "
                             "preload_s)")


def _nothing(ctx) -> None:
    return None


def uss_mb(pid: int) -> float:
    """Unique set size of ``pid`` in MiB: its private pages, clean and dirty."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Private_Clean", "Private_Dirty"):
                fields[name] = int(rest.split()[0])
    return sum(fields.values()) / 1024


def scenario(world: int, seed: int = 0, integration: str = "impl", model: str | None = None) -> Scenario:
    if model is not None:
        shape = MODELS[model]
        fields = shape.fields() | {"experts": -(-shape.experts // world) * world}
        return Scenario.make(layout=ParallelLayout(world, 1, world, 1), stages=((Layer(shape.formats[0], MODEL_TOKENS),),),
                             passes=((MODEL_TOKENS,) * world,), profile="0.7.2" if world <= MAX_EP_RANKS else "0.7.4",
                             label=f"scale {model}", seed=seed, integration=integration, **fields)
    # An nvfp4 layer then a bf16 one (the workspace grows with the dispatch's bytes) where the
    # integration runs that cleanly, else two bf16 layers: its own rules must take it (SGLang's
    # fixed capacity wants one format for every layer) and no known finding may apply (vLLM's
    # shared communication growing between the layers is FI-RACE): the bench times passing runs.
    from testbed.harness import findings

    for first in ("nvfp4", "bf16"):
        try:
            sc = Scenario.make(layout=ParallelLayout(world, 1, world, 1), experts=4 * world, top_k=8,
                               stages=((Layer(first, 16), Layer("bf16", 16)),),
                               passes=(tuple(LOAD[d % len(LOAD)] for d in range(world)),), label="scale",
                               seed=seed, integration=integration)
        except ScenarioInputError:
            if first == "bf16":
                raise
            continue
        if not findings.known(sc) or first == "bf16":
            return sc


def peak_rss_mb(pid: int) -> float:
    """Peak resident set of ``pid`` in MiB (``VmHWM``: its shared pages included)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


class MemorySampler:
    """The machine's memory in use at its peak while it runs, above what was in use when it
    started (``MemAvailable`` every 20 ms): what the scenarios took, all processes and
    ``/dev/shm`` together."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.base = self.lowest = footprint.Machine.here().memory
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.lowest = min(self.lowest, footprint.Machine.here().memory)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return round((self.base - self.lowest) / (1 << 20), 1)


def measure(world: int, repeats: int, integration: str = "impl", model: str | None = None) -> dict:
    first = scenario(world, 0, integration, model)
    started = time.perf_counter()
    with MemorySampler() as sampler, runner.scenario_pool() as pool:
        pool.start(world)
        start_s = time.perf_counter() - started
        started = time.perf_counter()
        pool.run(_nothing, ParallelLayout(world, 1, world, 1), timeout_s=TIMEOUT_S)  # the scenarios' world
        rendezvous_s = time.perf_counter() - started
        runs = []
        for seed in range(1 + repeats):
            started = time.perf_counter()
            verdict = runner.run(pool, scenario(world, seed, integration, model), timeout_s=TIMEOUT_S)
            runs.append((time.perf_counter() - started, verdict))
        uss = [uss_mb(pid) for pid in pool.worker_pids]
        peak = [peak_rss_mb(pid) for pid in pool.worker_pids]
    failed = [v.failures for _, v in runs if not v.passed]
    if failed or any(v.known for _, v in runs):
        failed = failed or [v.known_failures for _, v in runs if v.known]
        raise RuntimeError(f"the scale scenario failed at world {world}: {failed[0]}")
    return {"world": world, "start_s": round(start_s, 3), "rendezvous_s": round(rendezvous_s, 3),
            "scenario_s": round(runs[0][0], 3), "ranks_s": round(runs[0][1].seconds, 3),
            "warm_scenario_s": _median([s for s, _ in runs[1:]]),
            "warm_ranks_s": _median([v.seconds for _, v in runs[1:]]),
            "rank_uss_mb": round(sum(uss) / len(uss), 1), "rank_uss_mb_max": round(max(uss), 1),
            "rank_peak_rss_mb_max": round(max(peak), 1), "machine_peak_mb": sampler.peak_mb,
            "workspace_bytes_per_rank": max((b for stage in runs[0][1].builds for _, b in stage), default=0),
            "profile": first.profile, "experts": first.experts,
            "estimate": footprint.estimate(first).as_dict()}


def _median(values: list[float]) -> float | None:
    return round(sorted(values)[len(values) // 2], 3) if values else None


def scaling(worlds: list[dict]) -> dict:
    """From the smallest to the largest world: each time's growth over the world's."""
    small, large = min(worlds, key=lambda w: w["world"]), max(worlds, key=lambda w: w["world"])
    grow = large["world"] / small["world"]
    out = {"from": small["world"], "to": large["world"]}
    for key in ("start_s", "rendezvous_s", "scenario_s", "ranks_s", "warm_scenario_s", "warm_ranks_s"):
        if small[key] and large[key] is not None:
            out[key] = round(large[key] / small[key] / grow, 2)
    return out


def run(args) -> dict:
    try:
        worlds = [int(w) for w in (args.worlds or (MODEL_WORLDS if args.model else DEFAULT_WORLDS)).split(",")]
    except ValueError:
        raise SystemExit(f"--worlds: comma-separated integers, got {args.worlds!r}") from None
    if not worlds or min(worlds) < 1:
        raise SystemExit(f"--worlds: world sizes must be >= 1, got {args.worlds!r}")
    if args.repeats < 0:
        raise SystemExit(f"--repeats: must be >= 0, got {args.repeats}")
    engine = integrations.get(args.integration).engine
    if engine is not None:
        why = engine.use()  # before the first fork server starts
        if why:
            raise SystemExit(why)
    started = time.perf_counter()
    with runner.scenario_pool() as pool:
        pool.start(1)
    preload_s = time.perf_counter() - started
    measured = [measure(w, args.repeats, args.integration, args.model) for w in worlds]
    return {"bench": "scale", "integration": args.integration, "model": args.model, "preload_s": round(preload_s, 2),
            "worlds": measured, "scaling": scaling(measured)}
