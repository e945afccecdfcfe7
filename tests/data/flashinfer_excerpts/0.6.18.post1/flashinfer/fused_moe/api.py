# Excerpt of FlashInfer 0.6.18.post1 (fused_moe/api.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
MAX_SUPPORTED_TOP_EXPERTS = None
MAX_SUPPORTED_TOTAL_EXPERTS = None

class QuantVariant:
    ...

class RoutingConfig:
    ...

class QuantConfig:
    ...

class ActivationConfig:
    ...

class ExpertConfig:
    ...

class MoEFinalizeConfig:
    ...

class ExecutionConfig:
    ...
_TRTLLM_ROUTED_ARCHS = None
_TRTLLM_ROUTED_FP8_ARCHS = None
_CUTLASS_BF16_ARCHS = None
_CUTLASS_W4A16_ARCHS = None

class TrtllmFp4Config:
    ...

class TrtllmFp8BlockConfig:
    ...

class TrtllmFp8PerTensorConfig:
    ...

class TrtllmBf16Config:
    ...

class TrtllmMxInt4Config:
    ...

class CutlassConfig:
    ...

class CutlassBf16Config:
    ...

class CutlassW4A16Config:
    ...

class CuteDslConfig:
    ...

class B12xNvfp4Config:
    ...

class B12xW4A16Config:
    ...
BackendConfigType = None
ALL_BACKEND_CONFIGS = None

class BackendOptions:
    ...
_DEFAULT_BACKEND = None

class MoEConfig:
    ...

class MoEActivationPack:
    ...

class MoEWeightPack:
    ...
