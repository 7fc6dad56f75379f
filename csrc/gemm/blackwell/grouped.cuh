// Runs a CUTLASS ptr-array (grouped) block-scaled GEMM on a grouped GemmProblem (docs/FORMATS.md,
// "GEMM result"; reference: reference.gemm_into), one CUTLASS group per weight matrix g:
//   Masked:     rows [g * group_rows, g * group_rows + clamp(masked_m[g], 0, group_rows)) of A and D;
//               every group's scales start on a 128-row SfAtom tile (re-laid so where group_rows is not
//               a multiple of 128: blackwell_tiled_scales), so its scale pointer is an offset.
//   Contiguous: expert g's rows [first, first + rows) of A and D, from the expert id of every row;
//               its scale rows do not start on a tile, so tile_group_scales (group_scales.h) first
//               re-lays them into the scratch, each expert from a tile of its own.
// Only those rows of D are written. The group data lives on the device and the op never syncs with
// the host, so a one-thread-per-group kernel turns it into CUTLASS's per-group arguments (problem
// shapes, operand / scale / output pointers, strides, scale layouts) in the problem's scratch,
// stream-ordered before the GEMM; the GEMM's tile scheduler reads the shapes on the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/blackwell/run.cuh"
#include "csrc/gemm/blackwell/float_bias.h"
#include "csrc/gemm/blackwell/group_scales.h"

namespace fp4_gemm {

// The types of CUTLASS's per-group argument arrays. Plain CUTLASS/CuTe types on purpose: the
// argument kernel is instantiated over them (not over the Gemm, whose type nvcc's host-stub
// generator cannot spell for the sm120 grouped kernels).
template <class Shape_, class StrideA_, class StrideB_, class StrideC_, class StrideD_, class LayoutSFA_,
          class LayoutSFB_, class ScaleConfig_>
struct GroupTypes {
  using Shape = Shape_;
  using StrideA = StrideA_;
  using StrideB = StrideB_;
  using StrideC = StrideC_;
  using StrideD = StrideD_;
  using LayoutSFA = LayoutSFA_;
  using LayoutSFB = LayoutSFB_;
  using ScaleConfig = ScaleConfig_;
};

template <class Gemm>
struct GroupTypesOfImpl {
  using Arguments = typename Gemm::Arguments;
  template <class Ptr>
  using Pointee = std::remove_pointer_t<Ptr>;
  using type = GroupTypes<typename decltype(Arguments{}.problem_shape)::UnderlyingProblemShape,
                          Pointee<decltype(Arguments{}.mainloop.dA)>, Pointee<decltype(Arguments{}.mainloop.dB)>,
                          Pointee<decltype(Arguments{}.epilogue.dC)>, Pointee<decltype(Arguments{}.epilogue.dD)>,
                          Pointee<decltype(Arguments{}.mainloop.layout_SFA)>,
                          Pointee<decltype(Arguments{}.mainloop.layout_SFB)>,
                          typename Gemm::GemmKernel::CollectiveMainloop::Sm1xxBlkScaledConfig>;
};

template <class Gemm>
using GroupTypesOf = typename GroupTypesOfImpl<Gemm>::type;

// CUTLASS's per-group argument arrays, carved from one scratch buffer. Operand pointers are stored
// untyped (CUTLASS reads them as its element pointers; the bits are the same).
template <class Types>
struct GroupArrays {
  typename Types::Shape* shapes;
  const void** a;
  const void** b;
  const void** sfa;
  const void** sfb;
  const void** c;
  void** d;
  typename Types::StrideA* stride_a;
  typename Types::StrideB* stride_b;
  typename Types::StrideC* stride_c;
  typename Types::StrideD* stride_d;
  typename Types::LayoutSFA* layout_sfa;
  typename Types::LayoutSFB* layout_sfb;

  // Lays the arrays of `groups` groups out from `base` (nullptr: only counts) and returns the bytes
  // used, each array 16-byte aligned.
  int64_t carve(void* base, int64_t groups) {
    int64_t offset = 0;
    const auto take = [&](auto*& array) {
      using T = std::remove_reference_t<decltype(*array)>;
      offset = ceil_div(offset, 16) * 16;
      array = base == nullptr ? nullptr : reinterpret_cast<T*>(static_cast<uint8_t*>(base) + offset);
      offset += groups * static_cast<int64_t>(sizeof(T));
    };
    take(shapes), take(a), take(b), take(sfa), take(sfb), take(c), take(d);
    take(stride_a), take(stride_b), take(stride_c), take(stride_d), take(layout_sfa), take(layout_sfb);
    return ceil_div(offset, 256) * 256;
  }
};

// What the argument kernel needs: the flattened buffers, the group data and the geometry shared by
// the groups.
template <class Types>
struct GroupSource {
  GroupArrays<Types> arrays;
  Grouping grouping;        // Masked or Contiguous
  const int32_t* masked_m;  // Masked: rows each group owns
  GroupScaleTiles tiles;    // Contiguous: each expert's rows and re-laid scales
  int groups, group_rows, n, k;
  const uint8_t *a, *b, *sfa, *sfb;  // row 0's / group 0's bytes
  const uint8_t* c;
  uint8_t* d;
  int64_t a_row_bytes, out_row_bytes, b_group_bytes, sfb_group_bytes;
  int64_t sfa_tile_bytes;  // one 128-row tile of A scales, every K tile
  typename Types::StrideA stride_a;  // the same for every group (row pitch K)
  typename Types::StrideB stride_b;
  typename Types::StrideC stride_c;
  typename Types::StrideD stride_d;
  typename Types::LayoutSFB layout_sfb;
};

// One thread per group: the group's shape (its row count) and its slices of every buffer.
// `Arch` keeps the sm_100f and sm_110a instantiations apart (blackwell/epilogue.cuh says why).
template <GemmArch Arch, class Types>
__global__ void group_arguments(GroupSource<Types> s) {
  griddep_wait();  // masked_m or the tiles may come from the previous kernel
  griddep_launch_dependents();  // no effect on the GEMM: it launches without PDL (run_blackwell_grouped)
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= s.groups) return;
  int64_t first = 0;
  int rows = 0;
  const uint8_t* sfa = nullptr;
  if (s.grouping == Grouping::Masked) {
    first = int64_t{g} * s.group_rows;
    rows = min(max(s.masked_m[g], 0), s.group_rows);
    sfa = s.sfa + int64_t{g} * ceil_div(s.group_rows, kSfTileRows) * s.sfa_tile_bytes;
  } else {
    first = s.tiles.first[g];
    rows = s.tiles.rows[g];
    sfa = s.tiles.scales + int64_t{s.tiles.tile[g]} * s.sfa_tile_bytes;
  }
  auto& out = s.arrays;
  out.shapes[g] = cute::make_shape(rows, s.n, s.k);
  out.a[g] = s.a + first * s.a_row_bytes;
  out.b[g] = s.b + g * s.b_group_bytes;
  out.sfa[g] = sfa;
  out.sfb[g] = s.sfb + g * s.sfb_group_bytes;
  out.c[g] = s.c + first * s.out_row_bytes;
  out.d[g] = s.d + first * s.out_row_bytes;
  out.stride_a[g] = s.stride_a;
  out.stride_b[g] = s.stride_b;
  out.stride_c[g] = s.stride_c;
  out.stride_d[g] = s.stride_d;
  out.layout_sfa[g] = Types::ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(rows, s.n, s.k, 1));
  out.layout_sfb[g] = s.layout_sfb;
}

// CUTLASS's arguments of grouped problem `p`, its per-group arrays at `arrays`.
template <class Gemm, class ElementD>
typename Gemm::Arguments blackwell_grouped_arguments(const GemmProblem& p,
                                                    const GroupArrays<GroupTypesOf<Gemm>>& arrays) {
  using Arguments = typename Gemm::Arguments;
  const auto typed = [](auto* array, auto member) { return reinterpret_cast<decltype(member)>(array); };
  Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {static_cast<int>(p.groups), arrays.shapes, nullptr};  // shapes on the device only
  args.mainloop.ptr_A = typed(arrays.a, args.mainloop.ptr_A);
  args.mainloop.dA = arrays.stride_a;
  args.mainloop.ptr_B = typed(arrays.b, args.mainloop.ptr_B);
  args.mainloop.dB = arrays.stride_b;
  args.mainloop.ptr_SFA = typed(arrays.sfa, args.mainloop.ptr_SFA);
  args.mainloop.layout_SFA = arrays.layout_sfa;
  args.mainloop.ptr_SFB = typed(arrays.sfb, args.mainloop.ptr_SFB);
  args.mainloop.layout_SFB = arrays.layout_sfb;
  const GemmEpilogue& e = p.epilogue;
  // The epilogue sees group g as batch l = g: alpha and bias step per group where there is one each.
  args.epilogue.thread = blackwell_epilogue_arguments<decltype(args.epilogue.thread)>(
      e, e.alpha_count > 1 ? 1 : 0, e.bias_per_group ? p.n : 0);
  args.epilogue.ptr_C = typed(arrays.c, args.epilogue.ptr_C);
  args.epilogue.dC = arrays.stride_c;
  args.epilogue.ptr_D = typed(arrays.d, args.epilogue.ptr_D);
  args.epilogue.dD = arrays.stride_d;
  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  args.hw_info.device_id = device;
  constexpr int kClusterSize = cute::size(typename Gemm::GemmKernel::ClusterShape{});
  const int sm_count = blackwell_sm_count(device);
  args.hw_info.sm_count = p.sm_count > 0 ? std::clamp(p.sm_count, kClusterSize, sm_count) : sm_count;
  return args;
}

// Scratch of a contiguous grouping's re-laid scales (0 for masked groups).
inline int64_t group_tiles_bytes(const GemmProblem& p) {
  if (p.grouping != Grouping::Contiguous) return 0;
  GroupScaleTiles tiles{};
  return carve_group_scale_tiles(nullptr, p.m, p.groups, p.k / block_size(p.a.format), &tiles);
}

// Scratch of a grouped problem: the per-group arrays, the re-laid scales, then CUTLASS's workspace.
template <class Gemm, class ElementD>
int64_t blackwell_grouped_scratch_bytes(const GemmProblem& p) {
  GroupArrays<GroupTypesOf<Gemm>> arrays{};
  const int64_t array_bytes = arrays.carve(nullptr, p.groups);
  return array_bytes + group_tiles_bytes(p) +
         static_cast<int64_t>(Gemm::get_workspace_size(blackwell_grouped_arguments<Gemm, ElementD>(p, arrays)));
}

template <GemmArch Arch, class Gemm, class ElementD>
void run_blackwell_grouped(const GemmProblem& p, cudaStream_t stream, const BlackwellKernelId& kernel) {
  using Types = GroupTypesOf<Gemm>;
  GroupArrays<Types> arrays{};
  const int64_t array_bytes = arrays.carve(nullptr, p.groups);
  const int64_t tiles_bytes = group_tiles_bytes(p);
  const typename Gemm::Arguments sized = blackwell_grouped_arguments<Gemm, ElementD>(p, arrays);
  const int64_t workspace_bytes = static_cast<int64_t>(Gemm::get_workspace_size(sized));
  if (p.scratch_bytes < array_bytes + tiles_bytes + workspace_bytes) {
    throw std::runtime_error("fp4_gemm: " + describe(kernel) + " grouped GEMM needs " +
                             std::to_string(array_bytes + tiles_bytes + workspace_bytes) + " bytes of scratch, got " +
                             std::to_string(p.scratch_bytes));
  }
  uint8_t* scratch = static_cast<uint8_t*>(p.scratch);
  arrays.carve(scratch, p.groups);

  const int bits = element_bits(p.a.format);
  const int64_t nkb = p.k / block_size(p.a.format);
  const GemmEpilogue& e = p.epilogue;
  GroupSource<Types> source{};
  source.arrays = arrays;
  source.grouping = p.grouping;
  source.masked_m = p.grouping == Grouping::Masked ? p.group_index : nullptr;
  if (p.grouping == Grouping::Contiguous) {
    carve_group_scale_tiles(scratch + array_bytes, p.m, p.groups, nkb, &source.tiles);
    TileGroupScalesProblem tiles{};
    tiles.group_index = p.group_index;
    tiles.m = p.m;
    tiles.groups = p.groups;
    tiles.scales = p.a.scales;
    tiles.nkb = nkb;
    tiles.out = source.tiles;
    tiles.pdl = p.pdl;
    tile_group_scales(tiles, stream);
  }
  // Rows per group for the packed strides: only their batch (L) stride depends on it, and L is 1.
  const int rows = static_cast<int>(p.grouping == Grouping::Masked ? p.group_rows : p.m);
  source.groups = static_cast<int>(p.groups);
  source.group_rows = static_cast<int>(p.group_rows);
  source.n = static_cast<int>(p.n);
  source.k = static_cast<int>(p.k);
  source.a = static_cast<const uint8_t*>(p.a.values);
  source.b = static_cast<const uint8_t*>(p.b.values);
  source.sfa = p.a.scales;
  source.sfb = p.b.scales;
  // Without a residual beta is 0 and C is never read; D stands in so every descriptor is valid.
  source.c = static_cast<const uint8_t*>(e.residual != nullptr ? e.residual : e.out);
  source.d = static_cast<uint8_t*>(e.out);
  source.a_row_bytes = p.k * bits / 8;
  source.out_row_bytes = p.n * static_cast<int64_t>(sizeof(ElementD));
  source.b_group_bytes = p.n * p.k * bits / 8;
  source.sfb_group_bytes = ceil_div(p.n, kSfTileRows) * sf_k_tiles(nkb) * kSfTileBytes;
  source.sfa_tile_bytes = sf_k_tiles(nkb) * kSfTileBytes;
  source.stride_a = cutlass::make_cute_packed_stride(typename Types::StrideA{}, cute::make_shape(rows, source.k, 1));
  source.stride_b = cutlass::make_cute_packed_stride(typename Types::StrideB{}, cute::make_shape(source.n, source.k, 1));
  source.stride_c = cutlass::make_cute_packed_stride(typename Types::StrideC{}, cute::make_shape(rows, source.n, 1));
  source.stride_d = cutlass::make_cute_packed_stride(typename Types::StrideD{}, cute::make_shape(rows, source.n, 1));
  source.layout_sfb = Types::ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(rows, source.n, source.k, 1));
  constexpr int kThreads = 128;
  // After tile_group_scales the argument kernel may launch early: it waits on that grid first.
  launch_kernel(group_arguments<Arch, Types>, dim3(unsigned(ceil_div(p.groups, kThreads))), dim3(kThreads), 0,
                stream, p.pdl || p.grouping == Grouping::Contiguous, source);

  const typename Gemm::Arguments args = blackwell_grouped_arguments<Gemm, ElementD>(p, arrays);
  Gemm gemm;
  check_cutlass(gemm.can_implement(args), "can_implement", kernel);
  void* workspace = workspace_bytes > 0 ? scratch + array_bytes + tiles_bytes : nullptr;
  check_cutlass(gemm.initialize(args, workspace, stream), "initialize", kernel);
  // Without PDL: the GEMM's tile scheduler may read the group shapes before CUTLASS's grid wait.
  check_cutlass(gemm.run(stream, nullptr, false), "run", kernel);
  FP4_GEMM_CUDA_CHECK(cudaGetLastError());
}

// Scratch of the scale buffers blackwell_tiled_scales re-lays (strided groups of tile_group_scales).
inline int64_t tiled_scales_bytes(const GemmProblem& p) {
  const BlackwellTiledScales tiled = blackwell_tiled_scales(p);
  const int64_t nkb = p.k / block_size(p.a.format);
  GroupScaleTiles tiles{};
  return (tiled.a ? carve_group_scale_tiles(nullptr, p.m, p.groups, nkb, &tiles) : 0) +
         (tiled.b ? carve_group_scale_tiles(nullptr, p.groups * p.n, p.groups, nkb, &tiles) : 0);
}

// Re-lays the scale buffers blackwell_tiled_scales names into the head of p.scratch, each group from
// a tile of its own (CUTLASS's per-batch scale layout), and returns the problem on them, its scratch
// past them. Stream-ordered device work only: no host sync.
inline GemmProblem with_tiled_scales(const GemmProblem& p, cudaStream_t stream) {
  const BlackwellTiledScales tiled = blackwell_tiled_scales(p);
  GemmProblem out = p;
  if (!tiled.a && !tiled.b) return out;
  if (p.scratch_bytes < tiled_scales_bytes(p)) {
    throw std::runtime_error("fp4_gemm: the Blackwell GEMM got less scratch than its re-laid scales need");
  }
  uint8_t* scratch = static_cast<uint8_t*>(p.scratch);
  bool pdl = p.pdl;
  const auto relay = [&](const uint8_t* scales, int64_t group_rows) {
    TileGroupScalesProblem t{};
    t.group_rows = group_rows;
    t.m = p.groups * group_rows;
    t.groups = p.groups;
    t.scales = scales;
    t.nkb = p.k / block_size(p.a.format);
    t.pdl = pdl;
    scratch += carve_group_scale_tiles(scratch, t.m, t.groups, t.nkb, &t.out);
    tile_group_scales(t, stream);
    pdl = true;  // tile_group_scales's kernels wait for the previous grid before their first read
    return t.out.scales;
  };
  if (tiled.a) out.a.scales = relay(p.a.scales, p.group_rows);
  if (tiled.b) out.b.scales = relay(p.b.scales, p.n);
  out.scratch = scratch;
  out.scratch_bytes = p.scratch_bytes - (scratch - static_cast<uint8_t*>(p.scratch));
  return out;
}

// Whether the bias must be widened into scratch first: the epilogue tree reads float32 with 16-byte
// vector loads (float_bias.h).
inline bool needs_float_bias(const GemmEpilogue& e) {
  return e.bias != nullptr && (e.bias_type != FloatType::Fp32 || !is_aligned(e.bias, 16));
}

inline int64_t float_bias_bytes(const GemmProblem& p) {
  if (!needs_float_bias(p.epilogue)) return 0;
  const int64_t count = bias_elements(p.n, p.groups, p.epilogue.bias_per_group);
  return scratch_part_bytes(count * static_cast<int64_t>(sizeof(float)));
}

// Widens the bias into the head of p.scratch where needs_float_bias says so, and returns the problem
// on the float32 copy, its scratch past it. Stream-ordered device work only: no host sync.
inline GemmProblem with_float_bias(const GemmProblem& p, cudaStream_t stream) {
  GemmProblem out = p;
  const int64_t bytes = float_bias_bytes(p);
  if (bytes == 0) return out;
  if (p.scratch_bytes < bytes) {
    throw std::runtime_error("fp4_gemm: the Blackwell GEMM got less scratch than its float32 bias needs");
  }
  float* bias = static_cast<float*>(p.scratch);
  widen_to_float(p.epilogue.bias, p.epilogue.bias_type, bias_elements(p.n, p.groups, p.epilogue.bias_per_group),
                 bias, p.pdl, stream);
  out.epilogue.bias = bias;
  out.epilogue.bias_type = FloatType::Fp32;
  out.scratch = static_cast<uint8_t*>(p.scratch) + bytes;
  out.scratch_bytes = p.scratch_bytes - bytes;
  return out;
}

// run() and scratch_bytes() of a family's kernel (Sm100Kernel, Sm120Kernel), given its recipe
// template: masked and contiguous problems take the recipe's grouped twin where it has one
// (kHasGroupedKernel), the rest its universal kernel. Only sm_110a launches without PDL (CUTLASS's
// grid-dependency guard does not cover it).
template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile, bool> class Recipe, GemmArch Arch,
          OperandFormat Format, OutFormat Out, BlackwellTile Tile>
void run_blackwell_recipe(const GemmProblem& original, cudaStream_t stream) {
  const GemmProblem problem = with_tiled_scales(with_float_bias(original, stream), stream);
  const BlackwellKernelId id{Arch, Format, Out, Tile};
  if constexpr (kHasGroupedKernel<Out, Tile>) {
    if (blackwell_grouped(problem)) {
      using Grouped = Recipe<Arch, Format, Out, Tile, true>;
      return run_blackwell_grouped<Arch, typename Grouped::Gemm, typename Grouped::ElementD>(problem, stream, id);
    }
  }
  using Universal = Recipe<Arch, Format, Out, Tile, false>;
  static_assert(scale_layout_is_sf_offset<typename Universal::CollectiveMainloop::Sm1xxBlkScaledConfig>(),
                "CUTLASS's scale-factor layout differs from sf_offset");
  run_blackwell_gemm<typename Universal::Gemm, typename Universal::ElementD>(problem, stream, id,
                                                                            Arch != GemmArch::Sm110);
}

template <template <GemmArch, OperandFormat, OutFormat, BlackwellTile, bool> class Recipe, GemmArch Arch,
          OperandFormat Format, OutFormat Out, BlackwellTile Tile>
int64_t blackwell_recipe_scratch_bytes(const GemmProblem& problem) {
  if constexpr (kHasGroupedKernel<Out, Tile>) {
    if (blackwell_grouped(problem)) {
      using Grouped = Recipe<Arch, Format, Out, Tile, true>;
      return float_bias_bytes(problem) + tiled_scales_bytes(problem) +
             blackwell_grouped_scratch_bytes<typename Grouped::Gemm, typename Grouped::ElementD>(problem);
    }
  }
  using Universal = Recipe<Arch, Format, Out, Tile, false>;
  return float_bias_bytes(problem) + tiled_scales_bytes(problem) +
         blackwell_workspace_bytes<typename Universal::Gemm, typename Universal::ElementD>(problem);
}

}  // namespace fp4_gemm
