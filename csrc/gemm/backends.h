// The GEMM backends compiled into this build, one per arch section of build.toml.
//
// Each arch section registers itself from its own translation unit, so a build that lacks a
// section (sm_110a needs CUDA >= 13) has no entry for that arch, and dispatch can say so instead
// of launching code that is not there.
#pragma once

#include <vector>

namespace fp4_gemm {

// Compute capability (major * 10 + minor) an arch section's code runs on.
enum class GemmArch : int { Sm90 = 90, Sm100 = 100, Sm110 = 110, Sm120 = 120 };

void register_gemm_backend(GemmArch arch);

// Archs with a backend in this build, ascending.
std::vector<GemmArch> gemm_backends();

struct GemmBackendRegistrar {
  explicit GemmBackendRegistrar(GemmArch arch) { register_gemm_backend(arch); }
};

}  // namespace fp4_gemm
