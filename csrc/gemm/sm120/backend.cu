// RTX Blackwell (sm_120a) CUTLASS block-scaled kernels. Until they land, GEMM ops run the reference.
#include "csrc/gemm/backends.h"

namespace fp4_gemm {
namespace {

const GemmBackendRegistrar kRegistrar(GemmArch::Sm120);

}  // namespace
}  // namespace fp4_gemm
