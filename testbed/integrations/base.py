"""What an integration is and declares, for the harness above it.

An integration is the code that drives FlashInfer's all-to-all from an inference engine:
``impl`` (this project's reference re-creation of the seed pull requests), ``vllm`` (the
installed vLLM's own classes), ``sglang`` (the installed SGLang's own dispatcher), or any other
package registered in :mod:`testbed.integrations`. Each is one package whose face is an
:class:`Integration`: on a rank it stands up its engine's state (:meth:`Integration.start`),
builds each MoE layer around the testbed's experts and brackets every forward pass and layer
call as its engine does; for the harness it declares its scenario rules, its matrix, its fuzz
strategy, its mutants, its known findings and, for another project's code, the engine to
install and the files the consumer contract reads. What the invariants need from it besides
the event log is declared (:class:`Traits`), never inferred from its name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, Optional, Protocol

import torch

if TYPE_CHECKING:
    from testbed.contract.consumer import Consumer
    from testbed.integrations.engine import Engine
    from testbed.scenario.engine import EngineScenario
    from testbed.scenario.model import Scenario


class AdapterSetupError(RuntimeError):
    """The adapter could not stand its engine up on this rank (the engine's config, platform or
    workspace manager, built by the testbed as the engine's launcher would): the testbed's own
    trouble, reported as its error and never as a FAIL of the engine."""


@contextlib.contextmanager
def adapter_setup(what: str) -> Iterator[None]:
    """Whatever ``what`` (``building vLLM 0.21.0's VllmConfig``) raises becomes an
    :class:`AdapterSetupError` naming it."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - any failure of the testbed's own set-up is the testbed's
        raise AdapterSetupError(f"{what}: {type(e).__name__}: {e}") from e


@dataclass(frozen=True)
class Traits:
    """What an integration promises that the invariants check it against.

    ``shared_communication``: one ``moe_ep`` communication for every layer of the EP group,
    replaced (never shrunk) when a layer needs more (vLLM's manager), instead of one per
    layer sizing (impl's). (Whether the caller barriers after a build is FlashInfer's contract
    per release, which binds every integration: not a trait.) ``code``: the integration's
    source as ``(real path prefix, shown name)`` pairs: collectives from these frames are its.
    ``fixed_capacity``: one ``MoeAlltoAll`` per layer, all at one token capacity, sharing a
    workspace through FlashInfer's size-keyed cache (SGLang's), instead of one grown to each
    layer's need. ``combine_output``: the integration probes combine for ``output=`` and
    passes it wherever the release takes it (impl's); one that never does is not wrong.
    ``sp_pads_routed``: under sequence parallel the model pads each DP rank's tokens to a
    multiple of TP before its gate, so the padding rows are routed and reach the experts
    (vLLM's models: ``sequence_parallel_chunk`` comes before the gate), instead of splitting
    the tokens unevenly. ``shared_tp_sharded``: the shared experts are TP-sharded (a partial
    sum the layer reduces) wherever the layer is not sequence parallel (vLLM's models:
    ``disable_tp=is_sequence_parallel``), instead of sharded only where the routed experts are.
    ``expert_output_by_scenario``: the experts write into the combine region exactly when the
    scenario asks (``--expert-output``, impl's); an integration whose own code decides it (vLLM's
    modular kernel, from the prepare's ``allocate_fused_expert_output``) is not held to the flag.
    """

    shared_communication: bool
    code: tuple[tuple[str, str], ...]
    fixed_capacity: bool = False
    combine_output: bool = True
    sp_pads_routed: bool = False
    shared_tp_sharded: bool = False
    expert_output_by_scenario: bool = True


class Layer(Protocol):
    """One MoE layer as the integration built it: ``layer(x_TH, w_TK, ids_TK) -> [T, H]``. A
    layer whose router folds a routed scaling factor into the weights it hands the experts
    says so in ``weights_scale`` (a float; absent: 1.0)."""

    sequence_parallel: bool
    reduce_pending: bool

    def output_is_reduced(self) -> bool: ...

    def topk_indices_dtype(self) -> Optional[torch.dtype]: ...

    def __call__(self, x_TH: torch.Tensor, w_TK: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor: ...


class Session(Protocol):
    """An integration on one rank for one scenario."""

    def build_layer(self, index: int, fmt: str, max_num_tokens: int, experts) -> Layer: ...

    def forward_pass(self, num_tokens: int) -> ContextManager[None]:
        """The engine's state around one forward pass of this rank's stage (``num_tokens``:
        this rank's tokens in it)."""

    def layer_call(self, num_tokens: int) -> ContextManager[None]:
        """Around one layer's call inside a forward pass."""


@dataclass(frozen=True)
class Mutant:
    """A small, realistic wrong change to one function of the integration's code, applied at
    run time in the rank processes (:mod:`testbed.harness.mutants`): ``old`` replaced by
    ``new`` in ``target`` (``"module:Function"`` or ``"module:Class.method"``), or one of
    ``forms``, the same change where another release writes the code otherwise. ``expect``
    says how the testbed must catch it: ``(invariant, piece of its evidence)`` pairs, any one
    kills it; ``("tests", piece)`` with ``tests`` the pytest ids that must fail instead, where
    scenarios cannot reach it (a refusal of bad input, a checkpoint)."""

    name: str
    description: str
    target: str
    old: str
    new: str
    expect: tuple[tuple[str, str], ...]
    tests: tuple[str, ...] = ()
    # The same change as other releases of the integration's code write it: ``(old, new)``
    # pairs, the first whose ``old`` occurs once in the target taken (after ``old`` itself).
    forms: tuple[tuple[str, str], ...] = ()
    # A capability probe of the integration's release: why it has none of the code the change
    # is about (one line; the mutant is then not applicable there), or None.
    requires: Optional[Callable[[], Optional[str]]] = None
    # A probe of the release: why the change, though its code is there, changes nothing the
    # release does (a guard it always passes through undoes it; one line naming that guard),
    # or None. The mutant is then equivalent there: not hunted, and reported as such.
    equivalent: Optional[Callable[[], Optional[str]]] = None
    # A probe of the release: why every deployment that reaches the change already fails, in the
    # invariants that catch the mutant, by a finding of the release's own (one line naming it),
    # or None. The mutant is then masked there: not hunted, and reported as such.
    masked: Optional[Callable[[], Optional[str]]] = None
    # Where only the engine served as users serve it runs the changed code (its own serving
    # loop, its engine cores' coordination): what runs it there, in words. The layer and engine
    # levels report it as not applicable, naming ``a2a-testbed serve --mutant``, which hunts it.
    served: str = ""

    @classmethod
    def of(cls, name, description, target, old, new, *expect, tests=(), forms=(), requires=None,
           equivalent=None, masked=None, served="") -> "Mutant":
        """A catalogue entry as written: the ``expect`` pairs after the change, tests, other
        releases' forms, the capability it needs and its equivalence probe by keyword."""
        return cls(name, description, target, old, new, tuple(expect), tuple(tests), tuple(forms), requires,
                   equivalent, masked, served)

    def not_applicable(self) -> Optional[tuple[str, str]]:
        """``(kind, why)`` this mutant is not hunted on the release: ``absent`` (the release has
        none of the code it changes), ``equivalent`` (its change is undone on every path) or
        ``masked`` (a finding of the release's fails every deployment it reaches the same way),
        or None; ``served`` where only a served engine runs its code (:attr:`served`), after
        those (a served hunt asks :meth:`not_applicable_served`)."""
        found = self.not_applicable_served()
        if found is None and self.served:
            return "served", (f"only a served engine runs it ({self.served}): `a2a-testbed serve --mutant "
                              f"{self.name}` hunts it")
        return found

    def not_applicable_served(self) -> Optional[tuple[str, str]]:
        """As :meth:`not_applicable`, for a hunt on the served engine, which runs every level's code."""
        for kind, probe in (("absent", self.requires), ("equivalent", self.equivalent), ("masked", self.masked)):
            why = probe() if probe is not None else None
            if why:
                return kind, why
        return None

    @property
    def needs_scenarios(self) -> bool:
        return any(kind != "tests" for kind, _ in self.expect)


@dataclass(frozen=True)
class Finding:
    """A failure the testbed shows in code it did not write, written up in
    ``docs/findings.md`` under ``id``: the scenarios it applies to (a property, never a list)
    and how it fails there, ``(invariant, piece of its evidence)`` pairs, the first its
    signature (what must show), the rest what may follow from it. ``reachable``: whether the
    engine itself, run as its users run it, produces the scenarios it applies to (``yes``,
    ``no``: latent, what a direct caller of the code hits; ``not checked``), and ``evidence``
    for that answer."""

    id: str
    title: str
    applies: Callable[["Scenario"], bool]
    expect: tuple[tuple[str, str], ...]
    reachable: str = "not checked"
    evidence: str = ""
    # The ``a2a-testbed run`` line of a scenario that shows it, where no entry of the
    # integration's matrix does (a latent finding: raw passes, the kernel level).
    reproducer: str = ""
    # Where it lives in the engine's code, ``(file of the release, regular expression)`` pairs
    # that all match in a release that has it (a tuple of files: the first the release has,
    # where the file moved between releases): a release where one does not is judged as if
    # the finding were never written (it is gone there: :func:`testbed.harness.findings.gone`).
    # Empty for a finding of FlashInfer's, which ``applies`` decides by the release's profile.
    code: tuple[tuple[str, str], ...] = ()
    # How many of the first pairs of ``expect`` are its signature: a bug that fails one of
    # several ways by the scenario's shape (a check of FlashInfer's, or of the testbed's, that
    # trips first) shows when any of them does.
    signatures: int = 1

    def shows(self, failures) -> bool:
        """Whether its signature shows among ``failures`` (:class:`Failure`)."""
        return any(g.invariant == inv and piece in g.evidence for inv, piece in self.expect[:self.signatures]
                   for g in failures)


class Integration:
    """One integration's face. A package overrides what it has; the defaults are an
    integration of no engine, no matrix of its own, no mutants and no known findings."""

    name: str
    summary: str  # what --integration NAME runs, for the help and the docs
    engine: Optional["Engine"] = None  # another project's code: what to install and probe
    # Whether the matrix moved to this integration is what it hunts its mutants with, after
    # its own entries (the engines'); impl's mutants are hunted by the matrix as it is.
    own_matrix_first: bool = True
    # What of it a scenario can drive (testbed.scenario.model.LEVELS): its MoE layer, and
    # where it has one apart, the all-to-all seam below it.
    levels: tuple[str, ...] = ("layer",)

    # -- the scenario model asks these (testbed.scenario.model) -----------------------------
    def api(self, sc: "Scenario") -> Optional[str]:
        """The FlashInfer API the integration runs ``sc.path`` on (None off the FlashInfer paths)."""
        from testbed.scenario.model import api_for

        return api_for(sc.path, sc.profile, sc.a2a_api)

    def refusal(self, sc: "Scenario") -> Optional[tuple[str, str]]:
        """``(flag, rule)`` a scenario breaks under this integration, or None."""
        return sglang_flags_elsewhere(sc)

    def engine_passes(self, sc: "Scenario") -> tuple[tuple[int, ...], ...]:
        """The passes the integration's engine makes of ``sc.passes`` (only called when the
        scenario does not ask for the raw ones). The default: the passes as given, for an
        integration with no engine or whose step rule the testbed has not learned."""
        return sc.passes

    # -- a rank asks these -------------------------------------------------------------------
    def traits(self, sc: "Scenario") -> Traits:
        raise NotImplementedError

    def start(self, ctx, sc: "Scenario", api, log) -> Session:
        raise NotImplementedError

    def prepare_environment(self) -> None:
        """What must hold in a process before the integration's code is imported there."""
        if self.engine is not None:
            self.engine.prepare_environment()

    # -- the harness asks these --------------------------------------------------------------
    def matrix(self) -> tuple["Scenario", ...]:
        """The integration's own matrix entries (run before the common matrix moved to it)."""
        return ()

    def strategy(self):
        """The Hypothesis strategy of the scenarios ``a2a-testbed fuzz --integration`` draws."""
        raise NotImplementedError(f"--integration {self.name} has no fuzz strategy")

    def mutants(self) -> tuple[Mutant, ...]:
        return ()

    def findings(self) -> tuple[Finding, ...]:
        return ()

    def consumer(self) -> Optional["Consumer"]:
        """What ``a2a-testbed contract --consumer NAME`` reads of the engine (None: not an engine)."""
        return None

    # -- the engine level (a2a-testbed engine) -------------------------------------------------
    def engine_matrix(self) -> tuple["EngineScenario", ...]:
        """The engine scenarios ``a2a-testbed engine`` runs (none: no engine level)."""
        return ()

    def has_engine_level(self) -> bool:
        """Whether :meth:`engine_matrix` has entries, without building them (building an
        engine's entries imports the engine)."""
        return type(self).engine_matrix is not Integration.engine_matrix

    def engine_code(self) -> tuple[tuple[str, str], ...]:
        """The engine's MoE layer code, as :attr:`Traits.code`: the collectives of an engine
        run the audit records (the rest of the model's are not the all-to-all's)."""
        raise NotImplementedError(f"--integration {self.name} has no engine level")

    def run_engine(self, ctx, sc: "Scenario", es: "EngineScenario", model_dir: str, log, reference: bool) -> dict:
        """On a rank: the engine deployed as ``es`` generating from the checkpoint in
        ``model_dir`` (``reference``: one rank, expert parallel off, every prompt), logging
        each MoE layer built and called (``LayerBuilt``, ``ForwardStart`` / ``ForwardEnd`` with
        the engine's forward as the pass). Returns ``{"logprobs": [per prompt: [L - 1]],
        "tokens", "prepares": [(layer, rows, DP token counts)] in call order, "generate_from":
        the first of them in generation (those before ran while the engine was built)}``."""
        raise NotImplementedError(f"--integration {self.name} has no engine level")


def sglang_flags_elsewhere(sc: "Scenario") -> Optional[tuple[str, str]]:
    """The rule of SGLang's own flags (``--sp-prefill``, ``--draft-layers``, ``--block``) under an
    integration that is not SGLang's."""
    if sc.sp_prefill:
        return "--sp-prefill", "is SGLang's (Muse Spark): it goes with --integration sglang"
    if sc.draft_layers:
        return "--draft-layers", ("is SGLang's (its speculative MoE context builds the draft model's dispatchers): it "
                                  "goes with --integration sglang")
    if sc.block:
        return "--block", "names one of SGLang's model MoE blocks: it goes with --integration sglang"
    return None
