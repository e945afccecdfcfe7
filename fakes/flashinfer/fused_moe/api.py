"""Fake ``flashinfer.fused_moe.api``: the operand formats ``moe_ep`` sizes its dispatch by."""

from enum import Enum


class QuantFormat(Enum):
    BF16 = 0
    FP16 = 1
    FP8PerTensor = 2
    DeepSeekFp8 = 3
    MXFP8 = 4
    NVFP4 = 5
    MXFP4 = 6
    MXINT4 = 7
    INT4 = 8

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"
