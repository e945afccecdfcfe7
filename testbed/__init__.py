"""Machinery that runs ranks: simulated cluster, shared-memory arena, self-check, faults, benchmarks."""

__version__ = "0.1.0"
