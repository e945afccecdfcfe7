"""What the rank pool's fork server imports when ``A2A_PRELOAD_ENGINES`` names vllm: the vLLM modules
``--integration vllm`` drives, imported once so every rank forks with them loaded (their pages
shared). Nothing happens where vLLM is not installed."""

import importlib
import importlib.util

from testbed.integrations import vllm as adapter

adapter.prepare_environment()
if importlib.util.find_spec("vllm") is not None:
    import fakes.flashinfer

    with fakes.flashinfer.install("0.7.2"):  # the modules vLLM imports lazily stay unimported
        for module in dict.fromkeys(module for module, _ in adapter.CAPABILITIES):
            importlib.import_module(module)
        importlib.import_module("vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_one_sided")
        importlib.import_module("vllm.model_executor.layers.fused_moe.prepare_finalize.flashinfer_nvlink_two_sided")
