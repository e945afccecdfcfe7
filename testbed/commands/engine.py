"""``a2a-testbed engine``: an engine's own ``LLM`` on a tiny checkpoint, DP + EP on the fake,
judged at the engine level."""

from __future__ import annotations

import contextlib
import dataclasses
import time

from testbed.commands.common import UsageError, each, engine_in_use, integrations, output_arguments, positive, \
    source_arguments

NAME = "engine"


def add_parser(sub) -> None:
    en = sub.add_parser(
        "engine", help="an engine's own LLM (vLLM's) on a tiny checkpoint, DP + EP on the fake, checked (SGLang's: "
                       "its own server, as a2a-testbed serve)",
        description=(
            "Writes a tiny MoE checkpoint (config and random weights as safetensors), runs the engine's own "
            "LLM on the pool's ranks (DP, TP and expert parallel, the FlashInfer all-to-all on the fake), then "
            "the same checkpoint and prompts on one rank with expert parallel off; checks every invariant that "
            "judges the rounds it made, its prompt logprobs against that reference, and prints, per rank and "
            "forward, the token counts its prepare received. With no --dp: the integration's engine matrix."))
    en.add_argument("--integration", choices=integrations().names(), default="vllm",
                    help="whose engine (default: %(default)s)")
    en.add_argument("--dp", type=int, metavar="N", help="data-parallel ranks (each its own engine)")
    en.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel ranks per DP rank (default 1)")
    en.add_argument("--path", default="one_sided", help="the all-to-all: one_sided (default) or two_sided")
    en.add_argument("--arch", default=None, help="the checkpoint: qwen3-moe (default) or deepseek-v2")
    en.add_argument("--model", metavar="NAME",
                    help="a checkpoint at a real model's MoE shape (hidden, experts, top_k, its shared expert and "
                         "scaling) on one layer, in its family's architecture, so the engine's own block of the "
                         "family runs it: qwen3-235b-a22b, qwen3-30b-a3b (qwen3-moe), deepseek-v3, deepseek-r1, "
                         "kimi-k2 (deepseek-v2's block)")
    en.add_argument("--prompts", metavar="LENGTHS", help="per DP rank (space-separated) its prompts' lengths "
                    "(comma-separated; - for none), e.g. '5,11 7'")
    en.add_argument("--max-tokens", metavar="N,N", help="per DP rank, the tokens each of its prompts generates")
    en.add_argument("--dtype", default="float32", help="the model's dtype: float32 (default) or bfloat16")
    en.add_argument("--budget", type=int, default=64, metavar="N", help="max_num_batched_tokens (default 64)")
    en.add_argument("--seed", type=int, default=0, metavar="S", help="the checkpoint's and the prompts' seed")
    en.add_argument("--profile", metavar="RELEASE",
                    help="the fake's FlashInfer release (default: the one the engine's metadata pins)")
    en.add_argument("--mutant", metavar="NAME", help="run against this mutant of the integration's code")
    en.add_argument("--timeout", type=float, default=None, metavar="S", help="per-run watchdog timeout (default 150)")
    en.add_argument("--json", metavar="PATH", help="write the verdicts as JSON")
    output_arguments(en)
    source_arguments(en)


def main(args) -> int:
    from testbed.harness import engine, report, runner
    from testbed.harness.mutants import catalogue
    from testbed.scenario.engine import EngineScenario, parse_prompts
    from testbed.scenario.model import ScenarioInputError, check_release

    integration = integrations().get(args.integration)
    if not integration.has_engine_level() and integration.engine is not None and integration.engine.serving:
        return _served(args)
    if not integration.has_engine_level():
        raise UsageError(f"--integration {args.integration}: has no engine level (engines with one: "
                         + ", ".join(n for n in integrations().names() if integrations().get(n).has_engine_level())
                         + ")")
    positive("--timeout", args.timeout)
    if args.mutant and args.mutant not in {m.name for m in catalogue(args.integration)}:
        raise UsageError(f"--mutant: unknown {args.integration} mutant {args.mutant!r} (a2a-testbed mutants "
                         f"--integration {args.integration} --list)")
    # The flags are judged before the engine is asked for: a malformed flag is refused in its
    # own words whether or not the engine is installed.
    if args.profile is not None:
        try:
            check_release("--profile", args.profile)
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
    if args.dp is None:
        given = [flag for flag in ("prompts", "max_tokens", "model") if getattr(args, flag) is not None]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} goes with --dp (one engine scenario)")
        scenarios = list(integration.engine_matrix())
    else:
        if args.prompts is None or args.max_tokens is None:
            raise UsageError("--dp: give --prompts and --max-tokens too (per DP rank)")
        try:
            if args.model and args.arch:
                raise UsageError("--arch goes without --model (the model's family decides the checkpoint)")
            from testbed.scenario.models import MODELS

            shape = MODELS.get(args.model or "")
            arch = args.arch or (shape.checkpoint_arch if shape and shape.checkpoint_arch else "qwen3-moe")
            scenarios = (EngineScenario(dp=args.dp, tp=args.tp, path=args.path, arch=arch, model=args.model or "",
                                        prompts=parse_prompts(args.prompts),
                                        max_tokens=tuple(int(n) for n in args.max_tokens.split(",")),
                                        integration=args.integration, budget=args.budget, dtype=args.dtype,
                                        seed=args.seed),)
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
        except ValueError:
            raise UsageError(f"--max-tokens: comma-separated integers, one per DP rank, got {args.max_tokens!r}") \
                from None
    with contextlib.ExitStack() as stack:
        # From the engine's first import on (its probes here, then the ranks), its output goes
        # to the log; a refusal still reaches the terminal (sys.stderr stays there).
        terminal = stack.enter_context(engine_in_use(args, args.integration,
                                                      getattr(args, f"{args.integration}_source", None)))
        try:  # the engine's own pin unless the flag says
            scenarios = [dataclasses.replace(es, profile=args.profile or integration.engine.pinned())
                         for es in scenarios]
        except ScenarioInputError as e:
            raise UsageError(str(e)) from None
        started = time.monotonic()
        verdicts = []
        pool = stack.enter_context(runner.scenario_pool())
        run = lambda es: engine.run(pool, es, mutant=args.mutant,  # noqa: E731
                                    timeout_s=args.timeout or engine.DEFAULT_TIMEOUT_S)
        for i, v in each(scenarios, lambda es: es.describe(), run):
            print(engine.verdict_line(i, len(scenarios), v), file=terminal, flush=True)
            print(engine.steps_text(v), file=terminal, flush=True)
            if not v.passed or v.known:
                print(engine.failure_text(v), file=terminal, flush=True)
            verdicts.append(v)
    failed = sum(not v.passed for v in verdicts)
    print(f"{len(verdicts) - failed}/{len(verdicts)} engine scenarios passed"
          f"{f' against mutant {args.mutant}' if args.mutant else ''} in {time.monotonic() - started:.1f} s")
    if args.json:
        report.dump_json(args.json, {"passed": len(verdicts) - failed, "failed": failed,
                                     "seconds": round(time.monotonic() - started, 3),
                                     "verdicts": [engine.as_json(v) for v in verdicts]})
    return 1 if failed else 0


def _served(args) -> int:
    """An engine whose engine level is its own server (SGLang: its schedulers are processes it
    spawns itself, never a rank of the testbed's pool): ``a2a-testbed serve`` of the same
    deployment, judged the same way against a DP 1 run."""
    import argparse

    from testbed.commands import serve

    given = [flag for flag in ("prompts", "max_tokens", "model", "arch") if getattr(args, flag) is not None]
    if given:
        raise UsageError(f"--integration {args.integration}: its engine level is its own server (a2a-testbed serve), "
                         f"driven by concurrent requests (--requests), not --{given[0].replace('_', '-')}")
    served = argparse.Namespace(**vars(args))
    served.requests = 3 if args.dp is None or args.dp <= 3 else args.dp - 1
    served.dtype = "bfloat16" if args.dtype == "float32" else args.dtype  # as models are served
    served.mutants = False
    return serve.main(served)
