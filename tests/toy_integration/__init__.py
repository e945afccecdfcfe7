"""A test's integration, added the way an engine is: one package whose face is its
``INTEGRATION``, registered with one line (``testbed.integrations.register("toy_integration")``).
It drives impl's layers through a wrapper of its own (:mod:`.adapter`), runs one-sided only,
and has one mutant of its own code."""

from __future__ import annotations

import os

from hypothesis import strategies as st

from testbed.integrations.base import Integration, Mutant, Traits
from testbed.integrations.impl import CODE as IMPL_CODE
from testbed.integrations.impl import INTEGRATION as IMPL

HERE = os.path.realpath(os.path.dirname(__file__)) + os.sep


class ToyIntegration(Integration):
    name = "toy"
    summary = "a test's integration: impl's layers behind a wrapper of its own"

    def refusal(self, sc):
        if sc.path != "one_sided":
            return "--path", "the toy integration drives one_sided only"
        return super().refusal(sc)

    def traits(self, sc) -> Traits:
        impl = IMPL.traits(sc)
        return Traits(impl.shared_communication, ((HERE, "toy/"),) + IMPL_CODE)

    def start(self, ctx, sc, api, log):
        from toy_integration.adapter import ToySession

        return ToySession(IMPL.start(ctx, sc, api, log))

    def matrix(self):
        from testbed.scenario.model import from_text

        return (from_text("2,1,2,1", "bf16:8,nvfp4:8", "3,5 0,2", integration="toy", label="toy: two layers"),)

    def strategy(self):
        return st.sampled_from(self.matrix())

    def mutants(self):
        return (Mutant("toy-output-doubled", "the toy's layer hands back twice its output",
                       "toy_integration.adapter:ToyLayer.__call__", "return out_TH", "return out_TH * 2",
                       (("output", "x the tolerance"),)),)


INTEGRATION = ToyIntegration()
