// Registers the sm_110a GEMM backend: the sm100 recipe's kernels compiled for Jetson Thor (the
// section's gemm_*.cu) for every problem blackwell_supports() accepts.
#include "csrc/gemm/blackwell/backend.h"

namespace fp4_gemm {
namespace {

const GemmBackendRegistrar registrar(blackwell_backend<Sm100Kernel, GemmArch::Sm110>("sm110_cutlass"));

}  // namespace
}  // namespace fp4_gemm
