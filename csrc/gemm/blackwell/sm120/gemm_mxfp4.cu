// sm_120f MXFP4 x MXFP4 kernels: bf16/fp16 output, default, widen and pingpong tiles.
#include "csrc/gemm/blackwell/sm120/recipe.cuh"

FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Mxfp4, fp4_gemm::BlackwellTile::Default)
FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Mxfp4, fp4_gemm::BlackwellTile::Widen)
FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Mxfp4, fp4_gemm::BlackwellTile::Pingpong)
