"""Scenarios: seconds per scenario of the integration matrix and of drawn fuzz scenarios.

The goals of the scenario side live here, not in timed tests: the matrix under 60 s on 2
cores (``matrix_s``), and what a fuzz example and a mutant cost on average, which sets how
many fit in the CPU suite and in ``a2a-testbed mutants``' 10 minutes.
"""

from __future__ import annotations

import time

from testbed.cluster.pool import RankPool
from testbed.integrations.impl.fuzz import scenarios
from testbed.harness import runner
from testbed.harness.fuzz import fuzz
from testbed.harness.matrix import MATRIX


def add_arguments(parser) -> None:
    parser.add_argument("--matrix", type=int, default=len(MATRIX), metavar="N",
                        help="the first N matrix scenarios (default: all %(default)s)")
    parser.add_argument("--fuzz-examples", type=int, default=20, metavar="N",
                        help="derandomized fuzz scenarios to time (default: %(default)s)")


def run(args) -> dict:
    started = time.monotonic()
    with RankPool() as pool:
        runner.run(pool, MATRIX[0])  # start the rank processes outside the figures
        startup = time.monotonic() - started
        began = time.monotonic()
        verdicts = [runner.run(pool, sc) for sc in MATRIX[:args.matrix]]
        matrix_s = time.monotonic() - began
        drawn = []
        began = time.monotonic()
        fuzz(lambda sc: drawn.append(runner.run(pool, sc)) or drawn[-1], examples=args.fuzz_examples,
             strategy=scenarios())
        fuzz_s = time.monotonic() - began
    return {
        "bench": "scenarios", "matrix_scenarios": len(verdicts), "matrix_passed": sum(v.passed for v in verdicts),
        "matrix_s": round(matrix_s, 3), "matrix_max_scenario_s": round(max(v.seconds for v in verdicts), 3),
        "fuzz_examples": len(drawn), "fuzz_s_per_example": round(fuzz_s / max(len(drawn), 1), 3),
        "pool_startup_s": round(startup, 3),
    }
