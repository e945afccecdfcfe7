"""What a scenario needs of this machine, estimated from its shape before any rank starts, and
whether it fits.

Legend: W world size, ep EP size, B a layer's token budget, H hidden, E experts, K top_k,
R the linear maps' rank. The estimate is arithmetic on the shape (a fraction of a millisecond),
deliberately on the high side:

- shared memory: every rank's all-to-all workspace (the NVLink window the fake keeps in
  ``/dev/shm``): per rank ``ep * B * (dispatch bytes + 2 H)`` for the largest layer, at least
  the two-sided FIFOs; ``W`` of them (each EP group of a stage maps its ranks' windows);
- each rank's own memory: its process (the pages not shared with the fork server), its
  experts (a linear map is ``H * (8 + 4 + 8 R)`` bytes; a SwiGLU expert ``3 * I * H`` fp32 twice),
  and its activations (``ep * B`` received rows of ``H`` in fp32, a few copies);
- the parent: the dense reference of every DP rank's tokens, every expert's map once, and the
  outputs every rank returns.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from testbed.scenario.model import INTERMEDIATE_PER_RANK, Scenario, row_bytes

MIB = 1 << 20
GB = 1e9
RANK_PROCESS = 64 * MIB  # unique pages of a rank forked from the fork server (measured 22-31 MiB)
PARENT_PROCESS = 512 * MIB  # the parent's torch, the testbed and the pool
ACTIVATION_COPIES = 2  # the experts' fp32 output over every received row, and their inputs
TWO_SIDED_FIFO = 3 * 256 * 1024  # the fake's MnnvlMoe FIFOs per peer (comm and prepare)
HEADROOM = 0.85  # what of the free memory a scenario may plan to use


@dataclass(frozen=True)
class Footprint:
    """The estimated needs of one scenario, in bytes."""

    shm: int  # /dev/shm: every rank's all-to-all workspace
    per_rank: int  # each rank's own memory (the largest rank's)
    ranks: int
    parent: int
    workspace_per_rank: int

    @property
    def resident(self) -> int:
        """Memory in all: shared memory is memory too."""
        return self.shm + self.ranks * self.per_rank + self.parent

    def as_dict(self) -> dict:
        return {"shm_bytes": self.shm, "workspace_bytes_per_rank": self.workspace_per_rank,
                "rank_bytes": self.per_rank, "ranks": self.ranks, "parent_bytes": self.parent,
                "resident_bytes": self.resident}


@dataclass(frozen=True)
class Machine:
    """What this machine offers a scenario now: free ``/dev/shm`` and available memory."""

    shm_free: int
    memory: int

    @classmethod
    def here(cls) -> "Machine":
        st = os.statvfs("/dev/shm")
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return cls(st.f_bavail * st.f_frsize, info.get("MemAvailable", info["MemTotal"]))


def estimate(sc: Scenario) -> Footprint:
    """The needs of ``sc`` (see the module docstring)."""
    H, K, ep = sc.hidden, sc.top_k, sc.ep_size
    layers = [layer for stage in sc.stages for layer in stage]
    budget = max(layer.max_num_tokens for layer in layers)
    # Some integrations size the window for 16-bit activations whatever the format (moe_ep's does).
    dispatch = max(max(sum(row_bytes(layer.fmt, H, sc.mx_alignment).values()) for layer in layers), 2 * H) + 8 * K
    workspace = 0
    if sc.path == "one_sided":
        workspace = ep * budget * (dispatch + 2 * H)
    elif sc.path == "two_sided":
        workspace = max(ep * budget * (dispatch + 2 * H), TWO_SIDED_FIFO * ep)
    own = -(-sc.experts // ep)
    per_layer = max(len(stage) for stage in sc.stages)
    if sc.expert_kernel == "reference":
        expert = H * (8 + 4 + 8 * 8)
    else:
        expert = 2 * 3 * INTERMEDIATE_PER_RANK * sc.moe_tp * H * 4
    gathered = ep * budget if sc.path != "none" else budget
    activations = ACTIVATION_COPIES * gathered * H * 4
    per_rank = RANK_PROCESS + per_layer * own * expert + activations
    tokens = sum(max(counts) for counts in sc.passes) * sc.layout.dp
    outputs = sc.layout.world_size * sum(len(stage) for stage in sc.stages) * \
        sum(min(max(counts), budget) for counts in sc.passes) * H * 2
    parent = PARENT_PROCESS + len(layers) * sc.experts * H * (8 + 4 + 8 * 8) + \
        ACTIVATION_COPIES * min(tokens, budget * sc.layout.dp) * H * 4 + outputs
    return Footprint(sc.layout.world_size * workspace, per_rank, sc.layout.world_size, parent, workspace)


def _scaled(sc: Scenario, tokens: int) -> Scenario:
    """``sc`` with every layer's budget and every pass's count capped at ``tokens``."""
    stages = tuple(tuple(dataclasses.replace(layer, max_num_tokens=min(layer.max_num_tokens, tokens))
                         for layer in stage) for stage in sc.stages)
    passes = tuple(tuple(min(n, tokens) for n in counts) for counts in sc.passes)
    return dataclasses.replace(sc, stages=stages, passes=passes, raw_passes=True)


def _fits(fp: Footprint, machine: Machine) -> bool:
    return fp.shm <= HEADROOM * machine.shm_free and fp.resident <= HEADROOM * machine.memory


def refusal(sc: Scenario, machine: Machine | None = None) -> str | None:
    """Why ``sc`` will not fit ``machine`` (this one by default), with the numbers and the most
    tokens per rank that would; None when it fits."""
    machine = machine or Machine.here()
    fp = estimate(sc)
    if _fits(fp, machine):
        return None
    if fp.shm > HEADROOM * machine.shm_free:
        need = (f"needs ~{fp.shm / GB:.3g} GB of shared memory ({fp.ranks} ranks x {fp.workspace_per_rank / GB:.3g} "
                f"GB of workspace), this machine has {machine.shm_free / GB:.3g} GB free in /dev/shm")
    else:
        need = (f"needs ~{fp.resident / GB:.3g} GB of memory ({fp.shm / GB:.3g} GB shared, {fp.ranks} ranks x "
                f"{fp.per_rank / GB:.3g} GB, the parent {fp.parent / GB:.3g} GB), this machine has "
                f"{machine.memory / GB:.3g} GB available")
    budget = max(layer.max_num_tokens for stage in sc.stages for layer in stage)
    lo, hi = 0, budget  # the most tokens per rank that fit, by bisection (the estimate grows with them)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _fits(estimate(_scaled(sc, mid)), machine) else (lo, mid - 1)
    fit = f"at most {lo} tokens per rank fit" if lo else "not even 1 token per rank fits at this layout"
    return f"{need}; {fit}"
