"""The scenarios ``a2a-testbed fuzz --integration sglang`` draws."""

from __future__ import annotations


from hypothesis import strategies as st

from fakes.flashinfer.profiles import PROFILES as FAKE_PROFILES
from testbed.integrations.sglang.rules import (
    SGLANG_BLOCK_RUNNERS,
    SGLANG_FORMATS,
    SGLANG_RUNNER_CHOICES,
    SGLANG_SP_TP,
)
from testbed.cluster.layout import ParallelLayout
from testbed.scenario.model import (
    ROUTER_ID_DTYPES,
    ROUTINGS,
    SLOT_ORDERS,
    Layer,
    Scenario,
    ScenarioInputError,
    hidden_rule,
)
from testbed.scenario.strategies import LAYOUTS, MAX_BUDGET, dp_counts


@st.composite
def sglang_scenarios(draw) -> Scenario:
    """Scenarios ``--integration sglang`` runs: SGLang's dispatcher on MoeAlltoAll (its pin,
    0.7.2) at one capacity, in the two deployments SGLang starts it in: DP attention (each rank
    its own tokens; bf16 or nvfp4 dispatch; each MoE runner's sentinel and combine region) or
    Muse Spark's TP4/TP8 SP prefill (each rank a slice of the same rows); under DP attention in bf16,
    the layers the MoE layer alone or one of SGLang's model blocks."""
    sp = draw(st.booleans())
    layout = draw(st.sampled_from([ParallelLayout(w, w, 1, 1) for w in SGLANG_SP_TP] if sp else
                                  [lay for lay in LAYOUTS if lay.pp == 1 and lay.tp == 1]))
    ep = layout.ep_size
    experts = draw(st.sampled_from([n for n in range(ep, 33) if n % ep == 0]))
    top_k = draw(st.sampled_from([k for k in FAKE_PROFILES["0.7.2"].top_k_kernels if k <= experts]))
    sentinel, output = ("-1", "separate") if sp else draw(st.sampled_from(SGLANG_RUNNER_CHOICES))
    fmt = "bf16" if sp else draw(st.sampled_from(SGLANG_FORMATS))
    hidden = draw(st.sampled_from([h for h in (64, 128, 256, 512) if not hidden_rule(fmt, h, "one_sided")]))
    if sp:  # every rank holds the prefill's rows, a multiple of tp (the testbed models no padding rows)
        budget = layout.tp * draw(st.integers(1, MAX_BUDGET // layout.tp))
        counts = st.integers(1, budget // layout.tp).map(lambda n: (n * layout.tp,))
    else:  # SGLang runs no forward where no DP rank has a token: every pass has one somewhere
        budget = draw(st.integers(1, MAX_BUDGET))
        counts = dp_counts(layout.dp, budget).filter(any)
    stages = (tuple(Layer(fmt, budget) for _ in range(draw(st.integers(1, 3)))),)
    # SGLang's own model blocks, where they run (DP attention, an unquantized checkpoint's runners and
    # dispatch); OLMoE's and PhiMoE's are findings (SGL-004, SGL-005), not drawn.
    unquantized = not sp and fmt == "bf16" and (sentinel, output) in SGLANG_BLOCK_RUNNERS
    block = draw(st.sampled_from(("", "qwen3_moe", "deepseek_v2", "gpt_oss"))) if unquantized else ""
    shared = block == "deepseek_v2"
    scaling = draw(st.sampled_from((1.0, 2.5))) if shared else 1.0
    try:
        return Scenario.make(layout=layout, stages=stages, passes=tuple(draw(st.lists(counts, min_size=1, max_size=3))),
                             experts=experts, top_k=top_k, hidden=hidden, routing=draw(st.sampled_from(ROUTINGS)),
                             slot_order=draw(st.sampled_from(SLOT_ORDERS)), seed=draw(st.integers(0, 2 ** 16)),
                             router_ids=draw(st.sampled_from(ROUTER_ID_DTYPES)), invalid_expert_id=sentinel,
                             expert_output=output, sp_prefill=sp, block=block, shared_experts=shared,
                             routed_scaling=scaling, integration="sglang", label="fuzz sglang")
    except ScenarioInputError as e:
        raise AssertionError(f"the SGLang scenario strategy drew an invalid scenario: {e}") from e
