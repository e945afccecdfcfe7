"""The integration check of a deployment shape: ``impl`` driven through MoE layers on every
rank of a layout against the dense reference, and the historical bugs as injectable faults.

Stage 0 of the pipeline gets every format asked for (a heterogeneous model: say an nvfp4
base and a bf16 head), later stages only the first, so stages rebuild their workspaces a
different number of times, as in seed 001. DP rank 0 has no tokens when DP > 1. Hidden is
512: the two-sided kernels move rows in 16-byte units, which every format's scales fill
from there (mxfp8 H/32 bytes, DeepSeek fp8 4 * H/128).
"""

from __future__ import annotations

import time


from testbed.cluster.pool import ScenarioError
from testbed.cluster.layout import ParallelLayout
from testbed.scenario.moe import MoECase, reference_output, run_layers

# fault -> (run_layers keywords, requirement on the layout/options or None)
MUTANT_FAULTS = {
    "double-reduce": ({"prepare_finalize": "double_reduce_{kind}"}, "tp >= 2"),
    "first-layer-workspace": ({"manager": "first_layer_workspace"}, "path one_sided, formats with growing payload"),
    "world-barrier-rebuild": ({"manager": "world_barrier"}, "pp >= 2, path one_sided"),
    "unprobed-output": ({"manager": "unprobed_output"}, "path one_sided, a profile before 0.6.16"),
}
TOLERANCE = 2e-2  # of the reference's max |value|: bf16 outputs, fp32 accumulation


def stages_for(layout: ParallelLayout, formats: tuple[str, ...], *, hidden: int = 512, tokens: int = 5,
               seed: int = 0) -> tuple[tuple[MoECase, ...], ...]:
    ep = layout.ep_size
    per_dp = tuple(0 if d == 0 and layout.dp > 1 else tokens + d for d in range(layout.dp))
    layer = lambda i, fmt: MoECase(num_experts=4 * ep, top_k=min(4, 4 * ep), hidden=hidden,  # noqa: E731
                                   tokens_per_dp=per_dp, fmt=fmt, seed=seed + i)
    first = tuple(layer(i, f) for i, f in enumerate(formats))
    return (first,) + tuple(first[:1] for _ in range(layout.pp - 1))


def check_moe(pool, layout: ParallelLayout, *, kind: str = "one_sided", profile: str = "0.7.2",
              formats: tuple[str, ...] = ("nvfp4", "bf16"), fault: str | None = None,
              timeout_s: float = 60.0) -> dict:
    """Run the layers; without ``fault``, ``ok`` means every output matched the reference;
    with one, ``ok`` means the testbed caught it (a scenario error or a wrong output)."""
    stages = stages_for(layout, formats)
    kwargs = {"kind": kind, "profile": profile}
    if fault:
        kwargs.update({k: v.format(kind=kind) for k, v in MUTANT_FAULTS[fault][0].items()})
    what = f"{kind} (FlashInfer {profile}), layers {'/'.join(formats)}"
    started = time.monotonic()
    try:
        results = pool.run(run_layers, layout, (stages,), kwargs, timeout_s=timeout_s,
                           name=f"moe-{fault or 'check'}")
        error = None
    except ScenarioError as exc:
        results, error = None, exc
    seconds = time.monotonic() - started
    if error is not None:
        detail = f"{what}: {type(error).__name__}\n{error}"
        return {"layout": str(layout), "ok": fault is not None, "seconds": seconds,
                "detail": ("caught: " if fault else "") + detail}
    worst = _worst_error(layout, stages, results)
    summary = f"{what}: worst |output - reference| is {worst:.3g} x the tolerance"
    if fault is None:
        return {"layout": str(layout), "ok": worst <= 1.0, "seconds": seconds, "detail": summary}
    caught = worst > 1.0
    return {"layout": str(layout), "ok": caught, "seconds": seconds,
            "detail": ("caught: wrong output, " if caught else f"fault {fault} went unnoticed (needs "
                       f"{MUTANT_FAULTS[fault][1]}): ") + summary}


def _worst_error(layout, stages, results) -> float:
    worst = 0.0
    for rank, res in enumerate(results):
        for case, out in zip(stages[layout.coords(rank).pp_rank], res.outputs):
            ref = reference_output(case, res.dp_rank)
            if ref.numel():
                scale = TOLERANCE * max(1.0, ref.abs().max().item())
                worst = max(worst, (out.float() - ref).abs().max().item() / scale)
            elif out.numel():
                return float("inf")
    return worst
