// Registers the sm_120f GEMM backend: the CUTLASS block-scaled kernels of sm120/recipe.cuh for every
// problem blackwell_supports() accepts.
#include "csrc/gemm/blackwell/backend.h"

namespace fp4_gemm {
namespace {

const GemmBackendRegistrar registrar(blackwell_backend<Sm120Kernel, GemmArch::Sm120>("sm120_cutlass"));

}  // namespace
}  // namespace fp4_gemm
