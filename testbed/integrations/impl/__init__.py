"""``impl``, this project's reference integration (``impl/``), as the harness sees it.

Private modules: :mod:`.adapter` (its session and layers on a rank), :mod:`.mutants` (its
catalogue), :mod:`.fuzz` (the strategy over the whole scenario model), :mod:`.cases` and
:mod:`.fake_ep` (one-layer rank programs over ``impl`` for unit tests, ``gpu_tests`` and the
benchmarks). Its matrix is the harness's common one.
"""

from __future__ import annotations

import os
from pathlib import Path

import impl
from testbed.integrations.base import Integration, Traits

# What counts as impl's code in a call site: (real path prefix, name shown).
CODE = ((os.path.realpath(Path(impl.__file__).parent) + os.sep, "impl/"),)


class ImplIntegration(Integration):
    name = "impl"
    summary = "this project's reference integration"

    def traits(self, sc) -> Traits:
        # impl's moe_ep manager keeps one communication per layer sizing.
        return Traits(shared_communication=False, code=CODE)

    def start(self, ctx, sc, api, log):
        from testbed.integrations.impl.adapter import ImplSession

        return ImplSession(ctx, sc, api, log)

    def strategy(self):
        from testbed.integrations.impl.fuzz import scenarios

        return scenarios()

    def mutants(self):
        from testbed.integrations.impl.mutants import CATALOGUE

        return CATALOGUE


INTEGRATION = ImplIntegration()
