"""Parallel layouts: which global ranks form each TP, DP, PP and EP group.

Rank order follows vLLM's ``initialize_model_parallel``: the world is viewed as
``[dp, pp, tp]`` with TP innermost, so ``rank = (dp_idx * pp + pp_idx) * tp + tp_idx``.
The EP group of a pipeline stage flattens that stage's ``(dp, tp)`` ranks (EP = TP x DP),
and a rank's EP index is ``dp_idx * tp + tp_idx``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

GROUP_KINDS = ("world", "tp", "dp", "pp", "ep")
_AXIS_ORDER = ("dp", "pp", "tp")
_GROUP_AXES = {
    "world": _AXIS_ORDER, "tp": ("tp",), "dp": ("dp",), "pp": ("pp",), "ep": ("dp", "tp"),
}
# The self-check's layouts (W,TP,DP,PP): no PP, TP x DP, PP with singleton TP, all three.
DEFAULT_LAYOUTS = ("2,1,2,1", "4,2,2,1", "4,1,2,2", "8,2,2,2")


@dataclass(frozen=True)
class RankCoords:
    """Where one global rank sits in a layout."""

    rank: int
    tp_rank: int
    dp_rank: int
    pp_rank: int
    ep_rank: int


@dataclass(frozen=True)
class ParallelLayout:
    """World size and TP / DP / PP degrees of one deployment shape.

    Parameters
    ----------
    world_size : int
        Number of rank processes; must equal ``tp * dp * pp``.
    tp, dp, pp : int
        Tensor-, data- and pipeline-parallel degrees.

    Raises
    ------
    ValueError
        A degree is not a positive int, or the degrees do not multiply to ``world_size``.
    """

    world_size: int
    tp: int = 1
    dp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "dp", "pp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ParallelLayout: {name} must be a positive int, got {value!r}")
        w, tp, dp, pp = self.world_size, self.tp, self.dp, self.pp
        if w % tp:
            raise ValueError(f"ParallelLayout: world_size {w} is not divisible by tp {tp}")
        if w % (tp * pp):
            raise ValueError(
                f"ParallelLayout: world_size {w} is not divisible by tp {tp} x pp {pp} = {tp * pp}"
            )
        if tp * dp * pp != w:
            raise ValueError(
                f"ParallelLayout: tp {tp} x dp {dp} x pp {pp} = {tp * dp * pp} "
                f"does not equal world_size {w}"
            )

    @classmethod
    def parse(cls, text: str) -> "ParallelLayout":
        """Parse ``"W,TP,DP,PP"`` (e.g. ``"8,2,2,2"``) or ``"w8tp2dp2pp2"`` (omitted degrees are 1)."""
        text = text.strip().lower()
        if re.fullmatch(r"\d+(,\d+){0,3}", text):
            return cls(*(int(part) for part in text.split(",")))
        match = re.fullmatch(r"w(\d+)(?:tp(\d+))?(?:dp(\d+))?(?:pp(\d+))?", text)
        if not match:
            raise ValueError(
                f"layout {text!r}: expected 'WORLD,TP,DP,PP' (e.g. '8,2,2,2') or 'w8tp2dp2pp2'"
            )
        world, tp, dp, pp = (int(g) if g else 1 for g in match.groups())
        return cls(world, tp, dp, pp)

    def __str__(self) -> str:
        return f"w{self.world_size}tp{self.tp}dp{self.dp}pp{self.pp}"

    @property
    def ep_size(self) -> int:
        return self.tp * self.dp

    def rank_of(self, dp_rank: int, pp_rank: int, tp_rank: int) -> int:
        return (dp_rank * self.pp + pp_rank) * self.tp + tp_rank

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        tp_rank = rank % self.tp
        pp_rank = (rank // self.tp) % self.pp
        dp_rank = rank // (self.tp * self.pp)
        return RankCoords(rank, tp_rank, dp_rank, pp_rank, dp_rank * self.tp + tp_rank)

    def groups(self, kind: str) -> tuple[tuple[int, ...], ...]:
        """Every group of one kind, each as its global ranks in group-rank order.

        A group holds the ranks that differ only along the kind's axes (EP: dp and tp, so
        one EP group per pipeline stage); groups and members both run in (dp, pp, tp) order.
        """
        if kind not in _GROUP_AXES:
            raise ValueError(f"group kind {kind!r}: expected one of {', '.join(GROUP_KINDS)}")
        varying = _GROUP_AXES[kind]
        sizes = {"dp": self.dp, "pp": self.pp, "tp": self.tp}
        fixed = [axis for axis in _AXIS_ORDER if axis not in varying]
        groups = []
        for fixed_at in itertools.product(*(range(sizes[a]) for a in fixed)):
            members = []
            for varying_at in itertools.product(*(range(sizes[a]) for a in varying)):
                at = dict(zip(fixed, fixed_at)) | dict(zip(varying, varying_at))
                members.append(self.rank_of(at["dp"], at["pp"], at["tp"]))
            groups.append(tuple(members))
        return tuple(groups)

    def group_of(self, kind: str, rank: int) -> tuple[int, ...]:
        """The group of ``kind`` that contains ``rank``."""
        self.coords(rank)
        return next(g for g in self.groups(kind) if rank in g)
