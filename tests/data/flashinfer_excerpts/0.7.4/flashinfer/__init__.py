# Excerpt of FlashInfer 0.7.4 (__init__.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from .quantization.fp4_quantization import block_scale_interleave, shuffle_matrix_a, shuffle_matrix_sf_a
from .fused_moe import reorder_rows_for_gated_act_gemm
_PRIMS_TS_LAZY_EXPORTS = None
_COMPAT_SUBMODULES = None

def __getattr__():
    ...

def __dir__():
    ...

def _log_import_version():
    ...
