// The Blackwell GEMM backends: one per arch section (sm100, sm110, sm120), each a table of CUTLASS
// kernels indexed by (operand format, output type, tile), instantiated in the section's gemm_*.cu
// files and chosen here at run time. Light on purpose: the registering backend.cu units include no
// CUTLASS. NVFP4 outputs and GeGLU go through the staged backend (csrc/gemm/composed/staged.cu), which asks
// these kernels for an fp16 or (NVFP4 operands, default tile) float32 result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "csrc/gemm/backends.h"
#include "csrc/gemm/blackwell/args.h"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// sm100/recipe.cuh (Arch Sm100 or Sm110) and sm120/recipe.cuh define the members; the gemm_*.cu
// units instantiate the built combinations (blackwell_tile_built).
template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
struct Sm100Kernel {
  static void run(const GemmProblem& problem, cudaStream_t stream);
  static int64_t scratch_bytes(const GemmProblem& problem);  // CUTLASS's workspace
};

template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
struct Sm120Kernel {
  static void run(const GemmProblem& problem, cudaStream_t stream);
  static int64_t scratch_bytes(const GemmProblem& problem);  // CUTLASS's workspace
};

// visit(Kernel<...>{}) for the built kernel of the problem's format, output type and tile
// (choose_blackwell_tile).
template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch,
          OperandFormat Format, OutFormat Out, class Visit>
decltype(auto) visit_blackwell_tile(BlackwellTile tile, Visit&& visit) {
  if constexpr (blackwell_tile_built(Arch, Format, Out, BlackwellTile::Widen)) {
    if (tile == BlackwellTile::Widen) return visit(Kernel<Arch, Format, Out, BlackwellTile::Widen>{});
  }
  if constexpr (blackwell_tile_built(Arch, Format, Out, BlackwellTile::Pingpong)) {
    if (tile == BlackwellTile::Pingpong) return visit(Kernel<Arch, Format, Out, BlackwellTile::Pingpong>{});
  }
  if constexpr (blackwell_tile_built(Arch, Format, Out, BlackwellTile::StreamK)) {
    if (tile == BlackwellTile::StreamK) return visit(Kernel<Arch, Format, Out, BlackwellTile::StreamK>{});
  }
  return visit(Kernel<Arch, Format, Out, BlackwellTile::Default>{});
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch,
          OperandFormat Format, class Visit>
decltype(auto) visit_blackwell_format(const GemmProblem& problem, Visit&& visit) {
  const BlackwellTile tile = choose_blackwell_tile(problem, Arch);
  if constexpr (blackwell_tile_built(Arch, Format, OutFormat::Fp32, BlackwellTile::Default)) {
    if (problem.epilogue.out_format == OutFormat::Fp32) {
      return visit_blackwell_tile<Kernel, Arch, Format, OutFormat::Fp32>(tile, visit);  // the staged backend's stage
    }
  }
  if (problem.epilogue.out_format == OutFormat::Fp16) {
    return visit_blackwell_tile<Kernel, Arch, Format, OutFormat::Fp16>(tile, visit);
  }
  return visit_blackwell_tile<Kernel, Arch, Format, OutFormat::Bf16>(tile, visit);
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch, class Visit>
decltype(auto) visit_blackwell_kernel(const GemmProblem& problem, Visit&& visit) {
  switch (problem.a.format) {
    case OperandFormat::Mxfp8:
      return visit_blackwell_format<Kernel, Arch, OperandFormat::Mxfp8>(problem, visit);
    case OperandFormat::Mxfp4:
      return visit_blackwell_format<Kernel, Arch, OperandFormat::Mxfp4>(problem, visit);
    case OperandFormat::Nvfp4:
      return visit_blackwell_format<Kernel, Arch, OperandFormat::Nvfp4>(problem, visit);
    default:
      throw std::runtime_error("fp4_gemm: the Blackwell backend got an operand format it does not support");
  }
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch>
void run_blackwell(const GemmProblem& problem, cudaStream_t stream) {
  visit_blackwell_kernel<Kernel, Arch>(problem, [&](auto kernel) { decltype(kernel)::run(problem, stream); });
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch>
int64_t blackwell_scratch_bytes(const GemmProblem& problem) {
  return visit_blackwell_kernel<Kernel, Arch>(problem,
                                              [&](auto kernel) { return decltype(kernel)::scratch_bytes(problem); });
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch>
GemmBackend blackwell_backend(const char* name) {
  return GemmBackend{name,
                     Arch,
                     &blackwell_supports,
                     &run_blackwell<Kernel, Arch>,
                     &blackwell_scratch_bytes<Kernel, Arch>};
}

}  // namespace fp4_gemm
