"""SGLang as an integration: the installed SGLang's own ``FlashinferDispatcher``.

Private modules: :mod:`.adapter` (the dispatcher in ``FusedMoE.forward_impl``, Muse Spark's SP
prefill, on a rank), :mod:`.blocks` (SGLang's model MoE blocks, ``--block``),
:mod:`.environment` (the engine: install, probe, preload, and the CPU glue), :mod:`.rules`
(SGLang's start-up rules and what its dispatcher runs), :mod:`.matrix`, :mod:`.fuzz`,
:mod:`.mutants` (of SGLang's own source), :mod:`.findings` (docs/findings.md's SGL-*),
:mod:`.consumer` (the files the consumer contract reads) and :mod:`.preload`.
"""

from __future__ import annotations

from testbed.integrations.base import Integration, Traits
from testbed.integrations.sglang.environment import ENGINE, code


class SglangIntegration(Integration):
    name = "sglang"
    summary = "the installed SGLang's FlashinferDispatcher in its FusedMoE forward"
    engine = ENGINE

    def api(self, sc):
        return "comm" if sc.path == "one_sided" else None  # SGLang's dispatcher builds MoeAlltoAll

    def refusal(self, sc):
        from testbed.integrations.sglang.rules import sglang_rule

        return sglang_rule(sc)

    def traits(self, sc) -> Traits:
        # One MoeAlltoAll per layer at one fixed capacity; the size-keyed cache shares their
        # workspace. SGLang never passes combine's output=.
        return Traits(shared_communication=False, code=code(), fixed_capacity=True, combine_output=False)

    def engine_code(self):
        # Its MoE layers and dispatchers and its distributed layer, as the layer level audits.
        return code()

    def start(self, ctx, sc, api, log):
        from testbed.integrations.sglang.adapter import SglangSession

        return SglangSession(ctx, sc, api, log)

    def matrix(self):
        from testbed.integrations.sglang.matrix import SGLANG_MATRIX

        return SGLANG_MATRIX

    def strategy(self):
        from testbed.integrations.sglang.fuzz import sglang_scenarios

        return sglang_scenarios()

    def mutants(self):
        from testbed.integrations.sglang.mutants import SGLANG_CATALOGUE

        return SGLANG_CATALOGUE

    def findings(self):
        from testbed.integrations.sglang.findings import FINDINGS

        return FINDINGS

    def consumer(self):
        return self.engine.consumer


INTEGRATION = SglangIntegration()
