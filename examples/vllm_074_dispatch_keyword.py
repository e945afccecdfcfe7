"""VLLM-001, standalone: vLLM 0.33.0's one-sided prepare on FlashInfer 0.7.4's moe_ep.

vLLM's ``FlashInferNVLinkOneSidedPrepareAndFinalize.prepare`` calls
``communication.dispatch(..., max_tokens_per_rank=S)``; FlashInfer 0.7.4's
``NVLinkOneSidedAlltoAll.dispatch`` takes ``runtime_max_tokens_per_rank`` (keyword-only) and
no longer ``max_tokens_per_rank``. This checks vLLM's call against each release's signature,
in one process, on the CPU fake (whose signatures the contract check holds to the real ones).

    python examples/vllm_074_dispatch_keyword.py      # exit 1 while the finding holds
"""

import ast
import importlib.util
import inspect
import sys

import fakes.flashinfer


def vllm_dispatch_keywords() -> set[str]:
    """The keywords vLLM's one-sided prepare passes to ``communication.dispatch``."""
    spec = importlib.util.find_spec("vllm.model_executor.layers.fused_moe.prepare_finalize."
                                    "flashinfer_nvlink_one_sided")
    tree = ast.parse(open(spec.origin).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "dispatch":
            return {kw.arg for kw in node.keywords}
    raise SystemExit("no dispatch call found in vLLM's one-sided prepare")


def main() -> int:
    passed = vllm_dispatch_keywords()
    broken = False
    for release in ("0.7.2", "0.7.4"):
        with fakes.flashinfer.install(release):
            from flashinfer.moe_ep import NVLinkOneSidedAlltoAll

            takes = set(inspect.signature(NVLinkOneSidedAlltoAll.dispatch).parameters)
        missing = sorted(passed - takes)
        print(f"FlashInfer {release}: vLLM passes {sorted(passed)}; "
              + (f"dispatch() has no {missing}: TypeError" if missing else "all accepted"))
        broken |= bool(missing)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
