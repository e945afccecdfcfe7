"""What ``a2a-testbed contract --consumer vllm`` reads of vLLM: the files of its FlashInfer
all-to-all path."""

from __future__ import annotations

from testbed.contract.consumer import Consumer, PathFile

CONSUMER = Consumer("vllm", "vllm", (
    # The probes vLLM decides its FlashInfer backends by, and the lazy wrapper its one-sided
    # prepare takes nvfp4_block_scale_interleave from.
    PathFile("vllm/utils/flashinfer.py", ("has_flashinfer", "has_flashinfer_comm", "_get_submodule",
                                          "_lazy_import_wrapper", "has_flashinfer_nvlink_one_sided",
                                          "has_flashinfer_nvlink_two_sided", "nvfp4_block_scale_interleave")),
    PathFile("vllm/distributed/device_communicators/all2all.py"),
    PathFile("vllm/distributed/device_communicators/mnnvl_compat.py"),
    PathFile("vllm/model_executor/layers/fused_moe/all2all_utils.py"),
    # In prepare_finalize/ from 0.19; 0.18's beside the layer (flashinfer_nvlink_*_prepare_finalize.py).
    PathFile("vllm/model_executor/layers/fused_moe/*flashinfer_nvlink_*.py"),
    PathFile("vllm/model_executor/layers/quantization/utils/mxfp8_utils.py"),
), release="0.33.0")
