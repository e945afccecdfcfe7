"""Fake ``flashinfer.tllm_enums``: the enums the all-to-all and the TRT-LLM MoE take."""

from enum import IntEnum


class SfLayout(IntEnum):
    """Layout of scale factors for quantization."""

    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2


class RoutingMethodType(IntEnum):
    Default = 0  # Softmax -> TopK
    Renormalize = 1  # TopK -> Softmax
    DeepSeekV3 = 2
    Llama4 = 3
    RenormalizeNaive = 4  # Softmax -> TopK -> Renormalize
    TopK = 5
    SigmoidRenorm = 6
    MiniMax2 = 7
    Sigmoid = 8
    TopKSigmoid = 9
    Unspecified = 10


class ActivationType(IntEnum):
    Gelu = 0
    Relu = 1
    Silu = 2
    Swiglu = 3
    Geglu = 4
    SwigluBias = 5
    Relu2 = 6
    SwigluStep = 7
    GegluTanh = 8
    Identity = 9
    Situ = 10
    InvalidType = 11


class WeightLayout(IntEnum):
    MajorK = 0  # [Mn, K]
    MajorMn = 1  # [K, Mn]
    BlockMajorK = 2  # [K / blockK, Mn, blockK], blockK = 128 bytes


class Fp8QuantizationType(IntEnum):
    NoneFp8 = 0
    DeepSeekFp8 = 1
    MxFp8 = 2
    PerTensorFp8 = 3
    PerChannelFp8 = 4
