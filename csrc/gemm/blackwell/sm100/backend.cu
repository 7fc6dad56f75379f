// Registers the sm_100f GEMM backend: the CUTLASS block-scaled kernels of sm100/recipe.cuh for every
// problem blackwell_supports() accepts.
#include "csrc/gemm/blackwell/backend.h"

namespace fp4_gemm {
namespace {

const GemmBackendRegistrar registrar(blackwell_backend<Sm100Kernel, GemmArch::Sm100>("sm100_cutlass"));

}  // namespace
}  // namespace fp4_gemm
