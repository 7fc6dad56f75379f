// sm_100f NVFP4 x NVFP4 kernels (bf16/fp16 output, default and widen tiles; the float32 stage; the stream-K
// kernel, bf16).
#include "csrc/gemm/blackwell/sm100/recipe.cuh"

FP4_GEMM_SM100_KERNELS(fp4_gemm::GemmArch::Sm100, fp4_gemm::OperandFormat::Nvfp4)
FP4_GEMM_SM100_FP32_STAGE(fp4_gemm::GemmArch::Sm100)
FP4_GEMM_SM100_STREAMK(fp4_gemm::GemmArch::Sm100)
