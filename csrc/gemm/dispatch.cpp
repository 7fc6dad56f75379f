#include "csrc/gemm/dispatch.h"

#include "csrc/common/check.h"

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

int current_device_cc() {
  int device = 0, major = 0, minor = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

}  // namespace fp4_gemm
