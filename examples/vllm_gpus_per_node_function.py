"""VLLM-005, standalone: vLLM 0.33.0 hands FlashInfer's ``Mapping`` a function as ``gpus_per_node``.

``FlashInferNVLinkTwoSidedManager.ensure_alltoall_workspace_initialized`` passes
``gpus_per_node=torch.accelerator.device_count`` (not called) to ``initialize``, which builds
``Mapping(world_size, rank, gpus_per_node, tp_size=world_size)``. This reads the call in vLLM's
source and builds the ``Mapping`` it would (the fake's, which computes like flashinfer
0.7.2.post1's ``comm/mapping.py``): its ``local_rank`` then divides by a function.

    python examples/vllm_gpus_per_node_function.py    # exit 1 while the finding holds
"""

import ast
import importlib.util
import sys

import torch

from fakes.flashinfer.comm.mapping import Mapping


def passed_gpus_per_node() -> ast.expr:
    spec = importlib.util.find_spec("vllm.distributed.device_communicators.all2all")
    for node in ast.walk(ast.parse(open(spec.origin).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "initialize":
            for kw in node.keywords:
                if kw.arg == "gpus_per_node":
                    return kw.value
    raise SystemExit("vLLM no longer passes gpus_per_node to initialize")


def main() -> int:
    expr = passed_gpus_per_node()
    print(f"vLLM passes gpus_per_node={ast.unparse(expr)}")
    if isinstance(expr, ast.Call):
        return 0
    mapping = Mapping(2, 1, torch.accelerator.device_count, tp_size=2)
    try:
        print(f"Mapping.local_rank = {mapping.local_rank}")
    except TypeError as e:
        print(f"Mapping.local_rank: TypeError: {e}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
