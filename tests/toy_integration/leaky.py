"""A state leak planted in the toy integration, as an engine would have one: its session makes
its own EP group (as an engine's parallel state does) and keeps the session it built for
that group, manager and workspaces included, for whoever asks with the same group. On
fresh groups that never happens; where a world's groups are reused, the next scenario runs on
the previous one's session. Registered with ``testbed.integrations.register("toy_integration.leaky")``."""

from __future__ import annotations

from testbed.integrations.impl import INTEGRATION as IMPL
from toy_integration import ToyIntegration

_SESSIONS: dict = {}  # its EP group -> the session built on it: the leak


class LeakyToyIntegration(ToyIntegration):
    name = "toy-leaky"
    summary = "the toy integration with a session kept per process group (a planted leak)"

    def start(self, ctx, sc, api, log):
        import torch.distributed as dist

        from toy_integration.adapter import ToySession

        group = dist.new_group(list(ctx.group_ranks["ep"]))
        ctx.add_cleanup(lambda: dist.destroy_process_group(group))
        if group not in _SESSIONS:
            _SESSIONS[group] = ToySession(IMPL.start(ctx, sc, api, log))
        return _SESSIONS[group]

    def matrix(self):
        from testbed.scenario.model import from_text

        return tuple(from_text("2,1,2,1", stages, tokens, integration=self.name, label=f"toy-leaky: {stages}")
                     for stages, tokens in (("bf16:8", "3,5"), ("bf16:16", "9,12 4,0")))

    def mutants(self):
        return ()


INTEGRATION = LeakyToyIntegration()
