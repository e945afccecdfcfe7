"""Campaigns past one machine: a campaign's scenarios (the matrix, the model matrix, one
scenario, the mutant hunts) fanned out over a Ray cluster, each scenario on one machine's rank
pool.

A *host* is a Ray actor that keeps one :func:`testbed.harness.runner.scenario_pool` (the rank
processes of one machine) for the whole campaign and runs what it is handed there, one at a
time: a scenario never spans machines (the fake's NVLink window is one host's ``/dev/shm``).
Hosts are spread over the cluster's nodes, one per node by default. The driver hands each idle
host the next scenario and yields verdicts as they come back; they are judged on the host, by
the same :func:`testbed.harness.runner.run` a local run uses.

Ray is an optional extra (``pip install -e '.[ray]'``): ``"local"`` starts a Ray cluster on this
machine for the campaign and stops it after; any other address joins a running one
(``ray start --head`` on one machine, ``ray start --address HEAD:6379`` on the others, the
testbed installed on each; ``docs/scaling.md``).
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Optional

LOCAL = "local"
OBJECT_STORE_BYTES = 128 << 20  # verdicts are small; leave /dev/shm to the scenarios' windows


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install -e '.[ray]' (an optional extra)") from None
    return ray


@contextlib.contextmanager
def cluster(address: str = LOCAL, hosts: Optional[int] = None):
    """The campaign's hosts on the Ray cluster at ``address`` (``"local"``: one started here for
    the campaign); ``hosts`` actors (default: one per alive node), closed at the end."""
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        try:
            if address == LOCAL:
                ray.init(include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False,
                         configure_logging=False)
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise RayUnavailable(f"--ray {address}: {e}") from None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        count = hosts or len(nodes)
        actors = [_host_class(ray).options(scheduling_strategy="SPREAD").remote() for _ in range(count)]
        try:
            ray.get([a.ready.remote() for a in actors])
            yield Campaign(ray, actors)
        finally:
            with contextlib.suppress(Exception):
                ray.get([a.close.remote() for a in actors], timeout=60)
            for a in actors:
                ray.kill(a)
    finally:
        if started_here:
            ray.shutdown()


class Campaign:
    """Hosts ready to run scenarios; see :func:`cluster`."""

    def __init__(self, ray, actors) -> None:
        self.ray, self.actors = ray, actors

    @property
    def hosts(self) -> int:
        return len(self.actors)

    def nodes(self) -> list[str]:
        """The node each host runs on."""
        return self.ray.get([a.node.remote() for a in self.actors])

    def _fan_out(self, calls: list) -> Iterator[tuple[int, object]]:
        """``(index, result)`` of each ``call(actor)`` as hosts finish, each host given the next
        call as soon as it is idle."""
        pending, queue = {}, list(enumerate(calls))
        for actor in self.actors:
            if queue:
                i, call = queue.pop(0)
                pending[call(actor)] = (i, actor)
        while pending:
            (done,), _ = self.ray.wait(list(pending), num_returns=1)
            i, actor = pending.pop(done)
            if queue:
                j, call = queue.pop(0)
                pending[call(actor)] = (j, actor)
            yield i, self.ray.get(done)

    def run(self, scenarios: Iterable, *, mutant: Optional[str] = None, timeout_s: float) -> Iterator[tuple[int, object]]:
        """``(index, verdict)`` of each scenario, in the order they finish."""
        return self._fan_out([lambda a, sc=sc: a.run.remote(sc, mutant, timeout_s) for sc in scenarios])

    def hunt(self, names: Iterable[str], scenarios: list, *, timeout_s: float,
             hints: Optional[dict] = None) -> Iterator[tuple[int, object]]:
        """``(index, hunt)`` of each mutant, hunted by ``scenarios`` on one host each (first by
        the scenario ``hints`` names for it, :func:`testbed.harness.runner.hunt`'s ``first``)."""
        return self._fan_out([lambda a, n=n: a.hunt.remote(n, scenarios, timeout_s, (hints or {}).get(n))
                              for n in names])


_HOST = None


def _host_class(ray):
    global _HOST
    if _HOST is None:
        class Host:
            """One machine's rank pool, kept for the campaign."""

            def __init__(self) -> None:
                from testbed.harness.runner import scenario_pool

                self._pool_cm = scenario_pool()
                self.pool = self._pool_cm.__enter__()

            def ready(self) -> bool:
                return True

            def node(self) -> str:
                return ray.get_runtime_context().get_node_id()

            def run(self, sc, mutant, timeout_s):
                from testbed.harness import runner

                return runner.run(self.pool, sc, mutant=mutant, timeout_s=timeout_s)

            def hunt(self, name, scenarios, timeout_s, first=None):
                from testbed.harness import runner

                return runner.hunt(self.pool, name, scenarios, timeout_s=timeout_s, first=first)

            def close(self) -> None:
                self._pool_cm.__exit__(None, None, None)

        _HOST = ray.remote(num_cpus=0)(Host)
    return _HOST
