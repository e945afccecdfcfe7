"""Fake ``flashinfer.tllm_enums`` (the enum the all-to-all combine takes)."""

from enum import IntEnum


class SfLayout(IntEnum):
    """Layout of scale factors for quantization."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2
