"""The testbed: the simulated cluster (``testbed.cluster``) and the scenario side
(``testbed.scenario``), the command-line runner and the benchmarks."""

__version__ = "0.1.0"
