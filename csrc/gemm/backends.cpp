#include "csrc/gemm/backends.h"

#include <algorithm>

namespace fp4_gemm {
namespace {

// Function-local so that registrars in other translation units may run first.
std::vector<GemmArch>& registry() {
  static std::vector<GemmArch> archs;
  return archs;
}

}  // namespace

void register_gemm_backend(GemmArch arch) {
  auto& archs = registry();
  if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
  std::sort(archs.begin(), archs.end());
}

std::vector<GemmArch> gemm_backends() { return registry(); }

}  // namespace fp4_gemm
