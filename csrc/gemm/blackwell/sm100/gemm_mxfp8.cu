// sm_100f MXFP8 x MXFP8 kernels (bf16/fp16 output, default and widen tiles).
#include "csrc/gemm/blackwell/sm100/recipe.cuh"

FP4_GEMM_SM100_KERNELS(fp4_gemm::GemmArch::Sm100, fp4_gemm::OperandFormat::Mxfp8)
