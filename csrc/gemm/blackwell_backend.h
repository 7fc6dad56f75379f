// The Blackwell GEMM backends: one per arch section (sm100, sm110, sm120), each a table of CUTLASS
// kernels indexed by (operand format, output type, tile), instantiated in the section's gemm_*.cu
// files and chosen here at run time. Light on purpose: the registering backend.cu units include no
// CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "csrc/gemm/backends.h"
#include "csrc/gemm/blackwell_args.h"
#include "csrc/gemm/problem.h"
#include "csrc/quant/quantize.h"

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
  if constexpr (blackwell_tile_built(Arch, Format, BlackwellTile::Widen)) {
    if (tile == BlackwellTile::Widen) return visit(Kernel<Arch, Format, Out, BlackwellTile::Widen>{});
  }
  if constexpr (blackwell_tile_built(Arch, Format, BlackwellTile::Pingpong)) {
    if (tile == BlackwellTile::Pingpong) return visit(Kernel<Arch, Format, Out, BlackwellTile::Pingpong>{});
  }
  return visit(Kernel<Arch, Format, Out, BlackwellTile::Default>{});
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch,
          OperandFormat Format, class Visit>
decltype(auto) visit_blackwell_format(const GemmProblem& problem, Visit&& visit) {
  const BlackwellTile tile = choose_blackwell_tile(problem, Arch);
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

// NVFP4 of the fp16-rounded result (OutFormat::Nvfp4FromFp16): the CUTLASS kernel writes the fp16
// result into the first fp16_stage_bytes of the scratch (CUTLASS's workspace follows), then the
// package's NVFP4 quantizer (bit-exact with reference.quantize_blocks) encodes it into out and
// out_scales, every scale byte of the padded grid included.
inline int64_t fp16_stage_bytes(const GemmProblem& p) {
  constexpr int64_t kAlign = 256;
  return ceil_div(p.m * p.n * 2, kAlign) * kAlign;
}

inline GemmProblem fp16_stage_problem(const GemmProblem& p) {
  GemmProblem stage = p;
  stage.epilogue.out_format = OutFormat::Fp16;
  stage.epilogue.out = p.scratch;
  stage.epilogue.out_scales = nullptr;
  const int64_t bytes = fp16_stage_bytes(p);
  stage.scratch = p.scratch == nullptr ? nullptr : static_cast<uint8_t*>(p.scratch) + bytes;
  stage.scratch_bytes = p.scratch_bytes > bytes ? p.scratch_bytes - bytes : 0;
  return stage;
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch>
void run_blackwell(const GemmProblem& problem, cudaStream_t stream) {
  const auto run = [&](const GemmProblem& p) {
    visit_blackwell_kernel<Kernel, Arch>(p, [&](auto kernel) { decltype(kernel)::run(p, stream); });
  };
  if (problem.epilogue.out_format != OutFormat::Nvfp4FromFp16) return run(problem);
  if (problem.scratch_bytes < fp16_stage_bytes(problem)) {
    throw std::runtime_error("fp4_gemm: the Blackwell NVFP4-output GEMM needs " +
                             std::to_string(fp16_stage_bytes(problem)) + " bytes of scratch for its fp16 stage");
  }
  const GemmProblem stage = fp16_stage_problem(problem);
  run(stage);
  QuantizeProblem quantize_problem{};
  quantize_problem.input = stage.epilogue.out;
  quantize_problem.input_type = FloatType::Fp16;
  quantize_problem.in_rows = quantize_problem.out_rows = problem.m;
  quantize_problem.in_cols = quantize_problem.out_cols = problem.n;
  quantize_problem.values = problem.epilogue.out;
  quantize_problem.scales = problem.epilogue.out_scales;
  quantize_problem.recipe = Recipe::Nvfp4;
  quantize_problem.layout = ScaleLayout::Swizzled;
  quantize_problem.pdl = true;  // the quantizer waits for the GEMM's grid before its first read
  quantize(quantize_problem, stream);
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch>
int64_t blackwell_scratch_bytes(const GemmProblem& problem) {
  const auto workspace = [&](const GemmProblem& p) {
    return visit_blackwell_kernel<Kernel, Arch>(p, [&](auto kernel) { return decltype(kernel)::scratch_bytes(p); });
  };
  if (problem.epilogue.out_format != OutFormat::Nvfp4FromFp16) return workspace(problem);
  return fp16_stage_bytes(problem) + workspace(fp16_stage_problem(problem));
}

// After the skinny tiers (M <= 16), which stream the weight faster than a 128-row tile can.
constexpr int kBlackwellPriority = 100;

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile> class Kernel, GemmArch Arch>
GemmBackend blackwell_backend(const char* name) {
  return GemmBackend{name,
                     Arch,
                     kBlackwellPriority,
                     &blackwell_supports,
                     &run_blackwell<Kernel, Arch>,
                     &blackwell_scratch_bytes<Kernel, Arch>};
}

}  // namespace fp4_gemm
