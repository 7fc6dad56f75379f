// sm_120f MXFP8 x MXFP8 kernels: bf16/fp16 output, default and pingpong tiles (no widen tile:
// blackwell_tile_built).
#include "csrc/gemm/blackwell/sm120/recipe.cuh"

FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Mxfp8, fp4_gemm::BlackwellTile::Default)
FP4_GEMM_SM120_KERNEL(fp4_gemm::OperandFormat::Mxfp8, fp4_gemm::BlackwellTile::Pingpong)
