#include "csrc/gemm/dispatch.h"

namespace fp4_gemm {

bool arch_runs_on(GemmArch arch, int cc) {
  return arch == GemmArch::Portable || static_cast<int>(arch) == cc;
}

const GemmBackend* find_gemm_backend(const GemmProblem& problem, int cc) {
  GemmProblem matched = problem;
  matched.cc = cc;
  for (const auto& backend : gemm_backends()) {
    if (arch_runs_on(backend.arch, cc) && backend.supports(matched)) return &backend;
  }
  return nullptr;
}

}  // namespace fp4_gemm
