// Host-side decisions of the Blackwell backends (sm100 family: sm_100f and sm_110a; sm120: sm_120f),
// kept free of CUTLASS so they read as plain rules: which problems the CUTLASS block-scaled kernels
// serve, which tile configuration runs, and the batch geometry handed to CUTLASS's L mode (masked and
// contiguous groups: blackwell/grouped.cuh).
//
// The kernels consume the package's buffers as they are: A [M, K] and B [N, K] row-major (K-major,
// CUTLASS's RowMajor A / ColumnMajor B), D and the residual C [M, N] row-major, and the swizzled
// scales, which ARE CUTLASS's Sm1xx SfAtom layout (docs/FORMATS.md; the recipes check the identity at
// compile time).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/blackwell/group_scales.h"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// Tile configurations, numbered as GemmProblem::variant (capabilities()["variant_names"]).
//   Default:  sm100 1-SM 128 x 128 MMA tile; sm120 cooperative 128 x 128.
//   Widen:    twice the rows per B tile: sm100 2-SM 256 x 128 MMA tile over a 2 x 1 cluster; sm120
//             cooperative 256 x 128 (FP4 operands only: an MXFP8 stage of that tile leaves room for
//             a single pipeline stage in sm_120f's shared memory).
//   Pingpong: sm120 only: two consumer warpgroups alternating 128 x 128 tiles, one's epilogue
//             overlapping the other's MMA.
//   StreamK:  not a variant (a caller names 0..2 only): the default tile under CUTLASS's stream-K
//             tile scheduler, which the streamk functions (Schedule::StreamK) run.
enum class BlackwellTile : int { Default = 0, Widen = 1, Pingpong = 2, StreamK = 3 };

// Kernels compiled for an arch section: (operand format, output type, tile).
constexpr bool blackwell_tile_built(GemmArch arch, OperandFormat format, OutFormat out, BlackwellTile tile) {
  // float32: the staged backend's stage, NVFP4 operands and default tile only.
  if (out == OutFormat::Fp32) return format == OperandFormat::Nvfp4 && tile == BlackwellTile::Default;
  if (out != OutFormat::Bf16 && out != OutFormat::Fp16) return false;
  switch (tile) {
    case BlackwellTile::Default:
      return true;
    case BlackwellTile::Widen:
      return arch != GemmArch::Sm120 || format != OperandFormat::Mxfp8;
    case BlackwellTile::Pingpong:
      return arch == GemmArch::Sm120;
    case BlackwellTile::StreamK:
      // One kernel per arch, for what the streamk functions compute (CUTLASS's pingpong kernel
      // takes no stream-K scheduler; the sm120 one is cooperative).
      return format == OperandFormat::Nvfp4 && out == OutFormat::Bf16;
  }
  return false;
}

// Whether a kernel comes with the grouped (ptr-array) kernel of masked problems: the default tile's
// 16-bit outputs. The float32 stage serves dense and batched problems only (staged.cu).
template <OutFormat Out, BlackwellTile Tile>
constexpr bool kHasGroupedKernel = Tile == BlackwellTile::Default && Out != OutFormat::Fp32;

// Which kernel a message is about: "sm100 nvfp4 -> bf16, widen tile".
struct BlackwellKernelId {
  GemmArch arch;
  OperandFormat format;
  OutFormat out;
  BlackwellTile tile;
};

inline std::string describe(const BlackwellKernelId& id) {
  static constexpr const char* kTiles[] = {"default", "widen", "pingpong", "stream-K"};
  const std::string_view out = id.out == OutFormat::Fp32 ? "fp32" : kOutFormatNames[static_cast<int>(id.out)];
  return "sm" + std::to_string(static_cast<int>(id.arch)) + " " +
         std::string(kOperandFormatNames[static_cast<int>(id.format)]) + " -> " + std::string(out) + ", " +
         kTiles[static_cast<int>(id.tile)] + " tile";
}

// Groupings that run CUTLASS's ptr-array (grouped) kernel, one group per weight matrix.
constexpr bool blackwell_grouped(const GemmProblem& p) {
  return p.grouping == Grouping::Masked || p.grouping == Grouping::Contiguous;
}

// Rows of A from which the auto choice takes the wider tile: below it a 256-row tile would leave
// many rows empty and halve the tile count. A shape rule, not a measured optimum
// (no Blackwell GPU has run these kernels yet).
constexpr int64_t kWidenMinRows = 512;

// The tile that runs. The streamk functions' dense problems run the stream-K kernel where the arch
// built it for their operands and output (NVFP4 -> bf16), whatever the variant. Otherwise the
// requested variant when this arch compiled it, else the auto choice (an unbuilt or unknown variant
// falls back, it never fails). Masked and contiguous groups have the default tile's grouped kernel
// only, and float32 outputs the default tile only.
constexpr BlackwellTile choose_blackwell_tile(const GemmProblem& problem, GemmArch arch) {
  const OperandFormat format = problem.a.format;
  const OutFormat out = problem.epilogue.out_format;
  if (blackwell_grouped(problem) || out == OutFormat::Fp32) return BlackwellTile::Default;
  if (problem.schedule == Schedule::StreamK && problem.grouping == Grouping::Dense &&
      blackwell_tile_built(arch, format, out, BlackwellTile::StreamK)) {
    return BlackwellTile::StreamK;
  }
  const int variant = problem.variant;
  if (variant >= 0 && variant <= static_cast<int>(BlackwellTile::Pingpong) &&
      blackwell_tile_built(arch, format, out, static_cast<BlackwellTile>(variant))) {
    return static_cast<BlackwellTile>(variant);
  }
  const int64_t rows = problem.grouping == Grouping::Batched ? problem.group_rows : problem.m;
  const bool widen = rows >= kWidenMinRows && blackwell_tile_built(arch, format, out, BlackwellTile::Widen);
  return widen ? BlackwellTile::Widen : BlackwellTile::Default;
}

// Which scale buffers run re-laid by tile_group_scales's strided groups (group_scales.h), each
// group from a 128-row tile of its own, because a group's rows do not start on one: A of batched and
// masked groups whose group_rows is not a multiple of 128, and the weights' B of any grouping whose
// N is not. (Contiguous A is re-laid from the expert ids in any case: blackwell_grouped.cuh.)
struct BlackwellTiledScales {
  bool a, b;
};

inline BlackwellTiledScales blackwell_tiled_scales(const GemmProblem& p) {
  const bool strided_a = p.grouping == Grouping::Batched || p.grouping == Grouping::Masked;
  return {strided_a && p.groups > 1 && p.group_rows % kSfTileRows != 0, p.groups > 1 && p.n % kSfTileRows != 0};
}

// One problem in CUTLASS's (M, N, K, L) form: L independent M x N x K GEMMs whose operands, scales
// and outputs are packed one after the other (CUTLASS's packed strides and scale layouts give the
// L strides; scale buffers that differ from them run re-laid, blackwell_tiled_scales). The
// epilogue's per-batch vectors need their own strides: 0 shares one alpha / bias across the batches.
struct BlackwellBatch {
  int64_t m, n, k, l;
  int64_t alpha_stride;  // floats between the batches' device alphas
  int64_t bias_stride;   // elements between the batches' bias rows
};

inline BlackwellBatch blackwell_batch(const GemmProblem& p) {
  const bool batched = p.grouping == Grouping::Batched && p.groups > 1;
  if (!batched) return {p.m, p.n, p.k, 1, 0, 0};
  return {p.group_rows, p.n, p.k, p.groups, p.epilogue.alpha_count > 1 ? 1 : 0,
          p.epilogue.bias_per_group ? p.n : 0};
}

// The Blackwell block-scaled MMA takes same-format operands in the three hardware formats.
inline bool blackwell_format(OperandFormat format) {
  return format == OperandFormat::Mxfp8 || format == OperandFormat::Mxfp4 || format == OperandFormat::Nvfp4;
}

// Whether the CUTLASS block-scaled kernels compute `p` (the rules CUTLASS's can_implement and TMA
// descriptors impose, plus what the epilogue tree implements). Host-side fields only.
inline bool blackwell_supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  const bool formats = p.a.format == p.b.format && blackwell_format(p.a.format) && !p.b_interleaved;
  // bf16/fp16 outputs, and float32 of NVFP4 operands for dense and batched problems: the stage of
  // the staged backend's NVFP4 outputs and GeGLU (default tile only). NVFP4 itself is never written
  // here: CUTLASS's block-scale-factor epilogue uses approximate reciprocals (docs/FORMATS.md wants
  // IEEE division), and GeGLU pairs columns, which the per-element epilogue tree cannot.
  const bool fp32_stage = e.out_format == OutFormat::Fp32 && p.a.format == OperandFormat::Nvfp4 && !blackwell_grouped(p);
  const bool out = e.out_format == OutFormat::Bf16 || e.out_format == OutFormat::Fp16 || fp32_stage;
  if (!formats || !out || e.activation == Activation::Geglu || p.m < 1 || p.n < 1 || p.k < 1) return false;
  // Dense; batched (CUTLASS's L mode) and masked (the ptr-array kernels) over groups of group_rows
  // rows; contiguous (the same kernels) from the expert ids. Each group's scales must start on a
  // 128-row SfAtom tile: where they do not, tile_group_scales re-lays them first (blackwell_tiled_scales),
  // its rows counted in int.
  const bool strided_groups = p.groups >= 1 && p.group_rows >= 1 && p.group_rows * p.groups == p.m;
  const bool relaid_rows_fit = group_scale_tiles(p.m, p.groups) * kSfTileRows <= INT32_MAX &&
                               group_scale_tiles(p.groups * p.n, p.groups) * kSfTileRows <= INT32_MAX;
  bool grouping = false;
  switch (p.grouping) {
    case Grouping::Dense:
      grouping = p.groups == 1;
      break;
    case Grouping::Batched:
      grouping = strided_groups;
      break;
    case Grouping::Masked:
      grouping = strided_groups && p.group_index != nullptr;
      break;
    case Grouping::Contiguous:
      grouping = p.groups >= 1 && p.group_index != nullptr;
      break;
  }
  grouping = grouping && relaid_rows_fit;
  const bool per_group = p.grouping != Grouping::Dense;
  // TMA rows start on 16 bytes: K a multiple of 32 elements (16 bytes of E2M1; CUTLASS's FP4
  // alignment) and of the block size, N a multiple of 8 (16 bytes of bf16/fp16 D and C).
  // CUTLASS's problem shape is int.
  const bool shape = p.k % 32 == 0 && p.n % 8 == 0 && p.m <= INT32_MAX && p.n <= INT32_MAX && p.k <= INT32_MAX;
  // Any bias dtype: the epilogue reads it as float32, widened into scratch where it is not (float_bias.h).
  const bool bias = e.bias == nullptr || !e.bias_per_group || per_group;
  const bool alpha = e.alpha_count <= 1 || (per_group && e.alpha_count == p.groups);
  const bool aligned = is_aligned(p.a.values, 16) && is_aligned(p.b.values, 16) && is_aligned(p.a.scales, 16) &&
                       is_aligned(p.b.scales, 16) && is_aligned(e.out, 16) && is_aligned(e.residual, 16);
  return grouping && shape && bias && alpha && aligned;
}

}  // namespace fp4_gemm
