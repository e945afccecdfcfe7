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
from dataclasses import dataclass, field

from fakes.flashinfer.profiles import PROFILES as FAKE_PROFILES
from testbed.cluster.layout import ParallelLayout

PATHS = ("one_sided", "two_sided")
FORMATS = ("bf16", "nvfp4", "mxfp8", "fp8_block")
ROUTINGS = ("random", "spread", "local", "hotspot", "one-expert")
# How the fake's combine signature looks to the capability probe: the release's own, or one
# no release has (keyword-only ``output``, ``**kwargs`` only, ``output`` positional-only, or
# no inspectable signature at all, as a C-extension function has).
COMBINE_SIGNATURES = ("release", "kw-only", "kwargs-only", "positional-only", "opaque")
SLOT_ORDERS = ("shuffled", "deterministic")
PROFILES = tuple(FAKE_PROFILES)
# The TRT-LLM MoE routing kernels take at most 8 experts per token (the one-sided all-to-all
# itself allows kMaxTopK = 22, the two-sided one 32).
SUPPORTED_TOP_K = tuple(range(1, 9))
# Bytes one received row of each format occupies per value block; the two-sided kernels move
# rows in 16-byte units, so every payload row (values and scales) must fill whole units.
TWO_SIDED_ROW_UNIT = 16
BLOCK = {"bf16": 1, "nvfp4": 16, "mxfp8": 32, "fp8_block": 128}
MAX_EP_RANKS = 64  # kMaxRanks of the one-sided kernels


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
    label: str = field(default="", compare=False)

    @classmethod
    def make(cls, **kw) -> "Scenario":
        s = cls(**kw)
        s.validate()
        return s

    # -- derived facts -------------------------------------------------------------------
    @property
    def ep_size(self) -> int:
        return self.layout.ep_size

    def tokens(self, pass_idx: int, layer: Layer, dp_rank: int) -> int:
        """Tokens DP rank ``dp_rank`` hands ``layer`` in pass ``pass_idx``."""
        return min(self.passes[pass_idx][dp_rank], layer.max_num_tokens)

    def combine_takes_output(self) -> bool:
        """Whether the combine this scenario's fake exposes accepts ``output=`` by keyword
        (what the integration's probe must find, and then use)."""
        if self.combine_signature == "release":
            return FAKE_PROFILES[self.profile].combine_output_kw
        return self.combine_signature == "kw-only"

    # -- validation ----------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ScenarioInputError` naming the flag and the rule it breaks."""
        lay = self.layout
        _choice("--path", self.path, PATHS)
        _choice("--profile", self.profile, PROFILES)
        _choice("--routing", self.routing, ROUTINGS)
        _choice("--combine-signature", self.combine_signature, COMBINE_SIGNATURES)
        _choice("--slot-order", self.slot_order, SLOT_ORDERS)
        for flag, v in (("--experts", self.experts), ("--top-k", self.top_k), ("--hidden", self.hidden)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioInputError(flag, f"must be a positive integer, got {v!r}")
        if self.top_k not in SUPPORTED_TOP_K:
            raise ScenarioInputError("--top-k", f"the MoE kernels support top_k in 1..{SUPPORTED_TOP_K[-1]}, "
                                     f"got {self.top_k}")
        if self.router_weight_on_input and self.top_k != 1:
            raise ScenarioInputError("--router-weight-on-input", f"is only defined for top_k == 1, got "
                                     f"--top-k {self.top_k}")
        if self.routing in ("random", "spread", "local") and self.top_k > self.experts:
            raise ScenarioInputError("--top-k", f"routing {self.routing!r} picks {self.top_k} distinct experts "
                                     f"per token but there are only {self.experts}")
        if self.ep_size > MAX_EP_RANKS:
            raise ScenarioInputError("--layout", f"FlashInfer supports at most {MAX_EP_RANKS} EP ranks "
                                     f"(kMaxRanks), the layout has {self.ep_size}")
        if self.experts < self.ep_size:
            raise ScenarioInputError("--experts", f"the dispatch needs num_experts >= ep_size "
                                     f"({self.experts} < {self.ep_size})")
        if self.path == "one_sided" and FAKE_PROFILES[self.profile].experts_divisible \
                and self.experts % self.ep_size:
            raise ScenarioInputError("--experts", f"FlashInfer {self.profile} needs num_experts divisible by "
                                     f"ep_size ({self.experts} % {self.ep_size} != 0; non-divisible since 0.6.16)")
        if self.path == "two_sided":
            if self.ep_size < 2:
                raise ScenarioInputError("--layout", "the two-sided all-to-all needs an EP group of >= 2 ranks")
            if self.experts % 4 or self.experts % self.ep_size:
                raise ScenarioInputError("--experts", f"the two-sided kernels need num_experts divisible by 4 "
                                         f"and by ep_size {self.ep_size}, got {self.experts}")
            if self.combine_signature != "release":
                raise ScenarioInputError("--combine-signature", "applies to --path one_sided only")
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

    def _check_hidden(self, fmt: str) -> None:
        broken = hidden_rule(fmt, self.hidden, self.path)
        if broken:
            raise ScenarioInputError("--hidden", broken)

    # -- reproduction --------------------------------------------------------------------
    def to_cli(self) -> str:
        """The ``a2a-testbed run`` line that reproduces this scenario exactly."""
        lay = self.layout
        parts = ["a2a-testbed", "run",
                 "--layout", f"{lay.world_size},{lay.tp},{lay.dp},{lay.pp}",
                 "--path", self.path, "--profile", self.profile,
                 "--experts", str(self.experts), "--top-k", str(self.top_k), "--hidden", str(self.hidden),
                 "--stages", ";".join(",".join(map(str, st)) for st in self.stages)]
        for counts in self.passes:
            parts += ["--tokens", ",".join(map(str, counts))]
        parts += ["--routing", self.routing, "--combine-signature", self.combine_signature,
                  "--slot-order", self.slot_order, "--seed", str(self.seed)]
        if self.router_weight_on_input:
            parts.append("--router-weight-on-input")
        return shlex.join(parts)

    def short(self) -> str:
        """A one-line summary for tables."""
        stages = ";".join(",".join(map(str, st)) for st in self.stages)
        tokens = " ".join(",".join(map(str, c)) for c in self.passes)
        sig = "" if self.combine_signature == "release" else f" combine={self.combine_signature}"
        sig += " weight-on-input" if self.router_weight_on_input else ""
        return (f"{self.layout} {self.path} {self.profile} E{self.experts} K{self.top_k} H{self.hidden} "
                f"[{stages}] tokens {tokens} {self.routing}{sig}")


def hidden_rule(fmt: str, hidden: int, path: str) -> str | None:
    """The rule ``hidden`` breaks for ``fmt`` on ``path``, or None."""
    block = BLOCK[fmt]
    if hidden % block:
        return f"{fmt} needs hidden divisible by {block} (one scale per {block} values), got {hidden}"
    per_token = sum(row_bytes(fmt, hidden).values())
    if path == "one_sided" and per_token % 4:
        return (f"the one-sided dispatch needs {fmt} values + scales of a token ({per_token} bytes at hidden "
                f"{hidden}) to be a multiple of 4: the int32 ids follow them")
    if path == "two_sided":
        for what, nbytes in row_bytes(fmt, hidden).items():
            if nbytes % TWO_SIDED_ROW_UNIT:
                return (f"the two-sided kernels move rows in {TWO_SIDED_ROW_UNIT}-byte units; {fmt} {what} "
                        f"of hidden {hidden} are {nbytes} bytes per token")
    return None


def row_bytes(fmt: str, hidden: int) -> dict[str, int]:
    """Bytes per token of a format's values and scales, from the format definitions (the
    testbed's oracle; ``impl.formats.dispatch_layout`` is what is under test)."""
    return {
        "bf16": {"values": 2 * hidden},
        "nvfp4": {"values": hidden // 2, "scales": hidden // 16},
        "mxfp8": {"values": hidden, "scales": hidden // 32},
        "fp8_block": {"values": hidden, "scales": hidden // 128 * 4},
    }[fmt]


def _choice(flag: str, value, choices) -> None:
    if value not in choices:
        raise ScenarioInputError(flag, f"must be one of {', '.join(choices)}; got {value!r}")


# -- the command line ---------------------------------------------------------------------
SCENARIO_FLAGS = ("path", "profile", "experts", "top_k", "hidden", "stages", "tokens", "routing",
                  "combine_signature", "slot_order", "seed", "router_weight_on_input")
DEFAULTS = {"path": "one_sided", "profile": "0.7.2", "experts": 8, "top_k": 2, "hidden": 256,
            "stages": None, "routing": "random", "combine_signature": "release",
            "slot_order": "shuffled", "seed": 0, "router_weight_on_input": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scenario flags of ``a2a-testbed run`` (all default to None: "not given")."""
    parser.add_argument("--path", help=f"all-to-all path: {', '.join(PATHS)} (default one_sided)")
    parser.add_argument("--profile", help=f"FlashInfer release the fake imitates: {', '.join(PROFILES)} "
                                          "(default 0.7.2)")
    parser.add_argument("--experts", type=int, metavar="E", help="number of experts (default 8)")
    parser.add_argument("--top-k", type=int, metavar="K", help="experts per token (default 2)")
    parser.add_argument("--hidden", type=int, metavar="H", help="hidden size (default 256)")
    parser.add_argument("--stages", metavar="F:B,...;...",
                        help="per PP stage (';'-separated) its layers as format:max_num_tokens, "
                             f"formats {', '.join(FORMATS)} (default nvfp4:16,bf16:16 on every stage)")
    parser.add_argument("--tokens", action="append", metavar="N,N,...",
                        help="tokens per DP rank of one forward pass; repeat for more passes "
                             "(default one pass: DP rank 0 none, the others 5, 6, ...)")
    parser.add_argument("--routing", help=f"routing pattern: {', '.join(ROUTINGS)} (default random)")
    parser.add_argument("--combine-signature", help=f"combine signature the fake exposes: "
                                                    f"{', '.join(COMBINE_SIGNATURES)} (default release)")
    parser.add_argument("--slot-order", help=f"dispatch slot order: {', '.join(SLOT_ORDERS)} (default shuffled)")
    parser.add_argument("--seed", type=int, help="seed of inputs, weights and slot order (default 0)")
    parser.add_argument("--router-weight-on-input", action="store_true", default=None,
                        help="prepare scales the activations by the router weight (top_k 1 only)")


def scenario_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, name) is not None for name in SCENARIO_FLAGS)


def from_args(args: argparse.Namespace, layout_text: str | None) -> Scenario:
    """The scenario the flags describe; :class:`ScenarioInputError` for a bad one."""
    try:
        layout = ParallelLayout.parse(layout_text or "4,2,2,1")
    except ValueError as e:
        raise ScenarioInputError("--layout", str(e)) from None
    value = {name: DEFAULTS[name] if getattr(args, name) is None else getattr(args, name)
             for name in SCENARIO_FLAGS if name not in ("stages", "tokens")}
    stages = parse_stages(args.stages) if args.stages is not None else \
        tuple((Layer("nvfp4", 16), Layer("bf16", 16)) for _ in range(layout.pp))
    biggest = max((ly.max_num_tokens for st in stages for ly in st), default=1)
    passes = tuple(parse_tokens(t) for t in args.tokens) if args.tokens else \
        (tuple(0 if d == 0 and layout.dp > 1 else min(4 + d, biggest) for d in range(layout.dp)),)
    return Scenario.make(layout=layout, stages=stages, passes=passes, **value)


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
