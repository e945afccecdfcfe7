"""What ``a2a-testbed contract --consumer sglang`` reads of SGLang: the files of its FlashInfer
all-to-all path."""

from __future__ import annotations

from testbed.contract.consumer import Consumer, PathFile

CONSUMER = Consumer("sglang", "sglang", (
    PathFile("sglang/srt/layers/moe/token_dispatcher/flashinfer.py"),
    PathFile("sglang/srt/layers/moe/token_dispatcher/flashinfer_utils.py"),
    PathFile("sglang/srt/layers/quantization/fp4_utils.py"),
), release="0.5.23")
