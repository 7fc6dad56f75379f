// The CUTLASS kernel of a Blackwell recipe (sm100/recipe.cuh, sm120/recipe.cuh) from the collective
// builders: a recipe states its arch tag, tiles, cluster, schedules and epilogue tree; the builders'
// arguments every recipe shares (block-scaled tensor ops, row-major A and D, column-major B, float
// accumulation, 16-byte aligned rows, the mainloop's stages carved out around the epilogue) are here.
#pragma once

#include <type_traits>

#include "csrc/gemm/blackwell/run.cuh"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

namespace fp4_gemm {

// `Grouped`: the ptr-array kernel (per-group arguments in device arrays, blackwell/grouped.cuh), whose
// per-group strides CUTLASS spells as pointer layout tags.
template <class ArchTag, class Element, class ElementD, class TileShape, class ClusterShape, class EpilogueSchedule,
          class MainloopSchedule, class Fusion, BlackwellTile Tile, bool Grouped>
struct BlackwellKernelBuilder {
  static constexpr int kAlignmentAB = 128 / cutlass::sizeof_bits<typename Element::DataType>::value;
  static constexpr int kAlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;
  template <class Tag>
  using Layout = std::conditional_t<Grouped, Tag*, Tag>;
  using ProblemShape = std::conditional_t<Grouped, cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>,
                                          cute::Shape<int, int, int, int>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      ArchTag, cutlass::arch::OpClassBlockScaledTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementD, Layout<cutlass::layout::RowMajor>,
      kAlignmentD, ElementD, Layout<cutlass::layout::RowMajor>, kAlignmentD, EpilogueSchedule, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      ArchTag, cutlass::arch::OpClassBlockScaledTensorOp, Element, Layout<cutlass::layout::RowMajor>, kAlignmentAB,
      Element, Layout<cutlass::layout::ColumnMajor>, kAlignmentAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;

  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue,
                                           BlackwellTileScheduler<Tile>>>;
};

}  // namespace fp4_gemm
