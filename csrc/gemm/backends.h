// The GEMM backends compiled into this build.
//
// Each backend registers itself from its own translation unit: the arch sections of build.toml
// (sm90, sm100, sm110, sm120) and the portable backends of the common section. A build that lacks a
// section (sm_110a needs CUDA >= 13) has no entry for it, and dispatch says so instead of launching
// code that is not there. A backend says only whether it can serve a problem; which one runs is the
// dispatch policy's choice (dispatch.cpp).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// Compute capability (major * 10 + minor) an arch section's code runs on. Portable backends
// (plain CUDA compiled for every arch of the build) run on all of them.
enum class GemmArch : int { Portable = 0, Sm90 = 90, Sm100 = 100, Sm110 = 110, Sm120 = 120 };

struct GemmBackend {
  const char* name;
  GemmArch arch;
  // Whether this backend can compute the problem (not whether it should: dispatch.cpp decides). Reads
  // only host-side fields (shapes, formats, pointers' alignment), never device data, so it can run
  // during CUDA-graph capture.
  bool (*supports)(const GemmProblem& problem);
  void (*run)(const GemmProblem& problem, cudaStream_t stream);
  // Bytes of scratch run() wants for this problem (nullptr: none), handed over in problem.scratch.
  int64_t (*scratch_bytes)(const GemmProblem& problem) = nullptr;
};

// Every part of a backend's scratch starts on a 256-byte boundary (the caching allocator's blocks
// are 512-byte aligned), so each part takes vector and TMA accesses: a part of `bytes` bytes takes
// scratch_part_bytes(bytes) of the layout.
constexpr int64_t kScratchAlignment = 256;
constexpr int64_t scratch_part_bytes(int64_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

void register_gemm_backend(const GemmBackend& backend);

// Registered backends, by name.
const std::vector<GemmBackend>& gemm_backends();

struct GemmBackendRegistrar {
  explicit GemmBackendRegistrar(const GemmBackend& backend) { register_gemm_backend(backend); }
};

}  // namespace fp4_gemm
