// sm_110a MXFP8 x MXFP8 kernels: the sm100 recipe compiled for Jetson Thor (Sm100 arch tag, CUDA >= 13).
#include "csrc/gemm/blackwell/sm100/recipe.cuh"

FP4_GEMM_SM100_KERNELS(fp4_gemm::GemmArch::Sm110, fp4_gemm::OperandFormat::Mxfp8)
