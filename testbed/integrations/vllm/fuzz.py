"""The scenarios ``a2a-testbed fuzz --integration vllm`` draws."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from fakes.flashinfer.profiles import PROFILES as FAKE_PROFILES
from testbed.integrations.vllm.rules import VLLM_FORMATS, sequence_parallel
from testbed.scenario.model import (
    ROUTER_ID_DTYPES,
    ROUTINGS,
    SLOT_ORDERS,
    SUPPORTED_TOP_K,
    Layer,
    Scenario,
    ScenarioInputError,
    hidden_rule,
)
from testbed.scenario.strategies import LAYOUTS, MAX_BUDGET, dp_counts, mx_alignments


VLLM_LAYOUTS = tuple(lay for lay in LAYOUTS if lay.dp >= 2)


@st.composite
def vllm_scenarios(draw) -> Scenario:
    """Scenarios ``--integration vllm`` runs: vLLM's one- or two-sided backend on its pinned
    FlashInfer or 0.7.4, mostly at the layer level (sequence parallel where vLLM turns it on,
    shared experts, routed scaling), sometimes the seam alone (any router id dtype, mxfp8 scale
    alignment), the formats each level quantizes on the CPU, one budget per model, on the
    passes vLLM's engine makes."""
    layout = draw(st.sampled_from(VLLM_LAYOUTS))
    level = draw(st.sampled_from(("layer", "layer", "kernel")))
    ep = layout.ep_size
    path = draw(st.sampled_from(("one_sided", "two_sided")))
    profile = draw(st.sampled_from(("0.7.2", "0.7.4")))
    unit = math.lcm(4, ep) if path == "two_sided" else ep  # moe_ep and MnnvlMoe: experts divisible by EP
    experts = draw(st.sampled_from([n for n in range(ep, 33) if n % unit == 0]))
    formats = draw(st.lists(st.sampled_from(VLLM_FORMATS[level]), min_size=1, max_size=2))
    hidden = draw(st.sampled_from([h for h in (64, 128, 256, 512) if not any(hidden_rule(f, h, path) for f in formats)]))
    budget = draw(st.integers(1, MAX_BUDGET))
    stages = tuple(tuple(Layer(draw(st.sampled_from(formats)), budget) for _ in range(draw(st.integers(1, 3))))
                   for _ in range(layout.pp))
    counts = dp_counts(layout.dp, budget)
    routing = draw(st.sampled_from(ROUTINGS))
    kernels = FAKE_PROFILES[profile].top_k_kernels if path == "one_sided" else SUPPORTED_TOP_K
    top_k = draw(st.sampled_from([k for k in SUPPORTED_TOP_K if k in kernels  # moe_ep one-sided: k <= experts
                                  and (k <= experts or routing in ("hotspot", "one-expert") and path == "two_sided")]))
    passes = draw(st.lists(counts, min_size=1, max_size=3))
    if not any(map(any, passes)):  # vLLM's engine runs no step where every DP rank is idle
        passes[0] = (1,) + passes[0][1:]
    layer = level == "layer"
    sp = layer and sequence_parallel(path, layout)
    shared = layer and draw(st.booleans()) and (sp or hidden % layout.tp == 0)
    try:
        return Scenario.make(layout=layout, stages=stages, passes=tuple(passes), level=level,
                             sequence_parallel=sp, shared_experts=shared,
                             routed_scaling=draw(st.sampled_from((1.0, 2.5))) if layer else 1.0,
                             path=path, profile=profile, experts=experts, top_k=top_k, hidden=hidden,
                             routing=routing, slot_order=draw(st.sampled_from(SLOT_ORDERS)),
                             seed=draw(st.integers(0, 2 ** 16)), router_weight_on_input=top_k == 1 and draw(st.booleans()),
                             router_ids="int32" if layer else draw(st.sampled_from(ROUTER_ID_DTYPES)),
                             mx_alignment=0 if layer else draw(mx_alignments(formats, hidden, path)),
                             integration="vllm",
                             label="fuzz vllm")
    except ScenarioInputError as e:
        raise AssertionError(f"the vLLM scenario strategy drew an invalid scenario: {e}") from e
