"""The process groups a scenario's code creates, kept for the next scenario of the same world.

An engine builds its parallel state per scenario: vLLM's ``initialize_model_parallel`` and
SGLang's make a CPU and a device group per TP, PP, DP and EP group (both gloo on a CPU), and
destroy them all at the end. Creating a gloo group is a rendezvous through the world's store
and destroying one waits on its peers: most of a small scenario's cost, none of it the code
under test. While a scenario runs, ``torch.distributed.new_group`` and
``destroy_process_group`` go through :class:`GroupReuse`: the N-th group a scenario asks for
with given members and options is the N-th group of those the world made before, if the
world made one, and a destroyed group goes back to the pool instead of being torn down.

What the code under test sees is unchanged: a working group of the members it named, the
same number of distinct groups as it asked for (two groups of the same members are two
groups), destroyed when it destroys them, as far as it can tell. A group is handed out only
by the world that made it, and a world is kept only when every rank of the scenario ended
cleanly (:mod:`testbed.cluster.worker`), so every rank's pool is in step with its peers'.
What reuse could hide (a group still held by an engine object the scenario should have
destroyed) is what ``a2a-testbed run --reuse-differential`` runs the catalogue with and without
reuse to find.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

# A world whose engines asked for more groups than this is left (sockets and gloo threads
# would pile up across many layouts).
MAX_POOLED = 192


class GroupReuse:
    """Per worker: the pooled groups of its world and the scenario's use of them."""

    def __init__(self) -> None:
        self.pooled: dict[tuple, list[Any]] = {}  # key -> groups, in the order they were made
        self.handed: Counter = Counter()  # key -> how many this scenario was given
        self.active = False
        self.made = 0  # groups made by this scenario that this rank is in (the world's group count grew by this)
        self._real_new = self._real_destroy = None

    def install(self) -> None:
        """Route ``torch.distributed``'s ``new_group`` and ``destroy_process_group`` through
        this pool; inert until :meth:`begin`."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        self._real_new, self._real_destroy = c10d.new_group, c10d.destroy_process_group

        def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                      use_local_synchronization=False, group_desc=None, **kwargs):
            key = self._key(ranks, timeout, backend, pg_options, use_local_synchronization, kwargs)
            if key is None:
                return self._real_new(ranks, timeout, backend, pg_options, use_local_synchronization,
                                      group_desc, **kwargs)
            return self._take(key, lambda: self._real_new(ranks, timeout, backend, pg_options,
                                                          use_local_synchronization, group_desc, **kwargs))

        def destroy_process_group(group=None):
            if self.active and group is not None and self._is_pooled(group):
                return None  # back to the pool: the next scenario's N-th such group
            if group is None:
                self.forget()  # the world itself goes
            return self._real_destroy(group)

        for module in (dist, c10d):
            module.new_group = new_group
            module.destroy_process_group = destroy_process_group

    def _key(self, ranks, timeout, backend, pg_options, local, kwargs) -> tuple | None:
        if not self.active or pg_options is not None or kwargs:
            return None  # options this pool cannot compare: a fresh group, as asked
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        return (tuple(sorted(ranks)) if ranks else None, seconds, str(backend) if backend else None, bool(local))

    def _take(self, key: tuple, make) -> Any:
        index = self.handed[key]
        self.handed[key] += 1
        groups = self.pooled.setdefault(key, [])
        if index < len(groups):
            return groups[index]
        import torch.distributed as dist

        group = make()
        groups.append(group)
        self.made += group is not dist.GroupMember.NON_GROUP_MEMBER  # a non-member holds none
        return group

    def _is_pooled(self, group) -> bool:
        return any(g is group for groups in self.pooled.values() for g in groups)

    def begin(self, enabled: bool) -> None:
        """A scenario starts: it is handed the pool's groups from the first (``enabled``), or
        every group it asks for is made and destroyed as asked (the pool emptied first)."""
        if not enabled:
            self.drop()
        self.handed.clear()
        self.made = 0
        self.active = enabled

    def end(self) -> None:
        self.active = False

    def count(self) -> int:
        return sum(len(groups) for groups in self.pooled.values())

    def full(self) -> bool:
        return self.count() > MAX_POOLED

    def drop(self) -> None:
        """Destroy every pooled group (the world stays)."""
        import torch.distributed as dist

        groups = [g for groups in self.pooled.values() for g in groups if g is not dist.GroupMember.NON_GROUP_MEMBER]
        self.forget()
        for group in groups:
            self._real_destroy(group)

    def forget(self) -> None:
        """The world went (its groups with it)."""
        self.pooled.clear()
        self.handed.clear()
