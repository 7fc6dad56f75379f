// sm_120f NVFP4 x NVFP4 kernels: bf16/fp16 output, default, widen and pingpong tiles; the float32 stage;
// the stream-K kernel (bf16).
#include "csrc/gemm/blackwell/sm120/recipe.cuh"

FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Nvfp4, fp4_gemm::BlackwellTile::Default)
FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Nvfp4, fp4_gemm::BlackwellTile::Widen)
FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Nvfp4, fp4_gemm::BlackwellTile::Pingpong)
FP4_GEMM_SM120_FP32_STAGE
FP4_GEMM_SM120_STREAMK
