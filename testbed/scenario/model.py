"""The scenario model: one frozen description of everything a run of the integration varies.

A :class:`Scenario` is a deployment shape (layout), an all-to-all path, a FlashInfer release
the fake imitates, the MoE model, per pipeline stage the MoE layers (each with its own
activation format and token budget), forward passes (tokens per DP rank), a routing pattern,
the combine signature the fake exposes, the slot order and a seed. ``to_cli()`` is the exact
``a2a-testbed run`` line that reproduces it; :func:`add_arguments` / :func:`from_args` parse
that line back to an equal scenario.

In pass ``p`` a layer of budget ``B`` sees ``min(tokens[p][d], B)`` tokens on DP rank ``d``:
a drafter or MTP layer with a smaller budget takes fewer tokens than the base model.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field, fields
from typing import Protocol

from fakes.flashinfer.profiles import PROFILES as FAKE_PROFILES
from fakes.flashinfer.profiles import UnservedRelease, resolve, served_by
from impl import parallel as support
from testbed.cluster.layout import ParallelLayout

# The scenario's path -> the vLLM all2all_backend it drives ("none": expert parallel off,
# TP-sharded experts). --path also takes the vLLM names and their aliases.
PATH_BACKEND = {"one_sided": support.ONE_SIDED, "two_sided": support.TWO_SIDED,
                "allgather_reducescatter": support.AG_RS, "none": support.NO_EP}
PATHS = tuple(PATH_BACKEND)
# The testbed's linear experts, or the fake's TRT-LLM SwiGLU kernels given the received routing
# as an (ids, weights) pair (vLLM today) or packed (id << 16 | bf16 weight, older vLLM).
EXPERT_KERNELS = ("reference", "trtllm", "trtllm-packed")
EXPERT_OUTPUTS = support.EXPERT_OUTPUTS
INVALID_EXPERT_IDS = ("-1", "num_experts")
# The dtype a router computes expert ids in. vLLM's routers convert them to the dtype a
# prepare/finalize's topk_indices_dtype() names, and hand their own where it names none
# (base_router._convert_indices_dtype): fused_topk gives int32, torch.topk-based ones int64.
ROUTER_ID_DTYPES = ("int32", "int64")
MX_BLOCK = 32  # values per mxfp8 scale; mx_alignment is a multiple of it
TRTLLM_FORMATS = support.TRTLLM_FORMATS  # the fake implements these kernels too
MAX_ROUTED_SCALING = 1e6  # larger factors overflow the bf16 outputs
TRTLLM_HIDDEN_BLOCK = 128  # fp8 weight blocks and the nvfp4 scale interleave need it
INTERMEDIATE_PER_RANK = 128  # each rank's share of a SwiGLU expert's intermediate size
FORMATS = support.FORMATS
ROUTINGS = ("random", "spread", "local", "hotspot", "one-expert")
# How the fake's combine signature looks to the capability probe: the release's own, or one
# no release has (keyword-only ``output``, ``**kwargs`` only, ``output`` positional-only, or
# no inspectable signature at all, as a C-extension function has).
COMBINE_SIGNATURES = ("release", "kw-only", "kwargs-only", "positional-only", "opaque")
# The FlashInfer API that carries a FlashInfer path: what impl's probe picks ("auto"), flashinfer.comm's
# MoeAlltoAll / MnnvlMoe (up to 0.7.2), or flashinfer.moe_ep's NVLink backends (0.7.2 on).
A2A_APIS = ("auto", "comm", "moe_ep")
SLOT_ORDERS = ("shuffled", "deterministic")
# Who runs FlashInfer's side: the CPU fake, or the real package on this machine's GPUs (the
# scenario's profile must then be the installed release's).
BACKENDS = ("fake", "flashinfer")
# What of the integration a scenario drives: the MoE layer as the engine's models call it,
# or one level down, the all-to-all seam (prepare/finalize and kernel) fed the scenario's
# routing as a router left it; an integration offers the levels it has.
LEVELS = ("layer", "kernel")
PROFILES = tuple(FAKE_PROFILES)
# The most experts per token any kernel here takes: the two-sided prepare (trtllm_alltoall_prepare.cu,
# ``1 <= topK <= 32``) and the TRT-LLM routing of precomputed ids (its tiers end at Tier<2048, 32>).
# The one-sided path narrows it to its release's SWITCH_TOP_K (kMaxTopK = 22); the reference
# experts add no limit of their own.
SUPPORTED_TOP_K = tuple(range(1, 33))
# Bytes one received row of each format occupies per value block; the two-sided kernels move
# rows in 16-byte units, so every payload row (values and scales) must fill whole units.
TWO_SIDED_ROW_UNIT = 16
BLOCK = {"bf16": 1, "nvfp4": 16, "mxfp8": 32, "fp8_block": 128}
MAX_EP_RANKS = 64  # kMaxRanks of MoeAlltoAll's kernels and of MnnvlMoe; 0.7.4's one-sided moe_ep kernels' per profile


def pair_routing(release: str) -> bool:
    """Whether every routed TRT-LLM MoE entry of FlashInfer ``release`` declares ``topk_ids`` as
    the (ids, weights) pair too, as the contract read it from the release's annotations."""
    from fakes.flashinfer.annotations import table

    routed = [params["topk_ids"] for name, params in table(release).items()
              if name.startswith("fused_moe.") and name.endswith("_routed_moe")]
    return bool(routed) and all("Tuple[" in a for a in routed)


class IntegrationRules(Protocol):
    """What the model asks a scenario's integration (:class:`testbed.integrations.base.Integration`):
    the FlashInfer API it runs a path on, the rule a scenario breaks under it, and the passes its
    engine makes of the ones given."""

    name: str
    summary: str
    levels: tuple[str, ...]  # the LEVELS it offers

    def api(self, sc: "Scenario") -> str | None: ...

    def refusal(self, sc: "Scenario") -> tuple[str, str] | None: ...

    def engine_passes(self, sc: "Scenario") -> tuple[tuple[int, ...], ...]: ...


# The integrations registered (by testbed.integrations, which registers each when imported): the
# model names none itself, and asks the scenario's for what only it knows.
_INTEGRATIONS: dict[str, IntegrationRules] = {}


def register_integration(rules: IntegrationRules) -> None:
    _INTEGRATIONS[rules.name] = rules


def integration(name: str) -> IntegrationRules:
    """The registered integration ``name``; :class:`ScenarioInputError` (``--integration``) for another."""
    try:
        return _INTEGRATIONS[name]
    except (KeyError, TypeError):
        known = ", ".join(_INTEGRATIONS) or "none yet: importing testbed.integrations registers them"
        raise ScenarioInputError("--integration", f"must be one of {known}; got {name!r}") from None


def integration_names() -> tuple[str, ...]:
    return tuple(_INTEGRATIONS)


class ScenarioInputError(ValueError):
    """A scenario the kernels or the model cannot run; names the flag and the rule."""

    def __init__(self, flag: str, rule: str):
        self.flag = flag
        super().__init__(f"{flag}: {rule}")


@dataclass(frozen=True)
class Layer:
    """One MoE layer of a pipeline stage: its activation format and its ``max_num_tokens``."""

    fmt: str
    max_num_tokens: int

    def __str__(self) -> str:
        return f"{self.fmt}:{self.max_num_tokens}"


@dataclass(frozen=True)
class Scenario:
    """Everything one run of the integration varies (see the module docstring).

    ``stages[s]`` are PP stage ``s``'s layers; ``passes[p][d]`` the tokens of DP rank ``d`` in
    forward pass ``p``. Construct through :meth:`make` (validates) or :func:`from_args`.
    """

    layout: ParallelLayout
    stages: tuple[tuple[Layer, ...], ...]
    passes: tuple[tuple[int, ...], ...]
    path: str = "one_sided"
    profile: str = "0.7.2"
    experts: int = 8
    top_k: int = 2
    hidden: int = 256
    routing: str = "random"
    combine_signature: str = "release"
    slot_order: str = "shuffled"
    seed: int = 0
    router_weight_on_input: bool = False  # vLLM's apply_router_weight_on_input (top_k 1 only)
    sequence_parallel: bool = False  # split each DP rank's tokens across its TP ranks (seed 003)
    defer_finalize: bool = False  # defer_moe_finalize: taken only where vLLM's guard allows
    shared_experts: bool = False
    routed_scaling: float = 1.0
    expert_kernel: str = "reference"  # one of EXPERT_KERNELS
    expert_output: str = "separate"  # "workspace": straight into the one-sided combine region
    invalid_expert_id: str = "-1"  # the one-sided dispatch's sentinel: -1 or num_experts
    router_ids: str = "int32"  # one of ROUTER_ID_DTYPES: the router's own id dtype
    mx_alignment: int = 0  # mxfp8 layers pad their scale columns to cover hidden rounded up to it
    a2a_api: str = "auto"  # one of A2A_APIS (FlashInfer paths only)
    flashinfer_backend: str = "fake"  # one of BACKENDS (--backend)
    integration: str = "impl"  # a registered integration (testbed.integrations): whose code drives FlashInfer
    sp_prefill: bool = False  # SGLang (Muse Spark): every pass a prefill split over the TP ranks
    # SGLang: the last N MoE layers of each stage are the speculative draft model's (its MTP /
    # EAGLE drafter, built in SGLang's speculative MoE context), live beside the target's.
    draft_layers: int = 0
    # SGLang: each MoE layer is the named model family's own MoE block (one of the integration's
    # blocks, "" for none: the MoE layer alone), called as its decoder layer calls it.
    block: str = ""
    level: str = "layer"  # one of LEVELS
    raw_passes: bool = False  # the passes as given, not as the integration's engine would make them
    # The last rank of each EP group zeroes its workspace row late (testbed.harness.late_zeroing).
    late_zeroing: bool = False
    # Whether the testbed's stand-in for the model between two forwards (a barrier of the EP
    # group, testbed.integrations.engine.model_between_forwards) orders each forward's rounds
    # after the previous forward's: true where the testbed drives the passes; false for the
    # rounds an engine ran itself (its engine and served levels), which have only the
    # collectives the engine made.
    forwards_ordered: bool = True
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # The passes the integration's engine makes of the ones given (an engine may run an
        # idle rank on a dummy batch, or no forward at all): every scenario, however built,
        # is what the engine runs unless it asks for the raw passes.
        if not self.raw_passes and self.integration in _INTEGRATIONS:
            object.__setattr__(self, "passes", integration(self.integration).engine_passes(self))

    @classmethod
    def make(cls, **kw) -> "Scenario":
        s = cls(**kw)
        s.validate()
        return s

    # -- derived facts -------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return PATH_BACKEND[self.path]

    @property
    def api(self) -> str | None:
        """The FlashInfer API the path runs on (None off the FlashInfer paths), as the
        scenario's integration drives it."""
        return integration(self.integration).api(self)

    @property
    def ep_size(self) -> int:
        """Ranks the experts are sharded over (1 with expert parallel off)."""
        return 1 if self.path == "none" else self.layout.ep_size

    @property
    def moe_tp(self) -> int:
        """TP size of the experts: the layout's TP with expert parallel off, else 1."""
        return self.layout.tp if self.path == "none" else 1

    def parallel_config(self) -> "support.ParallelConfig":
        """vLLM's parallel config of this scenario (decides SP and deferral)."""
        lay = self.layout
        return support.ParallelConfig(tp=lay.tp, dp=lay.dp, pp=lay.pp, enable_expert_parallel=self.path != "none",
                                      all2all_backend=self.backend, sequence_parallel_moe=self.sequence_parallel,
                                      defer_moe_finalize=self.defer_finalize)

    def defers(self, fmt: str, num_tokens: int) -> bool:
        """Whether a layer of ``fmt`` must hand back an unfinalized output for a rank with
        ``num_tokens`` tokens (vLLM's guard, the 0-token rule, and the kernel's ability)."""
        kernel_can = self.expert_kernel == "reference" or fmt in support.DEFERRING_FORMATS
        return (self.defer_finalize and self.path == "none" and self.layout.tp > 1 and num_tokens > 0
                and kernel_can)

    @property
    def parts_partial(self) -> bool:
        """Whether a layer's routed and shared outputs are TP-partial sums the TP all-reduce
        completes: all-gather/reduce-scatter and expert parallel off, unless sequence parallel
        reduce-scattered over the whole EP group."""
        return self.path in ("allgather_reducescatter", "none") and not self.sequence_parallel

    def invalid_id(self) -> int:
        return -1 if self.invalid_expert_id == "-1" else self.experts

    @property
    def splits_tokens(self) -> bool:
        """Whether each TP rank dispatches its own share of its DP rank's tokens (sequence
        parallel, or SGLang's Muse Spark prefill) instead of all of them."""
        return self.sequence_parallel or self.sp_prefill

    def tokens(self, pass_idx: int, layer: Layer, dp_rank: int) -> int:
        """Tokens DP rank ``dp_rank`` hands ``layer`` in pass ``pass_idx``."""
        return min(self.passes[pass_idx][dp_rank], layer.max_num_tokens)

    def combine_takes_output(self) -> bool:
        """Whether the combine this scenario's fake exposes accepts ``output=`` by keyword
        (what the integration's probe must find, and then use)."""
        if self.api == "moe_ep":
            return True  # moe_ep's combine takes output= in every release
        if self.combine_signature == "release":
            return resolve(self.profile).combine_output_kw
        return self.combine_signature == "kw-only"

    # -- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ScenarioInputError` naming the flag and the rule it breaks."""
        lay = self.layout
        _choice("--path", self.path, PATHS)
        check_release("--profile", self.profile)
        _choice("--routing", self.routing, ROUTINGS)
        _choice("--combine-signature", self.combine_signature, COMBINE_SIGNATURES)
        _choice("--slot-order", self.slot_order, SLOT_ORDERS)
        for flag, v in (("--experts", self.experts), ("--top-k", self.top_k), ("--hidden", self.hidden)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioInputError(flag, f"must be a positive integer, got {v!r}")
        if isinstance(self.draft_layers, bool) or not isinstance(self.draft_layers, int) or not (
                0 <= self.draft_layers < min(len(st) for st in self.stages)):
            raise ScenarioInputError("--draft-layers", "must leave the target model a layer in every stage (0 to "
                                     f"{min(len(st) for st in self.stages) - 1} here), got {self.draft_layers!r}")
        if self.top_k not in SUPPORTED_TOP_K:
            raise ScenarioInputError("--top-k", f"the FlashInfer kernels support top_k in 1..{SUPPORTED_TOP_K[-1]} "
                                     f"(the two-sided prepare, the TRT-LLM routing tiers), got {self.top_k}")
        _choice("--expert-kernel", self.expert_kernel, EXPERT_KERNELS)
        _choice("--expert-output", self.expert_output, EXPERT_OUTPUTS)
        _choice("--invalid-expert-id", self.invalid_expert_id, INVALID_EXPERT_IDS)
        _choice("--router-ids", self.router_ids, ROUTER_ID_DTYPES)
        if isinstance(self.mx_alignment, bool) or not isinstance(self.mx_alignment, int) \
                or self.mx_alignment < 0 or self.mx_alignment % MX_BLOCK:
            raise ScenarioInputError("--mx-alignment", f"must be 0 or a positive multiple of {MX_BLOCK} "
                                     f"(whole mxfp8 scale blocks), got {self.mx_alignment!r}")
        _choice("--a2a-api", self.a2a_api, A2A_APIS)
        _choice("--backend", self.flashinfer_backend, BACKENDS)
        _choice("--level", self.level, LEVELS)
        levels = integration(self.integration).levels
        if self.level not in levels:
            raise ScenarioInputError("--level", f"--integration {self.integration} offers {', '.join(levels)}, "
                                     f"got {self.level!r}")
        self._check_backend()
        self._check_api()
        self._check_features()
        kernels = resolve(self.profile).top_k_kernels
        if self.path == "one_sided" and self.top_k not in kernels:
            raise ScenarioInputError("--top-k", f"FlashInfer {self.profile}'s one-sided kernels are instantiated for "
                                     f"top_k in {{{', '.join(map(str, kernels))}}} (SWITCH_TOP_K), got {self.top_k}")
        if self.router_weight_on_input and self.top_k != 1:
            raise ScenarioInputError("--router-weight-on-input", f"is only defined for top_k == 1, got "
                                     f"--top-k {self.top_k}")
        if self.routing in ("random", "spread", "local") and self.top_k > self.experts:
            raise ScenarioInputError("--top-k", f"routing {self.routing!r} picks {self.top_k} distinct experts "
                                     f"per token but there are only {self.experts}")
        own_kernels = self.api == "moe_ep" and self.path == "one_sided" and resolve(self.profile).moe_ep_kernels
        max_ranks = resolve(self.profile).k_max_ranks if own_kernels else MAX_EP_RANKS
        if self.ep_size > max_ranks:
            raise ScenarioInputError("--layout", f"FlashInfer supports at most {max_ranks} EP ranks "
                                     f"(kMaxRanks), the layout has {self.ep_size}")
        if self.experts < self.ep_size:
            raise ScenarioInputError("--experts", f"the dispatch needs num_experts >= ep_size "
                                     f"({self.experts} < {self.ep_size})")
        if self.path == "one_sided" and resolve(self.profile).experts_divisible \
                and self.experts % self.ep_size:
            raise ScenarioInputError("--experts", f"FlashInfer {self.profile} needs num_experts divisible by "
                                     f"ep_size ({self.experts} % {self.ep_size} != 0; non-divisible since 0.6.16)")
        if self.path != "one_sided" and self.combine_signature != "release":
            raise ScenarioInputError("--combine-signature", "applies to --path one_sided only")
        if self.api == "moe_ep":
            self._check_moe_ep()
        if (self.path == "none" or self.shared_experts and self.parts_partial) and self.hidden % lay.tp:
            raise ScenarioInputError("--hidden", f"TP-sharded experts split hidden across the {lay.tp} TP ranks; "
                                     f"{self.hidden} % {lay.tp} != 0")
        if self.path == "none" and lay.dp > 1:
            raise ScenarioInputError("--path", "expert parallel off with dp > 1 makes vLLM flatten TP across DP "
                                     "(a naive all-gather this testbed does not model); use a layout with dp = 1")
        if self.path == "two_sided":
            if self.ep_size < 2:
                raise ScenarioInputError("--layout", "the two-sided all-to-all needs an EP group of >= 2 ranks")
            if self.experts % 4 or self.experts % self.ep_size:
                raise ScenarioInputError("--experts", f"the two-sided kernels need num_experts divisible by 4 "
                                         f"and by ep_size {self.ep_size}, got {self.experts}")
        if len(self.stages) != lay.pp:
            raise ScenarioInputError("--stages", f"has {len(self.stages)} stage(s) (';'-separated) but the "
                                     f"layout has pp={lay.pp}")
        for stage in self.stages:
            if not stage:
                raise ScenarioInputError("--stages", "every pipeline stage needs at least one layer")
            for layer in stage:
                _choice("--stages", layer.fmt, FORMATS)
                if isinstance(layer.max_num_tokens, bool) or not isinstance(layer.max_num_tokens, int) \
                        or layer.max_num_tokens < 1:
                    raise ScenarioInputError("--stages", f"layer budget must be a positive integer, got "
                                             f"{layer.max_num_tokens!r} in {layer.fmt}:{layer.max_num_tokens}")
                self._check_hidden(layer.fmt)
        rule = integration(self.integration).refusal(self)
        if rule:
            raise ScenarioInputError(*rule)
        if not self.passes:
            raise ScenarioInputError("--tokens", "give at least one forward pass")
        biggest = max(layer.max_num_tokens for stage in self.stages for layer in stage)
        for counts in self.passes:
            if len(counts) != lay.dp:
                raise ScenarioInputError("--tokens", f"one count per DP rank: the layout has dp={lay.dp}, "
                                         f"got {','.join(map(str, counts))}")
            if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
                raise ScenarioInputError("--tokens", f"counts must be integers >= 0, got {counts}")
            if max(counts) > biggest:
                raise ScenarioInputError("--tokens", f"{max(counts)} tokens exceed every layer's budget "
                                         f"(largest {biggest})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ScenarioInputError("--seed", f"must be an integer >= 0, got {self.seed!r}")

    def _check_backend(self) -> None:
        """What only the fake can vary: on the real FlashInfer the release fixes the combine
        signature and the kernels choose the slot order."""
        if self.flashinfer_backend == "fake":
            return
        if self.combine_signature != "release":
            raise ScenarioInputError("--combine-signature", "the custom signatures replace the fake's combine; "
                                     f"--backend {self.flashinfer_backend} runs the release's own")
        if self.slot_order != "shuffled":
            raise ScenarioInputError("--slot-order", f"is the fake's; on --backend {self.flashinfer_backend} the "
                                     "kernels choose the order")

    def _check_api(self) -> None:
        if self.a2a_api == "auto":
            return
        if self.path not in ("one_sided", "two_sided"):
            raise ScenarioInputError("--a2a-api", "applies to the FlashInfer paths (one_sided, two_sided) only")
        if self.a2a_api not in available_apis(self.path, self.profile):
            home = _API_HOME[self.a2a_api][self.path == "two_sided"]
            raise ScenarioInputError("--a2a-api", f"FlashInfer {self.profile} does not ship flashinfer.{home}")

    def _check_moe_ep(self) -> None:
        """``moe_ep``'s own rules: its base class needs num_experts divisible by the EP size,
        and the signatures no release has are MoeAlltoAll's (the testbed replaces its combine)."""
        if self.experts % self.ep_size:
            raise ScenarioInputError("--experts", f"flashinfer.moe_ep needs num_experts divisible by the EP size "
                                     f"({self.experts} % {self.ep_size} != 0)")
        if self.top_k > self.experts:
            raise ScenarioInputError("--top-k", f"flashinfer.moe_ep's MoEEpCommParams needs top_k <= num_experts, "
                                     f"got {self.top_k} > {self.experts}")
        if self.combine_signature != "release":
            raise ScenarioInputError("--combine-signature", "the custom signatures replace MoeAlltoAll's combine; "
                                     "they need --a2a-api comm")

    def _check_features(self) -> None:
        f = self.routed_scaling
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= MAX_ROUTED_SCALING:
            raise ScenarioInputError("--routed-scaling", f"must be a finite number > 0 and <= {MAX_ROUTED_SCALING:g} "
                                     f"(larger ones overflow bf16), got {f!r}")
        if self.sequence_parallel:
            try:
                rule = self.parallel_config().sequence_parallel_rule()
            except ValueError as e:
                rule = str(e)
            if rule:
                raise ScenarioInputError("--sequence-parallel", f"{self.backend}: {rule}")
        for flag, mode in (("--defer-finalize", dict(deferred_finalize=self.defer_finalize)),
                           ("--expert-output", dict(workspace_output=self.expert_output == "workspace"))):
            try:
                support.check_supported(self.backend, "bf16", **mode)
            except support.UnsupportedFeatureError as e:
                raise ScenarioInputError(flag, str(e)) from None
        if self.expert_output == "workspace" and self.combine_signature != "release":
            raise ScenarioInputError("--expert-output", "workspace needs --combine-signature release (the custom "
                                     "signatures have no payload_in_workspace)")
        if self.late_zeroing and not (self.path == "one_sided" and self.api == "comm" and self.ep_size > 1
                                      and self.flashinfer_backend == "fake"):
            raise ScenarioInputError("--late-zeroing", "needs --path one_sided on MoeAlltoAll (--a2a-api comm), EP > 1 "
                                     "and the fake backend: it delays the fake's moe_a2a_initialize")
        if self.invalid_expert_id != "-1" and self.path != "one_sided":
            raise ScenarioInputError("--invalid-expert-id", "applies to --path one_sided only (the two-sided "
                                     "path always writes num_experts)")
        if self.expert_kernel != "reference":
            fmts = sorted({ly.fmt for st in self.stages for ly in st} - set(TRTLLM_FORMATS))
            if fmts:
                raise ScenarioInputError("--expert-kernel", f"the CPU fake implements the TRT-LLM kernels for "
                                         f"{', '.join(TRTLLM_FORMATS)}; layers of {', '.join(fmts)} need "
                                         "--expert-kernel reference")
            if self.expert_kernel == "trtllm" and not pair_routing(self.profile):
                raise ScenarioInputError("--expert-kernel", f"FlashInfer {self.profile}'s routed MoE entries do not all "
                                         "declare topk_ids as the (ids, weights) pair (packed routing; every entry "
                                         "declares it from 0.6.18): use --expert-kernel trtllm-packed")
            if self.top_k > self.experts:
                raise ScenarioInputError("--top-k", f"the TRT-LLM MoE kernels need top_k between 1 and num_experts "
                                         f"(check_routing_common), got {self.top_k} > {self.experts}")
            if self.hidden % TRTLLM_HIDDEN_BLOCK:
                raise ScenarioInputError("--hidden", f"--expert-kernel trtllm needs hidden divisible by "
                                         f"{TRTLLM_HIDDEN_BLOCK} (fp8 weight blocks, nvfp4 scale tiles), "
                                         f"got {self.hidden}")

    def _check_hidden(self, fmt: str) -> None:
        # 0.7.4's own moe_ep kernels take any row, but impl's moe_ep layer cannot tell them from
        # 0.7.2's (MoeAlltoAll underneath) and refuses such a row at an odd EP size on both;
        # vLLM and SGLang cannot run 0.7.4 (VLLM-001, SGL-002): the rule stays the packed one.
        broken = hidden_rule(fmt, self.hidden, self.path, self.mx_alignment, self.ep_size)
        if broken:
            raise ScenarioInputError("--hidden", broken)

    # -- reproduction --------------------------------------------------------------------
    def to_cli(self) -> str:
        """The ``a2a-testbed run`` line that reproduces this scenario exactly."""
        lay = self.layout
        parts = ["a2a-testbed", "run", "--layout", f"{lay.world_size},{lay.tp},{lay.dp},{lay.pp}",
                 "--stages", ";".join(",".join(map(str, st)) for st in self.stages)]
        for counts in self.passes:
            parts += ["--tokens", ",".join(map(str, counts))]
        for flag in FLAGS:
            parts += flag.written(getattr(self, flag.name))
        if self.flashinfer_backend != "fake":
            parts += ["--backend", self.flashinfer_backend]
        return shlex.join(parts)

    def short(self) -> str:
        """A one-line summary for tables."""
        stages = ";".join(",".join(map(str, st)) for st in self.stages)
        tokens = " ".join(",".join(map(str, c)) for c in self.passes)
        sig = "" if self.combine_signature == "release" else f" combine={self.combine_signature}"
        sig += " weight-on-input" if self.router_weight_on_input else ""
        sig += " SP" if self.sequence_parallel else ""
        sig += " defer" if self.defer_finalize else ""
        sig += " shared" if self.shared_experts else ""
        sig += f" scale={self.routed_scaling:g}" if self.routed_scaling != 1.0 else ""
        sig += f" {self.expert_kernel}" if self.expert_kernel != "reference" else ""
        sig += " out-in-workspace" if self.expert_output == "workspace" else ""
        sig += f" invalid={self.invalid_expert_id}" if self.invalid_expert_id != "-1" else ""
        sig += f" ids={self.router_ids}" if self.router_ids != "int32" else ""
        sig += f" mx-align={self.mx_alignment}" if self.mx_alignment else ""
        sig += " moe_ep" if self.api == "moe_ep" else ""
        sig += f" on {self.flashinfer_backend}" if self.flashinfer_backend != "fake" else ""
        sig += " sp-prefill" if self.sp_prefill else ""
        sig += f" draft={self.draft_layers}" if self.draft_layers else ""
        sig += f" block={self.block}" if self.block else ""
        sig += f" level={self.level}" if self.level != "layer" else ""
        sig += " raw-passes" if self.raw_passes else ""
        sig += " late-zeroing" if self.late_zeroing else ""
        sig += f" [{self.integration}]" if self.integration != "impl" else ""
        return (f"{self.layout} {self.path} {served_by(self.profile)} E{self.experts} K{self.top_k} H{self.hidden} "
                f"[{stages}] tokens {tokens} {self.routing}{sig}")


# The module of the fake that holds each API's one- and two-sided all-to-all.
_API_HOME = {"comm": ("comm.trtllm_moe_alltoall", "comm.trtllm_alltoall"), "moe_ep": ("moe_ep", "moe_ep")}


def available_apis(path: str, profile: str) -> tuple[str, ...]:
    """The FlashInfer APIs release ``profile`` carries FlashInfer path ``path`` on, ``comm`` first."""
    absent = resolve(profile).absent_modules
    return tuple(api for api, homes in _API_HOME.items() if homes[path == "two_sided"] not in absent)


def api_for(path: str, profile: str, a2a_api: str) -> str | None:
    """The FlashInfer API ``path`` runs on under ``profile`` (None off the FlashInfer paths):
    ``a2a_api``, or for ``auto`` the first the release offers (impl's probe decides the same)."""
    if path not in ("one_sided", "two_sided"):
        return None
    return a2a_api if a2a_api != "auto" else available_apis(path, profile)[0]


def hidden_rule(fmt: str, hidden: int, path: str, mx_alignment: int = 0, ep_size: int = 1) -> str | None:
    """The rule ``hidden`` breaks for ``fmt`` on ``path`` (mxfp8 scales padded to
    ``mx_alignment``) at EP size ``ep_size``, or None. The one-sided payloads lie back to back
    (``MoeAlltoAll``'s host code, 0.7.2.post1 ``csrc/trtllm_moe_alltoall.cu`` lines 264-271:
    ``totalBytesNeeded % elementSize == 0`` after each payload of ``epSize *
    runtimeMaxTokensPerRank`` rows), so the int32 ids after an activation row of 2 mod 4 bytes
    fail every step where ``ep_size * S`` is odd: never at an even EP size, every odd step at an
    odd one. (0.7.4's own moe_ep kernels start each payload on a 128-byte line,
    ``csrc/nvlink_one_sided_alltoall.cu`` line 897, and would take any row; see ``_check_hidden``.)"""
    block = BLOCK[fmt]
    if hidden % block:
        return f"{fmt} needs hidden divisible by {block} (one scale per {block} values), got {hidden}"
    per_token = sum(row_bytes(fmt, hidden, mx_alignment).values())
    if path == "one_sided" and per_token % 4 and ep_size % 2:
        return (f"the one-sided dispatch at an odd EP size ({ep_size}) needs {fmt} values + scales of a token "
                f"({per_token} bytes at hidden {hidden}) to be a multiple of 4: the int32 ids follow them, and "
                "MoeAlltoAll fails every step whose ep_size * runtime max tokens is odd")
    if path == "two_sided":
        for what, nbytes in row_bytes(fmt, hidden, mx_alignment).items():
            if nbytes % TWO_SIDED_ROW_UNIT:
                return (f"the two-sided kernels move rows in {TWO_SIDED_ROW_UNIT}-byte units; {fmt} {what} "
                        f"of hidden {hidden} are {nbytes} bytes per token")
    return None


def row_bytes(fmt: str, hidden: int, mx_alignment: int = 0) -> dict[str, int]:
    """Bytes per token of a format's values and scales, from the format definitions (the
    testbed's oracle; ``impl.formats.dispatch_layout`` is what is under test): an mxfp8
    token carries one scale per 32 values of ``hidden`` rounded up to ``mx_alignment``."""
    padded = -(-hidden // mx_alignment) * mx_alignment if mx_alignment else hidden
    return {
        "bf16": {"values": 2 * hidden},
        "nvfp4": {"values": hidden // 2, "scales": hidden // 16},
        "mxfp8": {"values": hidden, "scales": padded // MX_BLOCK},
        "fp8_block": {"values": hidden, "scales": hidden // 128 * 4},
    }[fmt]


def first_given(sc: "Scenario", flags) -> str | None:
    """The first of ``(flag, field, default)`` whose field the scenario sets otherwise."""
    return next((flag for flag, name, default in flags if getattr(sc, name) != default), None)


def check_release(flag: str, release: str) -> None:
    """A FlashInfer release no profile serves is a :class:`ScenarioInputError` of ``flag``."""
    try:
        resolve(release)
    except UnservedRelease as e:
        raise ScenarioInputError(flag, str(e)) from None


def _choice(flag: str, value, choices) -> None:
    if value not in choices:
        raise ScenarioInputError(flag, f"must be one of {', '.join(choices)}; got {value!r}")


# -- the command line ---------------------------------------------------------------------
_FIELDS = {f.name: f for f in fields(Scenario)}


@dataclass(frozen=True)
class Flag:
    """A :class:`Scenario` field as an ``a2a-testbed run`` flag, ``--`` and its name dashed,
    of the field's type (a bool a switch) and default, which ends its help; ``help`` may name
    ``{choices}``, the values ``choices`` lists (a callable is asked when the parser is built);
    ``always``: :meth:`Scenario.to_cli` writes it at its default too (a line that still
    reproduces the scenario when a default changes), else only where it differs."""

    name: str
    help: str
    choices: object = ()
    metavar: str | None = None
    always: bool = True

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def default(self):
        return _FIELDS[self.name].default

    @property
    def kind(self) -> type:
        return {"int": int, "float": float, "str": str, "bool": bool}[_FIELDS[self.name].type]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        choices = self.choices() if callable(self.choices) else self.choices
        text = self.help.format(choices=", ".join(choices))
        if self.kind is bool:
            parser.add_argument(self.option, action="store_true", default=None, help=text)
            return
        shown = self.default if self.default != "" else "none"
        parser.add_argument(self.option, type=self.kind, metavar=self.metavar, help=f"{text} (default {shown})")

    def written(self, value) -> list[str]:
        if self.kind is bool:
            return [self.option] if value else []
        if not self.always and value == self.default:
            return []
        return [self.option, repr(float(value)) if self.kind is float else str(value)]


def _integrations_summary() -> list[str]:
    return ["; ".join(f"{name}: {integration(name).summary}" for name in integration_names())]


FLAGS = (
    Flag("path", "all-to-all path: {choices} (none: expert parallel off), or vLLM's backend name",
         lambda: tuple(dict.fromkeys(PATHS + tuple(PATH_NAMES)))),
    Flag("profile", "FlashInfer release the fake imitates, as pip prints it: a profile ({choices}) or a release one "
                    "serves (0.6.16.post3: 0.6.16)", lambda: PROFILES, "RELEASE"),
    Flag("experts", "number of experts", metavar="E"),
    Flag("top_k", "experts per token", metavar="K"),
    Flag("hidden", "hidden size", metavar="H"),
    Flag("routing", "routing pattern: {choices}", ROUTINGS),
    Flag("combine_signature", "combine signature the fake exposes: {choices}", COMBINE_SIGNATURES),
    Flag("slot_order", "dispatch slot order: {choices}", SLOT_ORDERS),
    Flag("seed", "seed of inputs, weights and slot order"),
    Flag("router_weight_on_input", "prepare scales the activations by the router weight (top_k 1 only)"),
    Flag("sequence_parallel", "sequence-parallel MoE: each TP rank routes its chunk of the tokens "
                              "(one_sided or allgather_reducescatter, TP > 1 and DP > 1)"),
    Flag("defer_finalize", "defer_moe_finalize: the experts may hand back an unfinalized output "
                           "(taken only with expert parallel off, TP > 1, on ranks with tokens)"),
    Flag("shared_experts", "add a shared expert"),
    Flag("routed_scaling", "routed_scaling_factor applied before the shared add", metavar="F"),
    Flag("expert_kernel", "experts: {choices} (reference: linear maps; trtllm: the fake's TRT-LLM SwiGLU kernels fed "
                          "the (ids, weights) pair; trtllm-packed: fed ids and bf16 weights packed in one int32)",
         EXPERT_KERNELS),
    Flag("expert_output", "where the experts write: {choices} (workspace: the one-sided combine region)",
         EXPERT_OUTPUTS),
    Flag("invalid_expert_id", "the one-sided dispatch's sentinel: {choices}", INVALID_EXPERT_IDS),
    Flag("router_ids", "the dtype the router computes expert ids in: {choices}; a prepare/finalize whose "
                       "topk_indices_dtype() names one gets that", ROUTER_ID_DTYPES),
    Flag("mx_alignment", "mxfp8 layers pad their scale columns to cover hidden rounded up to N, a multiple of 32 "
                         "(vLLM's quant_config.mx_alignment; 0: no padding)", metavar="N"),
    Flag("a2a_api", "the FlashInfer API of a FlashInfer path: {choices} (comm: MoeAlltoAll / MnnvlMoe, gone in "
                    "0.7.4; moe_ep: flashinfer.moe_ep, from 0.7.2; auto: comm where the release has it)", A2A_APIS),
    Flag("integration", "whose code drives FlashInfer: {choices}", _integrations_summary, always=False),
    Flag("sp_prefill", "SGLang, Muse Spark's layernorm SP (TP4/EP4 or TP8/EP8 without DP attention): every pass "
                       "is a sequence-parallel prefill, each rank dispatching its slice of the rows on the model-wide "
                       "dispatcher that keeps a decode and an SP-prefill MoeAlltoAll (enable_sp_prefill_a2a); its "
                       "decode runs without the all-to-all"),
    Flag("draft_layers", "SGLang: the last N MoE layers of each stage are the speculative draft model's (MTP / "
                         "EAGLE), built in SGLang's speculative MoE context and live beside the target's", metavar="N",
         always=False),
    Flag("block", "SGLang: each MoE layer is the model family's own MoE block, built by SGLang from a tiny config "
                  "and called as its decoder layer calls it (its router hands the scenario's routing): qwen3_moe, "
                  "deepseek_v2 (shared experts, routed scaling), gpt_oss, olmoe, phimoe (none: the MoE layer alone)",
         metavar="NAME", always=False),
    Flag("level", "what of the integration runs: {choices} (layer: its MoE layer as the engine's models call it; "
                  "kernel: one level down, its prepare/finalize and kernel fed the scenario's routing as a router "
                  "left it)", LEVELS, always=False),
    Flag("raw_passes", "feed the layer the passes as given, including ones the integration's engine never makes "
                       "(vLLM: a DP rank entering with 0 tokens, a forward where every DP rank is idle); by default "
                       "the engine's step rule makes them what it would run"),
    Flag("late_zeroing", "the last rank of each EP group zeroes its MoeAlltoAll workspace row only after the first "
                         "rank has moved on (posted its dispatch or entered a collective spanning it): the race "
                         "FlashInfer before 0.7.1 leaves its caller to order with an EP barrier, made to happen "
                         "(one_sided, --a2a-api comm, the fake)"),
)
SCENARIO_FLAGS = tuple(flag.name for flag in FLAGS) + ("stages", "tokens")
# --path also takes vLLM's backend names and aliases.
PATH_NAMES = {**{backend: path for path, backend in PATH_BACKEND.items()},
              **{alias: "two_sided" for alias in support.ALIASES}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario flags of ``a2a-testbed run`` (all default to None: "not given"): the
    fields' own (:data:`FLAGS`), then the model preset, the stages, the passes and who runs
    FlashInfer."""
    from testbed.scenario.models import MODELS

    for flag in FLAGS:
        flag.add_to(parser)
    parser.add_argument("--model", metavar="NAME",
                        help=f"a real model's MoE shape: {', '.join(MODELS)} (hidden, experts, top_k, shared "
                             "expert, scaling, router weight on input, its first dispatch format and its MTP "
                             "layers; the layout defaults to EP 8: 8,1,8,1); any flag given overrides it")
    parser.add_argument("--stages", metavar="F:B,...;...",
                        help="per PP stage (';'-separated) its layers as format:max_num_tokens, "
                             f"formats {', '.join(FORMATS)} (default nvfp4:16,bf16:16 on every stage)")
    parser.add_argument("--tokens", action="append", metavar="N,N,...",
                        help="tokens per DP rank of one forward pass; repeat for more passes "
                             "(default one pass: DP rank 0 none, the others 5, 6, ...)")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="who runs FlashInfer: fake (the CPU fake, default) or flashinfer (the installed package "
                             "on this machine's GPUs, a rank per GPU, CUDA tensors over NCCL; the profile is the "
                             "installed release's; without scenario flags, the matrix's scenarios it can run)")


def scenario_given(args: argparse.Namespace) -> bool:
    """Whether the flags describe one scenario (``--integration`` alone picks whose code runs
    the matrix)."""
    return getattr(args, "model", None) is not None or \
        any(getattr(args, name) is not None for name in SCENARIO_FLAGS if name != "integration")


def from_cli(line: str) -> Scenario:
    """The scenario of an ``a2a-testbed run ...`` line of scenario flags (``Scenario.to_cli()``
    writes one)."""
    argv = shlex.split(line)
    if argv[:2] != ["a2a-testbed", "run"]:
        raise ValueError(f"not an `a2a-testbed run` line: {line!r}")
    parser = argparse.ArgumentParser(prog="a2a-testbed run")
    parser.add_argument("--layout", action="append")
    add_arguments(parser)
    args = parser.parse_args(argv[2:])
    return from_args(args, (args.layout or [None])[0])


def from_args(args: argparse.Namespace, layout_text: str | None) -> Scenario:
    """The scenario the flags describe (over ``--model``'s preset, if given);
    :class:`ScenarioInputError` for a bad one."""
    from testbed.scenario.models import model as model_shape

    preset, default_layout = {}, "4,2,2,1"
    if getattr(args, "model", None) is not None:
        try:
            shape = model_shape(args.model)
        except KeyError as e:
            raise ScenarioInputError("--model", e.args[0]) from None
        preset = shape.fields()
        default_layout = "8,1,8,1"
    try:
        layout = ParallelLayout.parse(layout_text or default_layout)
    except ValueError as e:
        raise ScenarioInputError("--layout", str(e)) from None
    value = {flag.name: preset.get(flag.name, flag.default) if getattr(args, flag.name) is None
             else getattr(args, flag.name) for flag in FLAGS}
    value["path"] = PATH_NAMES.get(value["path"], value["path"])
    if args.stages is not None:
        stages = parse_stages(args.stages)
    elif preset:
        stages = parse_stages(shape.stages(layout.pp))
    else:
        stages = tuple((Layer("nvfp4", 16), Layer("bf16", 16)) for _ in range(layout.pp))
    biggest = max((ly.max_num_tokens for st in stages for ly in st), default=1)
    passes = tuple(parse_tokens(t) for t in args.tokens) if args.tokens else \
        (tuple(0 if d == 0 and layout.dp > 1 else min(4 + d, biggest) for d in range(layout.dp)),)
    return Scenario.make(layout=layout, stages=stages, passes=passes,
                         flashinfer_backend=args.backend or "fake", **value)


def parse_stages(text: str) -> tuple[tuple[Layer, ...], ...]:
    if not text.strip():
        raise ScenarioInputError("--stages", "give each PP stage's layers as format:max_num_tokens, e.g. nvfp4:16")
    stages = []
    for stage_text in text.split(";"):
        layers = []
        for item in filter(None, stage_text.split(",")):
            fmt, sep, budget = item.partition(":")
            if not sep or not budget.strip().isdecimal():
                raise ScenarioInputError("--stages", f"each layer is format:max_num_tokens (e.g. nvfp4:64), "
                                         f"got {item!r}")
            layers.append(Layer(fmt.strip(), int(budget)))
        stages.append(tuple(layers))
    return tuple(stages)


def parse_tokens(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in text.split(","))
    except ValueError:
        raise ScenarioInputError("--tokens", f"comma-separated integers per DP rank, got {text!r}") from None


def from_text(layout: str, stages: str, tokens: str, *, validated: bool = True, **kw) -> Scenario:
    """The scenario of a layout, stages and passes as the command line writes them
    (``"4,2,2,1"``, ``"nvfp4:8,bf16:8;bf16:8"``, ``"0,5 3,4"``: passes space-separated);
    ``validated=False`` leaves the rules to its use (a matrix entry whose rule depends on the
    engine release installed)."""
    made = Scenario.make if validated else Scenario
    return made(layout=ParallelLayout.parse(layout), stages=parse_stages(stages),
                passes=tuple(tuple(int(n) for n in p.split(",")) for p in tokens.split()), **kw)
