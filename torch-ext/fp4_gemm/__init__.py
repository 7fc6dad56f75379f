"""fp4-gemm: block-scaled FP8/FP4 quantizers and GEMMs (MXFP8, MXFP4, NVFP4, E0M3).

Load it as a kernels-hub package::

    from kernels import get_kernel
    fp4 = get_kernel("org/fp4-gemm", version=1, trust_remote_code=True)

Two API families over one implementation: the halops-style functions (_halops.py) and the
flashrt-style NVFP4 functions (_nvfp4.py). Every function takes CPU tensors (the exact reference)
or CUDA tensors (native kernels where capabilities() says so, else the reference on the GPU).
The numeric contract is docs/FORMATS.md; reference.py implements it. `layers` holds the kernels-hub
layers for `kernels.kernelize`; it is in __all__ so that kernel-builder's Hub card lists them.
"""

from . import _registry, layers, reference  # noqa: F401  (_registry registers the ops' implementations)
from ._capabilities import (
    NVFP4_BLOCK_SIZE,
    NVFP4_SCALE_TILE_BLOCKS,
    NVFP4_SCALE_TILE_ROWS,
    SUPPORTED_CUDA_CAPABILITIES,
    SUPPORTED_LAYOUTS,
    capabilities,
    sfa_size_bytes,
)
from ._halops import (
    batch_gemm,
    dense_gemm,
    fused_swiglu_quant,
    group_contiguous_gemm,
    group_masked_gemm,
    group_wise_quant,
    prefill_permute_to_masked_gemm,
)
from ._nvfp4 import (
    adopt_nvfp4_w4a16_marlin,
    aligned_fp4_dim,
    allocate_w4a16_marlin_workspace,
    cutlass_fp4_gemm_geglu_il_hw_v10,
    dequantize_fp4_sfa_fp16,
    e0m3_weight_gemm_fp16,
    fp4_repack_b_interleaved_sm120,
    fp4_w4a4_gemm_warpsplit_mrows_bf16,
    fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16,
    fp4_w4a4_gemv_warpsplit_bf16,
    fp4_w4a4_gemv_warpsplit_interleaved_bf16,
    fp4_w4a16_linear_bf16,
    nvfp4_gemm_bf16,
    nvfp4_gemm_bias_bf16,
    nvfp4_gemm_bias_gelu_bf16,
    nvfp4_gemm_bias_gelu_nvfp4,
    nvfp4_gemm_bias_gelu_nvfp4_fp16,
    nvfp4_gemm_bias_residual_bf16,
    nvfp4_gemm_bias_residual_fp16,
    nvfp4_gemm_fp16,
    nvfp4_gemm_geglu_nvfp4_fp16,
    nvfp4_gemm_m256_bf16,
    nvfp4_gemm_m256_workspace_size,
    nvfp4_gemm_nvfp4,
    nvfp4_gemm_relu2_nvfp4,
    nvfp4_gemm_residual_bf16,
    nvfp4_gemm_streamk_bf16,
    nvfp4_gemm_streamk_bias_bf16,
    nvfp4_gemm_variant_bf16,
    nvfp4_w4a16_marlin_bf16,
    pack_nvfp4_weight_bf16,
    quantize_e0m3_sfa_fp16,
    quantize_fp4_sfa_bf16,
    quantize_fp4_sfa_bf16_pdl,
    quantize_fp4_sfa_fp16,
    quantize_fp4_sfa_mse_bf16,
    quantize_fp4_sfa_mse_fp16,
    quantize_fp4_sfa_padded_bf16,
)
from ._ops import ops  # noqa: F401

__all__ = [
    "layers",
    # halops-style family
    "group_wise_quant",
    "dense_gemm",
    "batch_gemm",
    "group_contiguous_gemm",
    "group_masked_gemm",
    "fused_swiglu_quant",
    "prefill_permute_to_masked_gemm",
    # flashrt-style NVFP4 family
    "sfa_size_bytes",
    "capabilities",
    "quantize_fp4_sfa_fp16",
    "quantize_fp4_sfa_bf16",
    "quantize_fp4_sfa_mse_fp16",
    "quantize_fp4_sfa_mse_bf16",
    "quantize_fp4_sfa_padded_bf16",
    "pack_nvfp4_weight_bf16",
    "quantize_e0m3_sfa_fp16",
    "dequantize_fp4_sfa_fp16",
    "nvfp4_gemm_bf16",
    "nvfp4_gemm_fp16",
    "nvfp4_gemm_variant_bf16",
    "nvfp4_gemm_nvfp4",
    "nvfp4_gemm_geglu_nvfp4_fp16",
    "cutlass_fp4_gemm_geglu_il_hw_v10",
    "nvfp4_gemm_bias_gelu_nvfp4_fp16",
    "nvfp4_gemm_bias_residual_fp16",
    "nvfp4_gemm_bias_bf16",
    "nvfp4_gemm_bias_residual_bf16",
    "nvfp4_gemm_residual_bf16",
    "nvfp4_gemm_bias_gelu_bf16",
    "nvfp4_gemm_bias_gelu_nvfp4",
    "nvfp4_gemm_streamk_bf16",
    "nvfp4_gemm_streamk_bias_bf16",
    "fp4_w4a16_linear_bf16",
    "fp4_repack_b_interleaved_sm120",
    "fp4_w4a4_gemv_warpsplit_interleaved_bf16",
    "fp4_w4a4_gemm_warpsplit_mrows_bf16",
    "nvfp4_gemm_m256_workspace_size",
    "nvfp4_gemm_m256_bf16",
    "e0m3_weight_gemm_fp16",
    "nvfp4_gemm_relu2_nvfp4",
    # the flashrt package's additions since its seed card (shared/spec/flashrt-head.md)
    "aligned_fp4_dim",
    "NVFP4_BLOCK_SIZE",
    "NVFP4_SCALE_TILE_ROWS",
    "NVFP4_SCALE_TILE_BLOCKS",
    "SUPPORTED_LAYOUTS",
    "SUPPORTED_CUDA_CAPABILITIES",
    "quantize_fp4_sfa_bf16_pdl",
    "fp4_w4a4_gemm_warpsplit_mrows_pdl_bf16",
    "fp4_w4a4_gemv_warpsplit_bf16",
    "allocate_w4a16_marlin_workspace",
    "adopt_nvfp4_w4a16_marlin",
    "nvfp4_w4a16_marlin_bf16",
]
