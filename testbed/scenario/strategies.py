"""Hypothesis building blocks the integrations' scenario strategies share: the layouts drawn,
the largest token budget, the mxfp8 scale paddings a scenario can run."""

from __future__ import annotations

from hypothesis import strategies as st

from testbed.cluster.layout import ParallelLayout
from testbed.scenario.model import hidden_rule

LAYOUTS = tuple(ParallelLayout(tp * dp * pp, tp, dp, pp)
                for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in (1, 2, 4) if 2 <= tp * dp * pp <= 8)


MAX_BUDGET = 24


MX_ALIGNMENTS = (0, 32, 64, 128, 256, 512)


def mx_alignments(formats, hidden: int, path: str):
    """The mxfp8 scale paddings a scenario of these layers can run (0 where none is mxfp8)."""
    if "mxfp8" not in formats:
        return st.just(0)
    return st.sampled_from([a for a in MX_ALIGNMENTS if not hidden_rule("mxfp8", hidden, path, a)])


def dp_counts(dp: int, budget: int):
    """Each DP rank's tokens of one forward, 0 .. ``budget``; half the draws put one rank at
    exactly the budget, the boundary where a workspace sized for fewer bytes than a full round
    (a format's scales, its alignment padding) overruns."""
    counts = st.lists(st.integers(0, budget), min_size=dp, max_size=dp).map(tuple)
    at_budget = st.tuples(counts, st.integers(0, dp - 1)).map(lambda c: c[0][:c[1]] + (budget,) + c[0][c[1] + 1:])
    return st.one_of(counts, at_budget)
