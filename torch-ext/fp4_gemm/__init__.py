"""fp4-gemm: block-scaled FP8/FP4 GEMMs and quantizers for Hopper and Blackwell (MXFP8, MXFP4, NVFP4).

Load it as a kernels-hub package::

    from kernels import get_kernel
    ops = get_kernel("org/fp4-gemm", version=1, trust_remote_code=True)

Every function runs on CUDA tensors (native kernels where capabilities() says so) and on CPU
tensors (the exact reference in `reference.py`). The numeric contract is docs/FORMATS.md.
"""

from __future__ import annotations

import torch

from . import _registry, _validate, reference  # noqa: F401  (_registry registers CPU and fake impls)
from ._ops import ops

__all__ = ["group_wise_quant"]


def group_wise_quant(
    input: torch.Tensor, mode: str = "w8a8-mxfp8", use_swizzle: bool = True, use_pdl: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a bf16/fp16 matrix block by block along K.

    Parameters
    ----------
    input : torch.Tensor
        [m, k] bfloat16 or float16, contiguous, CPU or CUDA. k is a multiple of the mode's block
        size (32 for w8a8-mxfp8 and w4a4-mxfp4, 16 for w4a4-nvfp4).
    mode : str
        "w8a8-mxfp8" (E4M3 values, UE8M0 scale per 32), "w4a4-mxfp4" (E2M1, UE8M0 per 32) or
        "w4a4-nvfp4" (E2M1, UE4M3 per 16).
    use_swizzle : bool
        True: scales in the CUTLASS SfAtom layout every GEMM consumes, shown as uint8
        [ceil(m/128)*128, ceil(k/g/4)*4] (padding bytes are 0; address it only through
        sf_offset). False: plain row-major uint8 [m, k/g].
    use_pdl : bool
        Launch with programmatic dependent launch (CUDA only; no numeric effect).

    Returns
    -------
    (values, scales)
        values: float8_e4m3fn [m, k] (mxfp8) or uint8 [m, k/2] packed E2M1 (element 2i in the
        low nibble). scales: uint8, layout as above.

    Raises
    ------
    ValueError
        Unknown mode, wrong dtype/rank/device, non-contiguous input, k not a multiple of the block.
    """
    fmt = _validate.group_wise_quant(input, mode)
    rows, cols = input.shape
    nkb = cols // fmt.group
    if fmt.element_bits == 8:
        values = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device=input.device)
    else:
        values = torch.empty(rows, cols // 2, dtype=torch.uint8, device=input.device)
    scale_shape = reference.swizzled_scale_shape(rows, nkb) if use_swizzle else (rows, nkb)
    scales = torch.empty(scale_shape, dtype=torch.uint8, device=input.device)
    ops.quantize(input, fmt.name, use_swizzle, use_pdl, values, scales)
    return values, scales
