#include "csrc/gemm/backends.h"

#include <algorithm>
#include <cstring>

namespace fp4_gemm {
namespace {

// Function-local so that registrars in other translation units may run first.
std::vector<GemmBackend>& registry() {
  static std::vector<GemmBackend> backends;
  return backends;
}

}  // namespace

void register_gemm_backend(const GemmBackend& backend) {
  auto& backends = registry();
  const auto same_name = [&](const GemmBackend& b) { return std::strcmp(b.name, backend.name) == 0; };
  if (std::any_of(backends.begin(), backends.end(), same_name)) return;
  backends.push_back(backend);
  std::sort(backends.begin(), backends.end(),
            [](const GemmBackend& x, const GemmBackend& y) { return std::strcmp(x.name, y.name) < 0; });
}

const std::vector<GemmBackend>& gemm_backends() { return registry(); }

}  // namespace fp4_gemm
