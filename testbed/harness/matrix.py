"""The integration matrix: what ``a2a-testbed run`` checks with no arguments.

Every path (both FlashInfer all-to-alls, the all-gather/reduce-scatter baseline, expert
parallel off), format and profile; layers whose needs grow, stay equal, and whose token
budget grows while their bytes shrink; PP 2 with stages that rebuild a different number of
times (also with TP > 1); TP 4; 0-token ranks and an all-zero pass; passes that grow and
shrink; every routing pattern and combine signature; sequence parallel (uneven chunks, a
remainder, TP ranks without tokens), deferred finalize (and its guard at TP 1 and on 0-token
passes), shared experts, routed scaling, the TRT-LLM kernels, workspace-resident expert
output and both expert-id sentinels.
"""

from __future__ import annotations

import dataclasses

from testbed import integrations
from testbed.cluster.layout import ParallelLayout
from fakes.flashinfer.profiles import distinct_alltoalls, resolve
from testbed.scenario.model import Scenario, ScenarioInputError, from_text, parse_stages, parse_tokens
from testbed.scenario.models import MODELS, ModelShape


MATRIX: tuple[Scenario, ...] = (
    from_text("2,1,2,1", "nvfp4:16,bf16:16", "0,5 3,4", label="growth nvfp4 -> bf16"),
    from_text("4,2,2,1", "bf16:16,nvfp4:24,nvfp4:24", "5,0 20,3 2,1", routing="spread",
       label="budget grows while bytes shrink; an equal layer; passes grow then shrink"),
    from_text("4,1,2,2", "nvfp4:8,bf16:8,mxfp8:8;bf16:8", "0,3 6,2", profile="0.6.16",
       label="PP 2: stages rebuild 2 and 0 times"),
    from_text("8,2,2,2", "fp8_block:8,bf16:16;nvfp4:16,nvfp4:8", "4,0 0,0 7,8", seed=3,
       label="PP 2 with TP 2; an all-zero pass"),
    from_text("4,4,1,1", "nvfp4:12,bf16:12", "9 0", routing="hotspot", label="TP 4, hotspot"),
    from_text("4,1,4,1", "nvfp4:16,bf16:12", "0,3,5,8 2,2,0,1", profile="0.6.8", routing="local",
       label="0.6.8 (no output=); the budget shrinks while the bytes grow"),
    from_text("4,2,2,1", "mxfp8:8,fp8_block:8", "3,5 8,1", profile="0.6.14", routing="one-expert", seed=5,
       label="0.6.14, every lane on one expert"),
    from_text("2,1,2,1", "bf16:8", "3,5 1,0", combine_signature="opaque", label="combine without a signature"),
    from_text("2,2,1,1", "nvfp4:8,bf16:8", "6 2", combine_signature="kwargs-only", label="combine(**kwargs)"),
    from_text("4,1,4,1", "nvfp4:8", "1,2,3,4", experts=10, combine_signature="positional-only",
       slot_order="deterministic", label="10 experts on 4 ranks; positional-only output"),
    from_text("2,1,2,1", "bf16:4,bf16:8", "4,2", profile="0.6.8", combine_signature="kw-only", top_k=1,
       label="kw-only output= on an old release; top_k 1"),
    from_text("4,2,2,1", "nvfp4:8,bf16:8", "0,5 3,3", path="two_sided", hidden=512, label="two-sided, TP 2"),
    from_text("4,1,2,2", "mxfp8:8;fp8_block:8", "2,0 0,0 4,4", path="two_sided", hidden=512, top_k=4,
       label="two-sided PP 2, an all-zero pass"),
    from_text("8,4,1,2", "nvfp4:8,bf16:8;bf16:16", "5 0 8", top_k=4, experts=16, label="PP 2 with TP 4"),
    from_text("4,2,2,1", "nvfp4:8,fp8_block:8", "3,0 5,6", top_k=1, router_weight_on_input=True,
       label="router weight on input (top_k 1)"),
    from_text("4,1,4,1", "mxfp8:8,bf16:8", "2,0,1,3", path="two_sided", hidden=512, top_k=1,
       router_weight_on_input=True, routing="spread", label="two-sided, router weight on input"),
    # -- the rest of the integration (seeds 003, 004) ------------------------------------------
    from_text("4,2,2,1", "nvfp4:8,bf16:8", "0,5 3,3", path="allgather_reducescatter", shared_experts=True,
       routed_scaling=2.5, label="all-gather/reduce-scatter: the layer's TP reduce; shared experts, scaling"),
    from_text("4,2,2,1", "fp8_block:8,mxfp8:8", "1,5 4,0", path="allgather_reducescatter", sequence_parallel=True,
       routing="spread", label="all-gather/reduce-scatter under SP: over the EP group, no TP reduce"),
    from_text("8,4,2,1", "bf16:8,nvfp4:8", "1,6 5,0", sequence_parallel=True, expert_kernel="trtllm", shared_experts=True,
       label="SP on TP 4: 1, 6 and 5 tokens over 4 TP ranks (remainders, empty ranks); TRT-LLM kernels"),
    from_text("8,2,2,2", "nvfp4:8,mxfp8:8;bf16:8", "3,1 0,2", sequence_parallel=True, expert_output="workspace",
       label="SP with PP 2 and TP 2; expert output in the workspace"),
    from_text("4,4,1,1", "bf16:8,nvfp4:8,mxfp8:8", "5 0 3", path="none", defer_finalize=True, shared_experts=True,
       routed_scaling=2.5, label="expert parallel off, TP 4: deferred finalize, a 0-token pass, shared, scaling"),
    from_text("4,2,1,2", "bf16:8,fp8_block:8;nvfp4:8", "3 0", path="none", expert_kernel="trtllm", defer_finalize=True,
       label="deferred TRT-LLM bf16/nvfp4 kernels (fp8 cannot defer), PP 2"),
    from_text("2,1,1,2", "bf16:8;nvfp4:8", "4 2", path="none", defer_finalize=True, shared_experts=True,
       label="defer requested at TP 1: not taken (historical bug 6)"),
    from_text("4,2,2,1", "bf16:8,nvfp4:16,fp8_block:8", "2,6 0,3", expert_kernel="trtllm", expert_output="workspace",
       invalid_expert_id="num_experts", label="TRT-LLM kernels into the workspace; num_experts as the sentinel"),
    from_text("4,1,4,1", "bf16:8,fp8_block:8", "2,0,3,1", path="two_sided", expert_kernel="trtllm-packed", hidden=512,
       label="two-sided with TRT-LLM kernels fed packed routing (num_experts ids of other ranks' experts)"),
    from_text("2,1,2,1", "nvfp4:8,bf16:8", "3,0", profile="0.6.8", expert_output="workspace",
       label="expert output in the workspace on 0.6.8 (combine without output=)"),
    from_text("4,2,2,1", "bf16:8", "3,2", top_k=1, router_weight_on_input=True, expert_kernel="trtllm",
       path="allgather_reducescatter", label="router weight on input before a SwiGLU expert"),
    # -- flashinfer.moe_ep (0.7.2 by choice, 0.7.4 the only API; issue 10) ---------------------------
    from_text("4,2,2,1", "bf16:8,nvfp4:16,mxfp8:24", "0,5 8,3", profile="0.7.4", top_k=3, expert_output="workspace",
       label="0.7.4: moe_ep one-sided, top_k 3 (instantiated from 0.7.4), budgets grow, output in the workspace"),
    from_text("8,2,2,2", "bf16:8,nvfp4:8;nvfp4:16", "3,1 0,2", profile="0.7.4", sequence_parallel=True,
       expert_kernel="trtllm", label="0.7.4 under SP with PP 2: chunked ids must start 16-byte aligned"),
    from_text("4,1,2,2", "fp8_block:8;bf16:16", "3,8 0,0", profile="0.7.4", path="two_sided", hidden=512,
       label="0.7.4: moe_ep two-sided, PP 2, an all-zero pass"),
    from_text("4,1,4,1", "nvfp4:8,bf16:16", "2,0,5,1 0,0,0,0", a2a_api="moe_ep", invalid_expert_id="num_experts",
       label="0.7.2 through moe_ep one-sided; num_experts as the sentinel; an all-zero pass"),
    from_text("4,2,2,1", "mxfp8:8,bf16:8", "4,1", a2a_api="moe_ep", path="two_sided", hidden=512, top_k=4,
       label="0.7.2 through moe_ep two-sided"),
    # -- NVL72-sized EP groups (kMaxRanks: 64, 256 in 0.7.4's moe_ep) ------------------------------
    from_text("64,1,64,1", "nvfp4:16,bf16:16", ",".join(str(d % 17) for d in range(64)), experts=256, top_k=8,
       label="EP 64 (an NVL72 deployment): 256 experts, top_k 8, 0 to 16 tokens per rank"),
    from_text("33,1,33,1", "bf16:8", ",".join(str(d % 9) for d in range(33)), experts=100, top_k=8, routing="spread",
       label="odd EP 33: 100 experts split 4/3 per rank"),
    from_text("72,1,72,1", "nvfp4:16,bf16:16", ",".join(str(d % 17) for d in range(72)), profile="0.7.4", experts=288,
       top_k=8, label="EP 72, a whole NVL72 (0.7.4's moe_ep kernels take 256 ranks): 288 experts, top_k 8"),
    # -- real models' shapes (testbed/scenario/models.py) -----------------------------------------
    from_text("8,1,8,1", "mxfp8:16,bf16:8", "16,0,7,16,3,12,1,9 1,1,0,1,1,1,1,1", hidden=2880, experts=128, top_k=4,
       mx_alignment=256, label="gpt-oss-120b's shape: hidden 2880 in mxfp8 with vLLM's mx_alignment 256 (90 scale "
       "blocks padded to 96)"),
    from_text("8,2,4,1", "fp8_block:16,nvfp4:8", "16,3,0,9", experts=256, top_k=8, hidden=7168, shared_experts=True,
       routed_scaling=2.5, label="DeepSeek-V3's shape at TP 2 x DP 4: hidden 7168, 256 experts, a shared expert, "
       "scaling 2.5; its MTP layer in nvfp4"),
)


def on_release(profile: str, backend: str = "fake", gpus: int | None = None, integration: str = "impl"
               ) -> tuple[list[Scenario], list[tuple[Scenario, str]]]:
    """The matrix moved to FlashInfer ``profile`` (each FlashInfer path on the API the release
    offers) and run by ``backend``: the scenarios it can run, and those it refuses with the
    rule (a custom combine signature needs ``MoeAlltoAll``, ``moe_ep`` needs experts divisible
    by the EP size, ...). On the real FlashInfer a scenario already of ``profile`` keeps its
    API, and one of more ranks than ``gpus`` is refused (a rank per GPU). ``integration``
    drives them (one that is not an engine: an engine's matrix is :func:`on_integration`'s)."""
    resolve(profile)  # UnservedRelease, a ValueError naming what is served
    runnable, refused = [], []
    for sc in MATRIX:
        keep_api = backend != "fake" and sc.profile == profile
        moved = dataclasses.replace(sc, profile=profile, a2a_api=sc.a2a_api if keep_api else "auto", flashinfer_backend=backend,
                                    integration=integration,
                                    label=f"{sc.label} [on {profile}{'' if backend == 'fake' else ', ' + backend}]")
        try:
            moved.validate()
            if gpus is not None and sc.layout.world_size > gpus:
                raise ScenarioInputError("--layout", f"{sc.layout.world_size} ranks need as many GPUs; this machine "
                                                     f"has {gpus}")
        except ScenarioInputError as e:
            refused.append((sc, str(e)))
        else:
            runnable.append(moved)
    return runnable, refused


def on_integration(integration: str, profile: str | None = None
                   ) -> tuple[list[Scenario], list[tuple[Scenario, str]]]:
    """The integration's own entries, then the matrix, driven by ``integration`` on FlashInfer
    ``profile`` (None: each scenario's own): the scenarios it can run, and those it refuses
    with the rule."""
    if profile is not None:
        resolve(profile)  # UnservedRelease, a ValueError naming what is served
    runnable, refused = [], []
    for sc in integrations.get(integration).matrix() + MATRIX:
        try:  # (a scenario is validated when it is made, too)
            moved = sc if profile is None and sc.integration == integration else dataclasses.replace(
                sc, profile=profile or sc.profile, integration=integration,
                a2a_api="auto" if integrations.get(integration).engine else sc.a2a_api,
                label=f"{sc.label} [{integration} on {profile or sc.profile}]")
            moved.validate()
        except ScenarioInputError as e:
            refused.append((sc, str(e)))
        else:
            runnable.append(moved)
    return runnable, refused


# -- the model matrix: real models at EP 8 ------------------------------------------------------
MODEL_LAYOUT = "8,1,8,1"  # DP attention over 8 ranks, the experts over the same 8 (a DeepSeek-style deployment)
# A prefill-sized pass with an idle rank and uneven loads, then a decode pass.
MODEL_PASSES = ("16,0,7,16,3,12,1,9", "1,1,0,1,1,1,1,1")
MODEL_PATHS = ("one_sided", "two_sided", "allgather_reducescatter")


def model_scenario(shape: ModelShape, fmt: str, path: str, profile: str, layout: str = MODEL_LAYOUT,
                   passes: tuple[str, ...] = MODEL_PASSES, integration: str = "impl") -> Scenario:
    """``shape`` as the scenario of one deployment, not validated."""
    lay = ParallelLayout.parse(layout)
    return Scenario(layout=lay, stages=parse_stages(shape.stages(lay.pp, fmt)),
                    passes=tuple(map(parse_tokens, passes)), path=path, profile=profile, integration=integration,
                    label=f"{shape.name} {fmt} {path} on {profile}", **shape.fields(fmt))


# With a rotation, each model meets this many of the other releases (and each release at least
# this many models, while there are at least as many models as releases).
ROTATION = 2


def on_models(names: tuple[str, ...] = (), integration: str = "impl", rotation: bool = False
              ) -> tuple[list[Scenario], list[tuple[Scenario, str]]]:
    """The model matrix: each model (``names``, default all) at EP 8 in each of its dispatch
    formats on every all-to-all path of the pinned release (an engine's own pin), and, driven by
    impl, in its first format on every FlashInfer path of every other release with an all-to-all of
    its own (:func:`~fakes.flashinfer.profiles.distinct_alltoalls`), or with ``rotation`` of
    :data:`ROTATION` of them, spread evenly (:func:`rotated`); the scenarios
    that run (as the integration builds the model), and those the kernels or the integration
    refuse with the rule."""
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}: expected one of {', '.join(MODELS)}")
    engine = integrations.get(integration).engine
    pinned = engine.pinned() if engine else "0.7.2"
    # An engine runs on the release it pins (its matrix's rule); impl on every release.
    others = () if engine else tuple(p for p in distinct_alltoalls() if p != resolve(pinned).name)
    runnable, refused = [], []
    for i, shape in enumerate(MODELS[n] for n in names or MODELS):
        runs = [(fmt, path, pinned) for fmt in shape.formats for path in MODEL_PATHS
                if fmt == shape.formats[0] or path != "allgather_reducescatter"]
        mine = rotated(others, i) if rotation else others
        runs += [(shape.formats[0], path, profile) for profile in mine for path in MODEL_PATHS[:2]]
        for fmt, path, profile in runs:
            sc = model_scenario(shape, fmt, path, profile, integration=integration)
            try:
                runnable.append(_as_integration_builds(sc))
            except ScenarioInputError as e:
                refused.append((sc, str(e)))
    return runnable, refused


def rotated(releases: tuple[str, ...], i: int) -> tuple[str, ...]:
    """The :data:`ROTATION` of ``releases`` the ``i``-th model meets (all, where there are no
    more): evenly spaced from the model's own offset, so consecutive models start on
    consecutive releases and, with at least as many models as releases, each release meets
    :data:`ROTATION` models or more."""
    n = len(releases)
    if n <= ROTATION:
        return releases
    return tuple(releases[(i + k * n // ROTATION) % n] for k in range(ROTATION))


def _as_integration_builds(sc: Scenario) -> Scenario:
    """``sc`` as its integration builds the model, validated: where it refuses a preset's
    choice that its own engine makes (one token budget for every layer, the MTP layer's too;
    the mxfp8 scale padding its quant method decides), the engine's choice instead; the
    refusal of the engine's choices otherwise."""
    one_budget = tuple(tuple(dataclasses.replace(ly, max_num_tokens=max(x.max_num_tokens for x in st)) for ly in st)
                       for st in sc.stages)
    tries = (sc, dataclasses.replace(sc, stages=one_budget), dataclasses.replace(sc, mx_alignment=0),
             dataclasses.replace(sc, stages=one_budget, mx_alignment=0))
    for candidate in tries:
        try:
            candidate.validate()
        except ScenarioInputError as e:
            if e.flag not in ("--stages", "--mx-alignment") or candidate is tries[-1]:
                raise
        else:
            return candidate
