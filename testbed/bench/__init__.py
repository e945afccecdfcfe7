"""Benchmarks that print JSON; see ``python -m testbed.bench --help``."""
