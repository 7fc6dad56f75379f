// The sm120 GEMM (sm_120f: RTX 5090, RTX PRO 6000, DGX Spark): CUTLASS's block-scaled warp-level MMA kernel
// (arch::Sm120, cluster 1 x 1 x 1), written once from the collective builders.
//
//   D[l] = act(alpha * A[l] @ B[l]^T + bias + C[l])    A [M, K], B [N, K] (K-major), D/C [M, N] row-major
//
// Operands NVFP4 (nv_float4_t<e2m1>, UE4M3 per 16), MXFP4 (mx_float4_t<e2m1>, UE8M0 per 32) or MXFP8
// (mx_float8_t<e4m3>, UE8M0 per 32), scales in the SfAtom layout; D bf16 or fp16 (float32 for the
// staged backend's stage, NVFP4 operands and default tile only); the epilogue is
// blackwell/epilogue.cuh. Tiles (128 K elements per stage, the shapes CUTLASS documents for these
// schedules): Default = cooperative 128 x 128, Widen = cooperative 256 x 128, Pingpong = two
// consumer warpgroups on alternating 128 x 128 tiles, StreamK = the default tile under CUTLASS's
// stream-K tile scheduler (NVFP4 -> bf16, the streamk functions; the pingpong kernel takes no
// stream-K scheduler). Dense and batched (L mode) problems run the GemmUniversal kernel of their
// tile, masked and contiguous groups the grouped kernel of the default tile (blackwell/grouped.cuh).
// Constraints: blackwell_supports(). Reference: reference.gemm_into.
#pragma once

// CUTLASS's kernels wait on the previous grid (griddepcontrol.wait) only with this defined (its
// guard covers the sm_120 family), which makes programmatic dependent launch safe for them.
#define CUTLASS_ENABLE_GDC_FOR_SM100 1

#include <type_traits>

#include "csrc/gemm/blackwell/backend.h"
#include "csrc/gemm/blackwell/epilogue.cuh"
#include "csrc/gemm/blackwell/grouped.cuh"
#include "csrc/gemm/blackwell/kernel_builder.cuh"
#include "csrc/gemm/blackwell/run.cuh"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"

namespace fp4_gemm {

// CUTLASS's element type and cooperative / pingpong kernel schedules of an operand format.
template <OperandFormat Format>
struct Sm120Operand;

template <>
struct Sm120Operand<OperandFormat::Nvfp4> {
  using Element = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedNvf4Sm120;
  using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongNvf4Sm120;
};

template <>
struct Sm120Operand<OperandFormat::Mxfp4> {
  using Element = cutlass::mx_float4_t<cutlass::float_e2m1_t>;
  using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedMxf4Sm120;
  using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongMxf4Sm120;
};

template <>
struct Sm120Operand<OperandFormat::Mxfp8> {
  using Element = cutlass::mx_float8_t<cutlass::float_e4m3_t>;
  using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedMxf8f6f4Sm120;
  using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpongMxf8f6f4Sm120;
};

// `Grouped`: the ptr-array kernel of masked and contiguous problems (per-group arguments in device
// arrays, blackwell/grouped.cuh), default tile only; KernelScheduleAuto picks the grouped cooperative
// schedule and the format's MMA from the pointer layout tags and the element types.
template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile, bool Grouped = false>
struct Sm120Recipe {
  static_assert(Tile == BlackwellTile::Default || !Grouped, "grouped kernels use the default tile");
  using Operand = Sm120Operand<Format>;
  using ElementD = BlackwellOutElement<Out>;
  using TileShape = cute::Shape<cute::Int<Tile == BlackwellTile::Widen ? 256 : 128>, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using MainloopSchedule = std::conditional_t<
      Grouped, cutlass::gemm::collective::KernelScheduleAuto,
      std::conditional_t<Tile == BlackwellTile::Pingpong, typename Operand::Pingpong, typename Operand::Cooperative>>;
  using Builder = BlackwellKernelBuilder<cutlass::arch::Sm120, typename Operand::Element, ElementD, TileShape,
                                         ClusterShape, cutlass::epilogue::collective::EpilogueScheduleAuto,
                                         MainloopSchedule, BlackwellEpilogue<Arch, TileShape, ElementD>, Tile, Grouped>;
  using CollectiveMainloop = typename Builder::CollectiveMainloop;
  using Gemm = typename Builder::Gemm;
};

template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
void Sm120Kernel<Arch, Format, Out, Tile>::run(const GemmProblem& problem, cudaStream_t stream) {
  run_blackwell_recipe<Sm120Recipe, Arch, Format, Out, Tile>(problem, stream);
}

template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
int64_t Sm120Kernel<Arch, Format, Out, Tile>::scratch_bytes(const GemmProblem& problem) {
  return blackwell_recipe_scratch_bytes<Sm120Recipe, Arch, Format, Out, Tile>(problem);
}

}  // namespace fp4_gemm

// The kernels of one operand format: every built tile (blackwell_tile_built), bf16 and fp16 output
// (a gemm_<format>.cu per format, so the units compile in parallel).
#define FP4_GEMM_SM120_KERNEL(FORMAT, TILE)                                                                   \
  template struct fp4_gemm::Sm120Kernel<fp4_gemm::GemmArch::Sm120, FORMAT, fp4_gemm::OutFormat::Bf16, TILE>; \
  template struct fp4_gemm::Sm120Kernel<fp4_gemm::GemmArch::Sm120, FORMAT, fp4_gemm::OutFormat::Fp16, TILE>;

// The float32 stage of the staged backend's NVFP4 outputs: NVFP4 operands, default tile.
#define FP4_GEMM_SM120_FP32_STAGE                                                                         \
  template struct fp4_gemm::Sm120Kernel<fp4_gemm::GemmArch::Sm120, fp4_gemm::OperandFormat::Nvfp4, \
                                        fp4_gemm::OutFormat::Fp32, fp4_gemm::BlackwellTile::Default>;

// The streamk functions' kernel: NVFP4 operands, bf16 output, stream-K tile.
#define FP4_GEMM_SM120_STREAMK                                                                            \
  template struct fp4_gemm::Sm120Kernel<fp4_gemm::GemmArch::Sm120, fp4_gemm::OperandFormat::Nvfp4, \
                                        fp4_gemm::OutFormat::Bf16, fp4_gemm::BlackwellTile::StreamK>;
