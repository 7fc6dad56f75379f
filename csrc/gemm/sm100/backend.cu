// Datacenter Blackwell (sm_100a) CUTLASS block-scaled kernels. Until they land, GEMM ops run the reference.
#include "csrc/gemm/backends.h"

namespace fp4_gemm {
namespace {

const GemmBackendRegistrar kRegistrar(GemmArch::Sm100);

}  // namespace
}  // namespace fp4_gemm
