// sm_110a NVFP4 x NVFP4 kernels: the sm100 recipe compiled for Jetson Thor (Sm100 arch tag, CUDA >= 13).
#include "csrc/gemm/blackwell/sm100/recipe.cuh"

FP4_GEMM_SM100_KERNELS(fp4_gemm::GemmArch::Sm110, fp4_gemm::OperandFormat::Nvfp4)
FP4_GEMM_SM100_FP32_STAGE(fp4_gemm::GemmArch::Sm110)
FP4_GEMM_SM100_STREAMK(fp4_gemm::GemmArch::Sm110)
