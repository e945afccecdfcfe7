"""VLLM-004, standalone: vLLM 0.33.0's mxfp8 activation quantize on a batch of 0 tokens.

``moe_kernel_quantize_input(..., quant_dtype="mxfp8")`` ends in
``mxfp8_utils._mxfp8_e4m3_quantize_torch`` (and, on Blackwell with FlashInfer, the same
``.view(M, -1)`` after ``flashinfer.mxfp8_quantize``): with M = 0 the reshape is ambiguous and
raises, so an mxfp8 MoE layer fails on a DP rank that enters it with no tokens.

    python examples/vllm_mxfp8_empty_rank.py          # exit 1 while the finding holds
"""

import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input  # noqa: E402


def main() -> int:
    for tokens in (3, 0):
        x = torch.randn(tokens, 256).to(torch.bfloat16)
        try:
            q, s = moe_kernel_quantize_input(x, None, "mxfp8", False, None, is_scale_swizzled=False)
            print(f"{tokens} tokens: values {tuple(q.shape)}, scales {tuple(s.shape)}")
        except RuntimeError as e:
            print(f"{tokens} tokens: {type(e).__name__}: {e}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
