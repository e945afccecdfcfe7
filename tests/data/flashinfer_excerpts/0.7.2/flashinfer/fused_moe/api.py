# Excerpt of FlashInfer 0.7.2 (fused_moe/api.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
MAX_SUPPORTED_TOP_EXPERTS = None
MAX_SUPPORTED_TOTAL_EXPERTS = None

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
        return f'{type(self).__name__}.{self.name}'

class RoutingConfig:
    ...

class QuantConfig:
    ...

class ActivationConfig:
    ...

def _validate_finite():
    ...

class SwiGLU:
    ...

class SiTU:
    ...

class GeGLU:
    ...

class ReLU2:
    ...

class GeGLUTanh:
    ...

class SwiGLUStep:
    ...

class Identity:
    ...

class GELU:
    ...

class ReLU:
    ...

class SiLU:
    ...

class ExpertConfig:
    ...

class MoEFinalizeConfig:
    ...

class ExecutionConfig:
    ...
_TRTLLM_ROUTED_ARCHS = None
_TRTLLM_ROUTED_FP8_ARCHS = None
_PRIMS_TS_ARCHS = None
_CUTLASS_BF16_ARCHS = None
_CUTLASS_W4A16_ARCHS = None
_CUTILE_BF16_ARCHS = None
_CUTILE_NVFP4_ARCHS = None
_CUTILE_MXFP4_ARCHS = None
_CUTILE_W4A16_ARCHS = None
_CUTILE_FP8_ARCHS = None
_CUTILE_MXFP8_ARCHS = None
_CUTILE_SUPPORTED_ACTIVATIONS = None
_CUTLASS_NVFP4_ARCHS = None
_CUTLASS_FP8_ARCHS = None
_CUTLASS_FP8_BLOCK_ARCHS = None
_CUTLASS_MXFP8_MXFP4_ARCHS = None
_CUTLASS_MXFP8_ARCHS = None
_CUTLASS_W4A8_ARCHS = None
_CUTLASS_HUMMING_ARCHS = None
_NVFP4_NVFP4 = None

class TrtllmFp4Config:
    ...

class CakeWarpDecodeConfig:
    ...

class PrimsTsConfig:
    ...

class TrtllmFp8BlockConfig:
    ...

class TrtllmFp8PerTensorConfig:
    ...

class TrtllmBf16Config:
    ...

class TrtllmMxInt4Config:
    ...

class CutlassBf16Config:
    ...

class CuTileBf16Config:
    ...

class CuTileNvfp4Config:
    ...

class CuTileNvfp4Bf16Config:
    ...

class CuTileMxfp4Config:
    ...

class CuTileMxfp4Bf16Config:
    ...

class CuTileFp8PerTensorConfig:
    ...

class CuTileFp8PerTensorBf16Config:
    ...

class CuTileMxfp8Config:
    ...

class CuTileMxfp8Bf16Config:
    ...

class CuTileMxfp4Mxfp8Config:
    ...

class CutlassW4A16Config:
    ...

class CutlassNvfp4Config:
    ...

class CutlassFp8PerTensorConfig:
    ...

class CutlassFp8BlockConfig:
    ...

def _mxfp8_activation_quant():
    ...

class CutlassMxfp8Mxfp4Config:
    ...

class CutlassMxfp8Config:
    ...

class CutlassW4A8Config:
    ...

class CutlassHummingConfig:
    ...

class CuteDslConfig:
    ...

class SM12xFp8Config:
    ...

class SM12xMxfp8Mxfp4Config:
    ...

class SM12xNvfp4Bf16Config:
    ...

class SM12xNvfp4Config:
    ...

class B12xNvfp4Config:
    ...

class B12xW4A16Config:
    ...

class CudnnFrostBf16Config:
    ...

class CudnnFrostMxfp8Config:
    ...

class CudnnFrostNvfp4Config:
    ...

class CudnnFrostMxfp8Mxfp4Config:
    ...
BackendConfigType = None
ALL_BACKEND_CONFIGS = None

class BackendOptions:
    ...
_DEFAULT_BACKEND = None

class MoEConfig:
    ...

def _tensor_summary():
    ...

class MoEActivationPack:
    ...

class MoEWeightPack:
    ...
