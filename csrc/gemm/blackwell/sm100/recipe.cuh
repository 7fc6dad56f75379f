// The sm100-family GEMM (sm_100f: B200/GB200 and B300/GB300; sm_110a: Jetson Thor, same Sm100 arch tag,
// CUDA >= 13): CUTLASS's block-scaled tcgen05 kernel, written once from the collective builders.
//
//   D[l] = act(alpha * A[l] @ B[l]^T + bias + C[l])    A [M, K], B [N, K] (K-major), D/C [M, N] row-major
//
// Operands NVFP4 (nv_float4_t<e2m1>, UE4M3 per 16), MXFP4 (mx_float4_t<e2m1>, UE8M0 per 32) or MXFP8
// (mx_float8_t<e4m3>, UE8M0 per 32), scales in the SfAtom layout; D bf16 or fp16 (float32 for the
// staged backend's stage, NVFP4 operands and default tile only); the epilogue is
// blackwell/epilogue.cuh. Tiles: Default = 1-SM MMA 128 x 128, Widen = 2-SM MMA 256 x 128 on a 2 x 1
// cluster, StreamK = the default tile under CUTLASS's stream-K tile scheduler (NVFP4 -> bf16, the
// streamk functions); K per stage is 128 bytes of each operand row (256 FP4 or 128 FP8 elements).
// Dense and batched (L mode) problems run the GemmUniversal kernel of their tile, masked and
// contiguous groups the ptr-array kernel of the default tile (blackwell/grouped.cuh).
// Constraints: blackwell_supports(). Reference: reference.gemm_into.
#pragma once

// CUTLASS's sm100 kernels wait on the previous grid (griddepcontrol.wait) only with this defined,
// which makes programmatic dependent launch safe for them. Its guard covers the sm_100 and sm_120
// families, not sm_110a, so sm_110a kernels launch without PDL.
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

// CUTLASS's element type and 1-SM / 2-SM / grouped (ptr-array, 1-SM) kernel schedules of an operand format.
template <OperandFormat Format>
struct Sm100Operand;

template <>
struct Sm100Operand<OperandFormat::Nvfp4> {
  using Element = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using Schedule1Sm = cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100;
  using Schedule2Sm = cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100;
  using ScheduleGrouped = cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100;
};

template <>
struct Sm100Operand<OperandFormat::Mxfp4> {
  using Element = cutlass::mx_float4_t<cutlass::float_e2m1_t>;
  using Schedule1Sm = cutlass::gemm::KernelTmaWarpSpecialized1SmMxf4Sm100;
  using Schedule2Sm = cutlass::gemm::KernelTmaWarpSpecialized2SmMxf4Sm100;
  using ScheduleGrouped = cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf4Sm100;
};

template <>
struct Sm100Operand<OperandFormat::Mxfp8> {
  using Element = cutlass::mx_float8_t<cutlass::float_e4m3_t>;
  using Schedule1Sm = cutlass::gemm::KernelTmaWarpSpecialized1SmMxf8f6f4Sm100;
  using Schedule2Sm = cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100;
  using ScheduleGrouped = cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmMxf8f6f4Sm100;
};

// `Grouped`: the ptr-array kernel of masked and contiguous problems (per-group arguments in device
// arrays, blackwell/grouped.cuh), default tile only.
template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile, bool Grouped = false>
struct Sm100Recipe {
  static_assert(Tile == BlackwellTile::Default || (Tile != BlackwellTile::Pingpong && !Grouped),
                "sm100 builds default, widen and stream-K tiles, grouped ones with the default tile");
  static constexpr bool kTwoSm = Tile == BlackwellTile::Widen;
  using Operand = Sm100Operand<Format>;
  using ElementD = BlackwellOutElement<Out>;
  using TileK = cute::Int<128 * 8 / cutlass::sizeof_bits<typename Operand::Element::DataType>::value>;
  using MmaTileShape = cute::Shape<cute::Int<kTwoSm ? 256 : 128>, cute::_128, TileK>;
  using CtaTileShape = cute::Shape<cute::_128, cute::_128, TileK>;  // each SM's half of a 2-SM tile
  using ClusterShape = cute::Shape<cute::Int<kTwoSm ? 2 : 1>, cute::_1, cute::_1>;
  using EpilogueSchedule =
      std::conditional_t<Grouped, cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm,
                         std::conditional_t<kTwoSm, cutlass::epilogue::TmaWarpSpecialized2Sm,
                                            cutlass::epilogue::TmaWarpSpecialized1Sm>>;
  using MainloopSchedule =
      std::conditional_t<Grouped, typename Operand::ScheduleGrouped,
                         std::conditional_t<kTwoSm, typename Operand::Schedule2Sm, typename Operand::Schedule1Sm>>;
  using Builder = BlackwellKernelBuilder<cutlass::arch::Sm100, typename Operand::Element, ElementD, MmaTileShape,
                                         ClusterShape, EpilogueSchedule, MainloopSchedule,
                                         BlackwellEpilogue<Arch, CtaTileShape, ElementD>, Tile, Grouped>;
  using CollectiveMainloop = typename Builder::CollectiveMainloop;
  using Gemm = typename Builder::Gemm;
};

template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
void Sm100Kernel<Arch, Format, Out, Tile>::run(const GemmProblem& problem, cudaStream_t stream) {
  run_blackwell_recipe<Sm100Recipe, Arch, Format, Out, Tile>(problem, stream);
}

template <GemmArch Arch, OperandFormat Format, OutFormat Out, BlackwellTile Tile>
int64_t Sm100Kernel<Arch, Format, Out, Tile>::scratch_bytes(const GemmProblem& problem) {
  return blackwell_recipe_scratch_bytes<Sm100Recipe, Arch, Format, Out, Tile>(problem);
}

}  // namespace fp4_gemm

// The kernels of one operand format for one arch of the family (a gemm_<format>.cu per format, so
// the units compile in parallel).
#define FP4_GEMM_SM100_KERNELS(ARCH, FORMAT)                                                                   \
  template struct fp4_gemm::Sm100Kernel<ARCH, FORMAT, fp4_gemm::OutFormat::Bf16, fp4_gemm::BlackwellTile::Default>; \
  template struct fp4_gemm::Sm100Kernel<ARCH, FORMAT, fp4_gemm::OutFormat::Fp16, fp4_gemm::BlackwellTile::Default>; \
  template struct fp4_gemm::Sm100Kernel<ARCH, FORMAT, fp4_gemm::OutFormat::Bf16, fp4_gemm::BlackwellTile::Widen>;   \
  template struct fp4_gemm::Sm100Kernel<ARCH, FORMAT, fp4_gemm::OutFormat::Fp16, fp4_gemm::BlackwellTile::Widen>;

// The float32 stage of the staged backend's NVFP4 outputs: NVFP4 operands, default tile.
#define FP4_GEMM_SM100_FP32_STAGE(ARCH)                                                        \
  template struct fp4_gemm::Sm100Kernel<ARCH, fp4_gemm::OperandFormat::Nvfp4, fp4_gemm::OutFormat::Fp32, \
                                        fp4_gemm::BlackwellTile::Default>;

// The streamk functions' kernel: NVFP4 operands, bf16 output, stream-K tile.
#define FP4_GEMM_SM100_STREAMK(ARCH)                                                                      \
  template struct fp4_gemm::Sm100Kernel<ARCH, fp4_gemm::OperandFormat::Nvfp4, fp4_gemm::OutFormat::Bf16, \
                                        fp4_gemm::BlackwellTile::StreamK>;
