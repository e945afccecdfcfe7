# Excerpt of FlashInfer 0.6.5 (fp8_quantization.py), Apache-2.0, (c) the FlashInfer authors:
# signatures, constants and return statements only, for the fake's contract test.
def _compute_swizzled_layout_sf_size():
    ...

def get_mxfp8_quantization_sm100_module():
    ...

@flashinfer_api
def mxfp8_quantize(input: torch.Tensor, is_sf_swizzled_layout: bool=True, alignment: int=32, enable_pdl: Optional[bool]=None) -> Tuple[torch.Tensor, torch.Tensor]:
    return (x_q, sf)

def mxfp8_dequantize_host():
    ...
