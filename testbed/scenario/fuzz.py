"""Hypothesis strategies over the scenario model, and the fuzz loop of ``a2a-testbed fuzz``.

Layouts up to 8 ranks (TP 1/2/4, PP 1/2/4, PP with TP > 1), every path (both all-to-alls,
all-gather/reduce-scatter, expert parallel off), every profile, mixed formats and budgets per
layer, uneven and 0-token passes (also all-zero ones), counts that grow past earlier ones,
top_k from the kernels' set, every routing pattern, combine signature and slot order;
sequence parallel, deferred finalize, shared experts, routed scaling, the TRT-LLM kernels,
workspace-resident expert output and the expert-id sentinel wherever they apply; router ids
in int32 or int64, mxfp8 scale paddings (``mx_alignment``); both
FlashInfer APIs (``comm`` and ``moe_ep``) where the release has them. Scenarios the kernels
cannot run are never drawn: each choice is
made from what the earlier ones allow (and :meth:`Scenario.validate` still checks them).
"""

from __future__ import annotations

import math
from typing import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hyp_seed
from hypothesis import strategies as st

from fakes.flashinfer.profiles import PROFILES as FAKE_PROFILES
from testbed.cluster.layout import ParallelLayout
from testbed.scenario.model import (
    COMBINE_SIGNATURES,
    FORMATS,
    INVALID_EXPERT_IDS,
    PAIR_ROUTING_PROFILES,
    PROFILES,
    ROUTER_ID_DTYPES,
    ROUTINGS,
    SGLANG_FORMATS,
    SGLANG_RUNNER_CHOICES,
    SGLANG_SP_TP,
    SLOT_ORDERS,
    SUPPORTED_TOP_K,
    TRTLLM_FORMATS,
    TRTLLM_HIDDEN_BLOCK,
    VLLM_FORMATS,
    Layer,
    Scenario,
    ScenarioInputError,
    api_for,
    available_apis,
    hidden_rule,
)

LAYOUTS = tuple(ParallelLayout(tp * dp * pp, tp, dp, pp)
                for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in (1, 2, 4) if 2 <= tp * dp * pp <= 8)
MAX_BUDGET = 24


@st.composite
def scenarios(draw) -> Scenario:
    layout = draw(st.sampled_from(LAYOUTS))
    ep = layout.ep_size
    paths = ("one_sided", "allgather_reducescatter") + (("two_sided",) if ep >= 2 else ()) \
        + (("none",) if layout.dp == 1 else ())
    path = draw(st.sampled_from(paths))
    if path == "none":
        ep = 1
    profile = draw(st.sampled_from(PROFILES))
    flashinfer = path in ("one_sided", "two_sided")
    a2a_api = draw(st.sampled_from(("auto",) + available_apis(path, profile))) if flashinfer else "auto"
    on_moe_ep = api_for(path, profile, a2a_api) == "moe_ep"
    divisible = path == "two_sided" or profile in ("0.6.8", "0.6.14") or on_moe_ep
    unit = math.lcm(4, ep) if path == "two_sided" else ep
    experts = draw(st.sampled_from([n for n in range(max(ep, 2), 33) if n % (unit if divisible else 1) == 0]))
    formats = draw(st.lists(st.sampled_from(FORMATS), min_size=1, max_size=3))
    hidden = draw(st.sampled_from([h for h in (64, 96, 128, 256, 512)
                                   if not any(hidden_rule(f, h, path) for f in formats)]))
    trtllm = set(formats) <= set(TRTLLM_FORMATS) and hidden % TRTLLM_HIDDEN_BLOCK == 0 and draw(st.booleans())
    stages = []
    for _ in range(layout.pp):
        n = draw(st.integers(1, 3))
        stages.append(tuple(Layer(draw(st.sampled_from(formats)), draw(st.integers(1, MAX_BUDGET)))
                            for _ in range(n)))
    biggest = max(ly.max_num_tokens for stage in stages for ly in stage)
    counts = st.lists(st.integers(0, biggest), min_size=layout.dp, max_size=layout.dp).map(tuple)
    passes = tuple(draw(st.lists(counts, min_size=1, max_size=3)))
    routing = draw(st.sampled_from(ROUTINGS))
    kernels = FAKE_PROFILES[profile].top_k_kernels if path == "one_sided" else SUPPORTED_TOP_K
    top_k = draw(st.sampled_from([k for k in SUPPORTED_TOP_K if k in kernels
                                  and (k <= experts or routing in ("hotspot", "one-expert") and not trtllm
                                       and not on_moe_ep)]))
    signature = draw(st.sampled_from(COMBINE_SIGNATURES)) if path == "one_sided" and not on_moe_ep else "release"
    sp_ok = path in ("one_sided", "allgather_reducescatter") and layout.tp > 1 and layout.dp > 1
    one_sided = path == "one_sided"
    features = dict(
        sequence_parallel=sp_ok and draw(st.booleans()),
        defer_finalize=path == "none" and draw(st.booleans()),
        shared_experts=hidden % layout.tp == 0 and draw(st.booleans()),
        routed_scaling=draw(st.sampled_from((1.0, 2.5, 0.5))),
        expert_kernel=draw(st.sampled_from(("trtllm", "trtllm-packed") if profile in PAIR_ROUTING_PROFILES
                                           else ("trtllm-packed",))) if trtllm else "reference",
        expert_output="workspace" if one_sided and signature == "release" and draw(st.booleans()) else "separate",
        invalid_expert_id=draw(st.sampled_from(INVALID_EXPERT_IDS)) if one_sided else "-1",
        router_ids=draw(st.sampled_from(ROUTER_ID_DTYPES)),
        mx_alignment=draw(mx_alignments(formats, hidden, path)),
    )
    try:
        return Scenario.make(layout=layout, stages=tuple(stages), passes=passes, path=path, profile=profile,
                             experts=experts, top_k=top_k, hidden=hidden, routing=routing,
                             combine_signature=signature, slot_order=draw(st.sampled_from(SLOT_ORDERS)),
                             seed=draw(st.integers(0, 2 ** 16)),
                             router_weight_on_input=top_k == 1 and draw(st.booleans()), label="fuzz",
                             a2a_api=a2a_api, **features)
    except ScenarioInputError as e:  # the strategy drew something it should not have
        raise AssertionError(f"the scenario strategy drew an invalid scenario: {e}") from e


VLLM_LAYOUTS = tuple(lay for lay in LAYOUTS if lay.dp >= 2)
MX_ALIGNMENTS = (0, 32, 64, 128, 256, 512)


def mx_alignments(formats, hidden: int, path: str):
    """The mxfp8 scale paddings a scenario of these layers can run (0 where none is mxfp8)."""
    if "mxfp8" not in formats:
        return st.just(0)
    return st.sampled_from([a for a in MX_ALIGNMENTS if not hidden_rule("mxfp8", hidden, path, a)])


@st.composite
def vllm_scenarios(draw) -> Scenario:
    """Scenarios ``--integration vllm`` runs: vLLM's one- or two-sided backend on its pinned
    FlashInfer or 0.7.4, the formats vLLM quantizes on the CPU, one budget per model."""
    layout = draw(st.sampled_from(VLLM_LAYOUTS))
    ep = layout.ep_size
    path = draw(st.sampled_from(("one_sided", "two_sided")))
    profile = draw(st.sampled_from(("0.7.2", "0.7.4")))
    unit = math.lcm(4, ep) if path == "two_sided" else ep  # moe_ep and MnnvlMoe: experts divisible by EP
    experts = draw(st.sampled_from([n for n in range(ep, 33) if n % unit == 0]))
    formats = draw(st.lists(st.sampled_from(VLLM_FORMATS), min_size=1, max_size=2))
    hidden = draw(st.sampled_from([h for h in (64, 128, 256, 512) if not any(hidden_rule(f, h, path) for f in formats)]))
    budget = draw(st.integers(1, MAX_BUDGET))
    stages = tuple(tuple(Layer(draw(st.sampled_from(formats)), budget) for _ in range(draw(st.integers(1, 3))))
                   for _ in range(layout.pp))
    counts = st.lists(st.integers(0, budget), min_size=layout.dp, max_size=layout.dp).map(tuple)
    routing = draw(st.sampled_from(ROUTINGS))
    kernels = FAKE_PROFILES[profile].top_k_kernels if path == "one_sided" else SUPPORTED_TOP_K
    top_k = draw(st.sampled_from([k for k in SUPPORTED_TOP_K if k in kernels  # moe_ep one-sided: k <= experts
                                  and (k <= experts or routing in ("hotspot", "one-expert") and path == "two_sided")]))
    try:
        return Scenario.make(layout=layout, stages=stages, passes=tuple(draw(st.lists(counts, min_size=1, max_size=3))),
                             path=path, profile=profile, experts=experts, top_k=top_k, hidden=hidden,
                             routing=routing, slot_order=draw(st.sampled_from(SLOT_ORDERS)),
                             seed=draw(st.integers(0, 2 ** 16)), router_weight_on_input=top_k == 1 and draw(st.booleans()),
                             router_ids=draw(st.sampled_from(ROUTER_ID_DTYPES)),
                             mx_alignment=draw(mx_alignments(formats, hidden, path)), integration="vllm",
                             label="fuzz vllm")
    except ScenarioInputError as e:
        raise AssertionError(f"the vLLM scenario strategy drew an invalid scenario: {e}") from e


def strategy(integration: str):
    """The scenarios ``a2a-testbed fuzz --integration`` draws."""
    return {"impl": scenarios, "vllm": vllm_scenarios, "sglang": sglang_scenarios}[integration]()


@st.composite
def sglang_scenarios(draw) -> Scenario:
    """Scenarios ``--integration sglang`` runs: SGLang's dispatcher on MoeAlltoAll (its pin,
    0.7.2) at one capacity, in the two deployments SGLang starts it in: DP attention (each rank
    its own tokens; bf16 or nvfp4 dispatch; each MoE runner's sentinel and combine region) or
    Muse Spark's TP4/TP8 SP prefill (each rank a slice of the same rows)."""
    sp = draw(st.booleans())
    layout = draw(st.sampled_from([ParallelLayout(w, w, 1, 1) for w in SGLANG_SP_TP] if sp else
                                  [lay for lay in LAYOUTS if lay.pp == 1 and lay.tp == 1]))
    ep = layout.ep_size
    experts = draw(st.sampled_from([n for n in range(ep, 33) if n % ep == 0]))
    top_k = draw(st.sampled_from([k for k in FAKE_PROFILES["0.7.2"].top_k_kernels if k <= experts]))
    sentinel, output = ("-1", "separate") if sp else draw(st.sampled_from(SGLANG_RUNNER_CHOICES))
    fmt = "bf16" if sp or output == "workspace" else draw(st.sampled_from(SGLANG_FORMATS))
    hidden = draw(st.sampled_from([h for h in (64, 128, 256, 512) if not hidden_rule(fmt, h, "one_sided")]))
    if sp:  # every rank holds the prefill's rows, a multiple of tp (the testbed models no padding rows)
        budget = layout.tp * draw(st.integers(1, MAX_BUDGET // layout.tp))
        counts = st.integers(1, budget // layout.tp).map(lambda n: (n * layout.tp,))
    else:  # SGLang runs no forward where no DP rank has a token: every pass has one somewhere
        budget = draw(st.integers(1, MAX_BUDGET))
        counts = st.lists(st.integers(0, budget), min_size=layout.dp, max_size=layout.dp).filter(any).map(tuple)
    stages = (tuple(Layer(fmt, budget) for _ in range(draw(st.integers(1, 3)))),)
    try:
        return Scenario.make(layout=layout, stages=stages, passes=tuple(draw(st.lists(counts, min_size=1, max_size=3))),
                             experts=experts, top_k=top_k, hidden=hidden, routing=draw(st.sampled_from(ROUTINGS)),
                             slot_order=draw(st.sampled_from(SLOT_ORDERS)), seed=draw(st.integers(0, 2 ** 16)),
                             router_ids=draw(st.sampled_from(ROUTER_ID_DTYPES)), invalid_expert_id=sentinel,
                             expert_output=output, sp_prefill=sp, integration="sglang", label="fuzz sglang")
    except ScenarioInputError as e:
        raise AssertionError(f"the SGLang scenario strategy drew an invalid scenario: {e}") from e


class ScenarioFailed(AssertionError):
    def __init__(self, verdict):
        self.verdict = verdict
        super().__init__(f"{verdict.scenario.to_cli()}\n"
                         + "\n".join(f"[{f.invariant}] {f.evidence[:300]}" for f in verdict.failures))


def fuzz(check: Callable[[Scenario], object], *, examples: int, seed: int | None = None,
         strategy=None) -> None:
    """Run ``check(scenario)`` (which returns a :class:`Verdict`) on ``examples`` drawn
    scenarios; a failing one is shrunk and raised as :class:`ScenarioFailed`. With ``seed``
    None the draw is derandomized (the same scenarios every time)."""

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(strategy if strategy is not None else scenarios())
    def prop(sc: Scenario) -> None:
        verdict = check(sc)
        if not verdict.passed:
            raise ScenarioFailed(verdict)

    if seed is not None:
        prop = hyp_seed(seed)(prop)
    prop()
