#include "csrc/gemm/dispatch.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace fp4_gemm {

bool arch_runs_on(GemmArch arch, int cc) {
  const int major = cc / 10;
  switch (arch) {
    case GemmArch::Portable:
      return cc == 90 || major == 10 || cc == 110 || major == 12;
    case GemmArch::Sm100:
      return major == 10;
    case GemmArch::Sm120:
      return major == 12;
    default:
      return static_cast<int>(arch) == cc;
  }
}

const GemmBackend* find_gemm_backend(const GemmProblem& problem, int cc) {
  GemmProblem matched = problem;
  matched.cc = cc;
  for (const auto& backend : gemm_backends()) {
    if (arch_runs_on(backend.arch, cc) && backend.supports(matched)) return &backend;
  }
  return nullptr;
}

const GemmBackend& delegate_backend(const GemmProblem& problem, const char* delegator) {
  const GemmBackend* backend = find_gemm_backend(problem, problem.cc);
  if (backend == nullptr) {
    throw std::runtime_error(std::string("fp4_gemm: no backend serves the ") + delegator +
                             " GEMM's problem on this device");
  }
  return *backend;
}

int64_t delegate_scratch_bytes(const GemmProblem& problem, const char* delegator) {
  const GemmBackend& backend = delegate_backend(problem, delegator);
  return backend.scratch_bytes == nullptr ? 0 : backend.scratch_bytes(problem);
}

void pass_scratch_past(const GemmProblem& outer, int64_t own_bytes, GemmProblem& inner) {
  inner.scratch = outer.scratch == nullptr ? nullptr : static_cast<uint8_t*>(outer.scratch) + own_bytes;
  inner.scratch_bytes = outer.scratch_bytes > own_bytes ? outer.scratch_bytes - own_bytes : 0;
}

}  // namespace fp4_gemm
