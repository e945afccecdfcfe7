# Excerpt of FlashInfer 0.6.7.post2 (tllm_enums.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
class RoutingMethodType(IntEnum):
    Default = (0,)
    Renormalize = (1,)
    DeepSeekV3 = (2,)
    Llama4 = (3,)
    RenormalizeNaive = (4,)
    TopK = (5,)
    Unspecified = 6

class ActivationType(IntEnum):
    Gelu = 0
    Relu = 1
    Silu = 2
    Swiglu = 3
    Geglu = 4
    SwigluBias = 5
    Relu2 = 6
    Identity = 7
    InvalidType = 8

class DtypeTrtllmGen:
    ...

def trtllm_gen_dtype_has_scale():
    ...

def deduce_trtllm_gen_tensor_dtype():
    ...

class SfLayout(IntEnum):
    layout_128x4 = 0
    layout_8x4 = 1
    layout_linear = 2

class WeightLayout(IntEnum):
    MajorK = 0
    MajorMn = 1
    BlockMajorK = 2

class GatedActType:
    ...

class Fp8QuantizationType(IntEnum):
    NoneFp8 = 0
    DeepSeekFp8 = 1
    MxFp8 = 2
