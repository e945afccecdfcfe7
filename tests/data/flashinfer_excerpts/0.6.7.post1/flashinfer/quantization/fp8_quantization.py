# Excerpt of FlashInfer 0.6.7.post1 (quantization/fp8_quantization.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
from ..tllm_enums import SfLayout

def _compute_swizzled_layout_sf_size():
    ...

def get_mxfp8_quantization_sm100_module():
    ...

@flashinfer_api
def mxfp8_quantize(input: torch.Tensor, is_sf_swizzled_layout: bool=True, alignment: int=32, enable_pdl: Optional[bool]=None, backend: Literal['cuda', 'cute-dsl']='cuda', sf_swizzle_layout: Optional[SfLayout]=None) -> Tuple[torch.Tensor, torch.Tensor]:
    return mxfp8_quantize_cute_dsl(input, is_sf_swizzled_layout=is_sf_swizzled_layout, alignment=alignment, enable_pdl=enable_pdl)
    return (x_q, sf)

def mxfp8_dequantize_host():
    ...
