// Jetson Thor (sm_110a): the sm100 kernels built for 11.0a (CUDA >= 13). Until they land, GEMM ops run the reference.
#include "csrc/gemm/backends.h"

namespace fp4_gemm {
namespace {

const GemmBackendRegistrar kRegistrar(GemmArch::Sm110);

}  // namespace
}  // namespace fp4_gemm
