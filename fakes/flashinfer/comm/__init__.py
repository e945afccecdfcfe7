"""Fake ``flashinfer.comm``: the names vLLM imports from it."""

from fakes.flashinfer.comm.mapping import Mapping
from fakes.flashinfer.comm.mnnvl import CommBackend, MnnvlConfig, MnnvlMemory

__all__ = ["CommBackend", "Mapping", "MnnvlConfig", "MnnvlMemory"]
