"""The parallel configuration of a MoE deployment and what it implies (vLLM's
``ParallelConfig`` and ``FusedMoEParallelConfig``), with the all-to-all backends by vLLM's names.

The support table (:data:`SUPPORT`) is the one place that says which backend carries which
activation format and which mode (sequence parallel, deferred finalize, workspace-resident
expert output). The layer refuses what it cannot do (a format, workspace output) through
:func:`check_supported`; sequence parallel and deferral are vLLM's derived decisions
(:attr:`ParallelConfig.use_sequence_parallel_moe`, :attr:`ParallelConfig.use_deferred_moe_finalize`),
which read the table, so the factory builds what they decide; the testbed's CLI refuses a
scenario that asks for a mode the table rules out; ``docs/feature_matrix.md`` is rendered
from it.
"""

from __future__ import annotations

from dataclasses import dataclass

ONE_SIDED = "flashinfer_nvlink_one_sided"
TWO_SIDED = "flashinfer_nvlink_two_sided"
AG_RS = "allgather_reducescatter"
NO_EP = "none"  # expert parallel off: TP-sharded experts, no all-to-all
BACKENDS = (ONE_SIDED, TWO_SIDED, AG_RS, NO_EP)
ALIASES = {"flashinfer_all2allv": TWO_SIDED}  # vLLM's deprecated name for the two-sided one
FORMATS = ("bf16", "nvfp4", "mxfp8", "fp8_block")
MODES = ("sequence_parallel", "deferred_finalize", "workspace_output")
EXPERT_OUTPUTS = ("separate", "workspace")  # where the experts write: their own tensor, or the combine region
TRTLLM_FORMATS = ("bf16", "nvfp4", "fp8_block")  # the TRT-LLM routed kernels impl.experts drives
DEFERRING_FORMATS = ("bf16", "nvfp4")  # those vLLM lets stop after GEMM2 (seed 004)


class UnsupportedFeatureError(ValueError):
    """A backend asked for a format or mode it does not support; names backend, feature, rule."""

    def __init__(self, backend: str, feature: str, rule: str):
        self.backend, self.feature, self.rule = backend, feature, rule
        super().__init__(f"{backend} does not support {feature}: {rule}")


def canonical_backend(name: str) -> str:
    """The vLLM backend name ``name`` stands for (aliases resolved); ValueError if unknown."""
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        raise ValueError(f"all2all_backend must be one of {', '.join(BACKENDS + tuple(ALIASES))}, got {name!r}")
    return name


_NO_COMBINE_REGION = ("only the one-sided MoeAlltoAll has a combine region the experts can write into "
                      "(get_combine_payload_tensor_in_workspace)")
_DEFER = ("the {} needs each token's finalized rows, so the top-k reduce cannot wait for the consumer; "
          "vLLM defers finalize only without expert parallel (tp_size > 1, dp_size == 1, ep_size == 1)")
# backend -> feature -> None (supported) or the rule that rejects it.
SUPPORT: dict[str, dict[str, str | None]] = {
    ONE_SIDED: {"bf16": None, "nvfp4": None, "mxfp8": None, "fp8_block": None,
                "sequence_parallel": None, "deferred_finalize": _DEFER.format("all-to-all combine"),
                "workspace_output": None},
    TWO_SIDED: {"bf16": None, "nvfp4": None, "mxfp8": None, "fp8_block": None,
                "sequence_parallel": "vLLM's use_sequence_parallel_moe does not list the two-sided all-to-all",
                "deferred_finalize": _DEFER.format("all-to-all combine"), "workspace_output": _NO_COMBINE_REGION},
    AG_RS: {"bf16": None, "nvfp4": None, "mxfp8": None, "fp8_block": None,
            "sequence_parallel": None, "deferred_finalize": _DEFER.format("reduce-scatter"),
            "workspace_output": _NO_COMBINE_REGION},
    NO_EP: {"bf16": None, "nvfp4": None, "mxfp8": None, "fp8_block": None,
            "sequence_parallel": "sequence-parallel MoE splits tokens across the TP ranks of an expert-parallel "
                                 "group; it needs enable_expert_parallel",
            "deferred_finalize": None, "workspace_output": _NO_COMBINE_REGION},
}


def check_supported(backend: str, fmt: str, *, sequence_parallel: bool = False, deferred_finalize: bool = False,
                    workspace_output: bool = False) -> None:
    """Raise :class:`UnsupportedFeatureError` for the first thing ``backend`` cannot do."""
    backend = canonical_backend(backend)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, got {fmt!r}")
    wanted = [fmt] + [m for m, on in (("sequence_parallel", sequence_parallel),
                                      ("deferred_finalize", deferred_finalize),
                                      ("workspace_output", workspace_output)) if on]
    for feature in wanted:
        rule = SUPPORT[backend][feature]
        if rule is not None:
            raise UnsupportedFeatureError(backend, feature, rule)


def feature_matrix_markdown() -> str:
    """``docs/feature_matrix.md``: the support table as Markdown, with each rule."""
    features = FORMATS + MODES
    lines = ["# Feature matrix", "",
             "Generated from `impl.parallel.SUPPORT` by `python -m impl.parallel`; "
             "`tests/test_support.py` fails when this file is stale.", "",
             "| backend | " + " | ".join(features) + " |",
             "|---|" + "---|" * len(features)]
    for backend in BACKENDS:
        cells = ["yes" if SUPPORT[backend][f] is None else "no" for f in features]
        lines.append(f"| `{backend}` | " + " | ".join(cells) + " |")
    lines += ["", f"`flashinfer_all2allv` is an alias of `{TWO_SIDED}`; `{NO_EP}` means expert parallel is off.",
              "", "## Why not", ""]
    for backend in BACKENDS:
        for f in features:
            if SUPPORT[backend][f] is not None:
                lines.append(f"- `{backend}` / {f}: {SUPPORT[backend][f]}.")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ParallelConfig:
    """A deployment's parallel sizes and MoE choices (vLLM's names).

    Parameters
    ----------
    tp, dp, pp : int
        Tensor-, data- and pipeline-parallel sizes (the world is ``tp * dp * pp``).
    enable_expert_parallel : bool
        Shard experts over an EP group of ``tp * dp`` ranks per pipeline stage.
    all2all_backend : str
        One of :data:`BACKENDS` or an alias; ``"none"`` needs ``enable_expert_parallel=False``.
    sequence_parallel_moe : bool
        Split tokens across TP ranks where vLLM does (:attr:`use_sequence_parallel_moe`);
        False keeps the one-sided backend as it was before it joined vLLM's list (seed 003).
    defer_moe_finalize : bool
        Layers may return an unfinalized output. Only through
        :attr:`use_deferred_moe_finalize`, the guard: where it is False the flag is ignored,
        as vLLM ignores it (its layers set the flag on a config shared by every backend).
    """

    tp: int = 1
    dp: int = 1
    pp: int = 1
    enable_expert_parallel: bool = True
    all2all_backend: str = AG_RS
    sequence_parallel_moe: bool = True
    defer_moe_finalize: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "pp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        object.__setattr__(self, "all2all_backend", canonical_backend(self.all2all_backend))
        if (self.all2all_backend == NO_EP) == self.enable_expert_parallel:
            raise ValueError(f"all2all_backend={self.all2all_backend!r} with enable_expert_parallel="
                             f"{self.enable_expert_parallel}: backend 'none' exactly when expert parallel is off")

    @property
    def world_size(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def use_ep(self) -> bool:
        return self.enable_expert_parallel and self.tp * self.dp > 1

    @property
    def ep_size(self) -> int:
        """Ranks experts are sharded over: the flattened ``dp x tp`` of a stage, or 1."""
        return self.tp * self.dp if self.use_ep else 1

    @property
    def moe_tp_size(self) -> int:
        """TP size of the experts: 1 under expert parallel, else TP flattened across DP
        (vLLM's FusedMoEParallelConfig)."""
        return 1 if self.use_ep else self.tp * self.dp

    @property
    def use_sequence_parallel_moe(self) -> bool:
        return self.sequence_parallel_rule() is None

    def sequence_parallel_rule(self) -> str | None:
        """Why this deployment does not split MoE tokens across TP ranks, or None when it does."""
        if not self.sequence_parallel_moe:
            return "sequence_parallel_moe is off"
        refused = SUPPORT[self.all2all_backend]["sequence_parallel"]
        if refused is not None:
            return refused
        if not (self.tp > 1 and self.dp > 1):
            return f"sequence-parallel MoE needs tp > 1 and dp > 1, got tp={self.tp}, dp={self.dp}"
        return None

    @property
    def use_all2all_kernels(self) -> bool:
        return self.use_ep and (self.dp > 1 or self.use_sequence_parallel_moe)

    @property
    def use_deferred_moe_finalize(self) -> bool:
        """vLLM's guard: TP-only (no DP, no EP, no SP) on a backend that can defer."""
        return (self.defer_moe_finalize and self.moe_tp_size > 1 and self.dp == 1 and not self.use_ep
                and not self.use_sequence_parallel_moe and SUPPORT[self.all2all_backend]["deferred_finalize"] is None)


if __name__ == "__main__":
    print(feature_matrix_markdown(), end="")
