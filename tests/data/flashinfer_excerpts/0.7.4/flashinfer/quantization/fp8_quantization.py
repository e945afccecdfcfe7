# Excerpt of FlashInfer 0.7.4 (quantization/fp8_quantization.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from ..tllm_enums import SfLayout

def _round_up():
    ...
_MXFP8_EXPERTS_INPUT_ALIGNMENT = None

def _mxfp8_experts_outputs():
    ...

def _to_masked_gemm_layout():
    ...

def get_per_token_group_quant_8bit_cuda_module():
    ...

def _per_token_group_quant_8bit_cuda():
    ...

def _compute_swizzled_layout_sf_size():
    ...

def get_mxfp8_quantization_sm100_module():
    ...

@flashinfer_api(trace=mxfp8_quantize_trace)
def mxfp8_quantize(input: torch.Tensor, is_sf_swizzled_layout: bool=True, alignment: int=32, enable_pdl: Optional[bool]=None, backend: Literal['auto', 'cuda', 'cute-dsl']='auto', sf_swizzle_layout: Optional[SfLayout]=None, *, batch_invariant: bool=False) -> Tuple[torch.Tensor, torch.Tensor]:
    return mxfp8_quantize_batch_invariant(input, sf_swizzle_layout, alignment, enable_pdl)
    return mxfp8_quantize_cute_dsl(input, is_sf_swizzled_layout=is_sf_swizzled_layout_cute, alignment=alignment, enable_pdl=enable_pdl, is_sf_8x4_layout=is_sf_8x4_layout_cute)
    return (x_q, sf)

def get_mxfp8_grouped_quantization_module():
    ...
_CAKE_BULK_MAX_INPUT_BYTES = None
_CAKE_TILED_MIN_ROWS = None
_CAKE_TILED_ROWS = None
_CAKE_QUANT_BLOCK = None
_CAKE_MAX_GRID_YZ = None
_CAKE_SCALE_TILE = None

def _cake_grouped_mxfp8_device_index():
    ...

def _cake_grouped_mxfp8_capability():
    ...

def _cake_grouped_mxfp8_target():
    ...

def is_cake_grouped_mxfp8_quantize_available():
    ...

def cake_grouped_mxfp8_quantize_program():
    ...

def _cake_grouped_mxfp8_subrows():
    ...

def cake_grouped_mxfp8_quantize_grid():
    ...

def cake_grouped_mxfp8_quantize_launch():
    ...

def get_cake_mxfp8_grouped_quantization_module():
    ...

def _mxfp8_grouped_quantize_cake():
    ...

def mxfp8_grouped_quantize():
    ...

def silu_and_mul_mxfp8_experts_quantize():
    ...

def mxfp8_dequantize_host():
    ...

def per_token_group_quant_8bit():
    ...

def mxfp8_quantize_bshd():
    ...
