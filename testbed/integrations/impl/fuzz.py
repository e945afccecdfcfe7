"""The scenarios ``a2a-testbed fuzz`` draws for impl: Hypothesis over the whole scenario model.

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

from hypothesis import strategies as st

from fakes.flashinfer.profiles import PROFILES as FAKE_PROFILES
from testbed.scenario.model import (
    COMBINE_SIGNATURES,
    FORMATS,
    INVALID_EXPERT_IDS,
    PROFILES,
    ROUTER_ID_DTYPES,
    ROUTINGS,
    SLOT_ORDERS,
    SUPPORTED_TOP_K,
    TRTLLM_FORMATS,
    TRTLLM_HIDDEN_BLOCK,
    Layer,
    Scenario,
    ScenarioInputError,
    api_for,
    available_apis,
    hidden_rule,
    pair_routing,
)
from testbed.scenario.strategies import LAYOUTS, MAX_BUDGET, dp_counts, mx_alignments


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
    divisible = path == "two_sided" or FAKE_PROFILES[profile].experts_divisible or on_moe_ep
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
    counts = dp_counts(layout.dp, biggest)
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
        expert_kernel=draw(st.sampled_from(("trtllm", "trtllm-packed") if pair_routing(profile)
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
