"""An engine scenario: an integration's own engine generating from a tiny checkpoint on a
deployment shape, the level above its MoE layer (``a2a-testbed engine``).

What varies is what an engine run is deployed as (DP, TP, the all-to-all path, the
checkpoint's architecture) and what it is asked (each DP rank's prompts, as lengths, and the
tokens each generates); the steps, the token counts every layer sees and the dummy batches
are the engine's. Every rank rebuilds every prompt from the seed, so the reference run (DP 1,
expert parallel off, every prompt on one rank) sees the same token ids.

The rounds the engine made are judged as a layer :class:`~testbed.scenario.model.Scenario`
(:meth:`EngineScenario.scenario`) whose passes are the token counts the engine's forward
context gave each DP rank, step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from testbed.cluster.layout import ParallelLayout
from testbed.scenario.checkpoint import ARCHITECTURES, Checkpoint, at_model_shape
from testbed.scenario.models import MODELS
from testbed.scenario.model import Layer, Scenario, ScenarioInputError, check_release

ENGINE_PATHS = ("one_sided", "two_sided")
DTYPES = ("float32", "bfloat16")
FIRST_TOKEN_ID = 3  # below it: pad, bos, eos


@dataclass(frozen=True)
class EngineScenario:
    """``prompts[d]``: DP rank ``d``'s prompts as lengths; ``max_tokens[d]``: the tokens each of
    them generates (uneven, so DP ranks go idle at different steps)."""

    dp: int
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]
    tp: int = 1
    path: str = "one_sided"
    arch: str = "qwen3-moe"
    model: str = ""  # a real model's MoE shape (testbed.scenario.models) in its family's arch, or none
    integration: str = "vllm"
    budget: int = 64  # the scheduler's max_num_batched_tokens: every MoE layer's max_num_tokens
    dtype: str = "float32"  # the model's activations, and so the dispatched rows (or "bfloat16")
    profile: str = "0.7.2.post1"  # vLLM 0.33.0's pin
    seed: int = 0
    label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for flag, v in (("--dp", self.dp), ("--tp", self.tp), ("--budget", self.budget)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioInputError(flag, f"must be a positive integer, got {v!r}")
        if self.path not in ENGINE_PATHS:
            raise ScenarioInputError("--path", f"the engine runs {', '.join(ENGINE_PATHS)}, got {self.path!r}")
        check_release("--profile", self.profile)
        if self.dtype not in DTYPES:
            raise ScenarioInputError("--dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.arch not in ARCHITECTURES:
            raise ScenarioInputError("--arch", f"must be one of {', '.join(ARCHITECTURES)}, got {self.arch!r}")
        if self.model:
            built = [name for name, m in MODELS.items() if m.checkpoint_arch]
            shape = MODELS.get(self.model)
            if shape is None or shape.checkpoint_arch is None:
                raise ScenarioInputError("--model", f"the engine level writes checkpoints of {', '.join(built)} (their "
                                         f"families' blocks: {', '.join(ARCHITECTURES)}), got {self.model!r}")
            if self.arch != shape.checkpoint_arch:
                raise ScenarioInputError("--arch", f"{self.model} is a {shape.checkpoint_arch} checkpoint, got "
                                         f"{self.arch!r}")
        if len(self.prompts) != self.dp or len(self.max_tokens) != self.dp:
            raise ScenarioInputError("--prompts", f"one prompt list and one --max-tokens per DP rank ({self.dp}), got "
                                     f"{len(self.prompts)} and {len(self.max_tokens)}")
        if not any(self.prompts):
            raise ScenarioInputError("--prompts", "at least one DP rank needs a prompt")
        longest = max((n for rank in self.prompts for n in rank), default=0) + max(self.max_tokens)
        if any(n < 2 for rank in self.prompts for n in rank) or longest > self.max_model_len:
            raise ScenarioInputError("--prompts", f"a prompt is 2 tokens or more (its logprobs start at the second), "
                                     f"and with its generated tokens at most {self.max_model_len}")
        if any(t < 1 for t in self.max_tokens):
            raise ScenarioInputError("--max-tokens", f"each DP rank generates at least 1 token, got {self.max_tokens}")

    @property
    def max_model_len(self) -> int:
        return 2 * self.budget

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(world_size=self.dp * self.tp, tp=self.tp, dp=self.dp, pp=1)

    def checkpoint(self) -> Checkpoint:
        if self.model:
            return at_model_shape(MODELS[self.model], self.seed)
        return Checkpoint(arch=self.arch, seed=self.seed)

    def prompt_ids(self, dp_rank: int) -> tuple[tuple[int, ...], ...]:
        """DP rank ``dp_rank``'s prompts as token ids (any rank can rebuild any rank's)."""
        vocab = self.checkpoint().vocab
        out = []
        for i, length in enumerate(self.prompts[dp_rank]):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + dp_rank * 1009 + i)
            out.append(tuple(torch.randint(FIRST_TOKEN_ID, vocab, (length,), generator=g).tolist()))
        return tuple(out)

    def scenario(self, passes: tuple[tuple[int, ...], ...], sequence_parallel: bool) -> Scenario:
        """The rounds of this run as a layer scenario: every MoE layer of the checkpoint at the
        budget, ``passes[p][d]`` DP rank ``d``'s tokens in the engine's forward ``p``."""
        ck = self.checkpoint()
        return Scenario(layout=self.layout, stages=(tuple(Layer("bf16", self.budget) for _ in range(ck.layers)),),
                        passes=passes, path=self.path, profile=self.profile, experts=ck.experts, top_k=ck.top_k,
                        hidden=ck.hidden, seed=self.seed, sequence_parallel=sequence_parallel,
                        shared_experts=ck.shared_experts > 0, routed_scaling=ck.routed_scaling,
                        integration=self.integration, label=self.label)

    def to_cli(self) -> str:
        """The ``a2a-testbed engine`` line that runs this scenario."""
        prompts = " ".join(",".join(map(str, p)) or "-" for p in self.prompts)
        line = (f"a2a-testbed engine --integration {self.integration} --dp {self.dp} --tp {self.tp} --path {self.path} "
                f"{f'--model {self.model}' if self.model else f'--arch {self.arch}'} --prompts '{prompts}' "
                f"--max-tokens {','.join(map(str, self.max_tokens))} "
                f"--dtype {self.dtype} --budget {self.budget} --seed {self.seed}")
        return line + (f" --profile {self.profile}" if self.profile != EngineScenario.profile else "")

    def describe(self) -> str:
        lengths = " | ".join(",".join(map(str, p)) or "-" for p in self.prompts)
        return (f"{self.model or self.arch} {self.dtype} DP{self.dp} TP{self.tp} {self.path}: prompts {lengths}, max_tokens "
                f"{','.join(map(str, self.max_tokens))}")


def parse_prompts(text: str) -> tuple[tuple[int, ...], ...]:
    """``"5,11 7 -"`` -> ``((5, 11), (7,), ())``: per DP rank (space-separated) its prompts'
    lengths (comma-separated; ``-`` none)."""
    try:
        return tuple(() if rank == "-" else tuple(int(n) for n in rank.split(",")) for rank in text.split())
    except ValueError:
        raise ScenarioInputError("--prompts", f"per DP rank (space-separated) comma-separated prompt lengths, or - "
                                 f"for none (e.g. '5,11 7'), got {text!r}") from None
