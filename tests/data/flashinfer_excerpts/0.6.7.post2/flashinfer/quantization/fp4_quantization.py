# Excerpt of FlashInfer 0.6.7.post2 (quantization/fp4_quantization.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from ..tllm_enums import SfLayout

def _compute_swizzled_layout_sf_size():
    ...

def _pad_scale_factors():
    ...

def gen_fp4_quantization_sm100_module():
    ...

def gen_fp4_quantization_sm103_module():
    ...

def gen_fp4_quantization_sm90_module():
    ...

def gen_fp4_quantization_sm110_module():
    ...

def gen_fp4_quantization_sm120_module():
    ...

def gen_fp4_quantization_sm120f_module():
    ...

def gen_fp4_quantization_sm121_module():
    ...

def gen_fp4_quantization_module():
    ...

def get_fp4_quantization_module():
    ...

@flashinfer_api
def fp4_quantize(input: torch.Tensor, global_scale: Optional[torch.Tensor]=None, sf_vec_size: int=16, sf_use_ue8m0: bool=False, is_sf_swizzled_layout: bool=True, is_sf_8x4_layout: bool=False, enable_pdl: Optional[bool]=None) -> Tuple[torch.Tensor, torch.Tensor]:
    return (x_q, sf)

@flashinfer_api
def block_scale_interleave(unswizzled_sf: torch.Tensor) -> torch.Tensor:
    return get_fp4_quantization_module(device_arch).block_scale_interleave_sm100(unswizzled_sf)
nvfp4_block_scale_interleave = block_scale_interleave

def e2m1_and_ufp8sf_scale_to_float():
    ...

@flashinfer_api
def shuffle_matrix_a(input_tensor: torch.Tensor, epilogue_tile_m: int) -> torch.Tensor:
    return input_tensor[row_indices.to(input_tensor.device)]

@flashinfer_api
def shuffle_matrix_sf_a(input_tensor: torch.Tensor, epilogue_tile_m: int, num_elts_per_sf: int=16):
    return block_scale_interleave(w_shuffled)

def nvfp4_quantize():
    ...

def mxfp4_quantize():
    ...

def mxfp4_dequantize():
    ...

def mxfp4_dequantize_host():
    ...

def nvfp4_batched_quantize():
    ...

def nvfp4_quantize_paged_kv_cache():
    ...

def scaled_fp4_grouped_quantize():
    ...

def get_fp4_kv_dequantization_module():
    ...

def get_fp4_kv_quantization_module():
    ...
_NVFP4_BLOCK_SIZE = None

def _nvfp4_kv_dequant_check():
    ...

def nvfp4_kv_dequantize():
    ...

def _nvfp4_kv_quant_check():
    ...

def nvfp4_kv_quantize():
    ...
