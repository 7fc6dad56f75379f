// Groups on whole scale tiles (group_scales.h says what is computed): one block finds every expert's
// rows and first tile (strided groups: a kernel writes them from R), then a wide kernel moves each
// expert's scale rows, one thread per (workspace row, K tile): the 4 scale bytes of a row in one K
// tile are adjacent in the SfAtom layout, so each thread moves one 32-bit word.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <type_traits>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/blackwell/group_scales.h"
#include "csrc/gemm/grouping.cuh"

namespace fp4_gemm {
namespace {

constexpr int kGroupThreads = 1024;
constexpr int kWarps = kGroupThreads / 32;

struct GroupRowsParams {
  const int32_t* ids;
  int32_t m;
  int32_t groups;
  int32_t capacity;  // tiles
  GroupScaleTiles out;
};

// Exclusive prefix sum of `value` over the block (every thread calls it), plus the block's total.
// 64-bit: ids a valid call never has (overlapping experts) may ask for more tiles than int holds.
__device__ long long block_exclusive_sum(long long value, long long* total) {
  __shared__ long long warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const long long below = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += below;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long sum = warp_sums[lane];
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const long long below = __shfl_up_sync(0xffffffffu, sum, offset);
      if (lane >= offset) sum += below;
    }
    warp_sums[lane] = sum;  // inclusive over warps
  }
  __syncthreads();
  const long long result = (warp > 0 ? warp_sums[warp - 1] : 0) + inclusive - value;
  *total = warp_sums[kWarps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return result;
}

// One block: first and last row of every expert (find_first_last), then (3) rows and tiles per
// expert in order, clamped to the capacity, and the expert of every tile.
__global__ void __launch_bounds__(kGroupThreads) group_rows_kernel(const GroupRowsParams p) {
  griddep_wait();  // the ids may come from the previous kernel
  griddep_launch_dependents();
  int32_t* first = p.out.first;
  int32_t* last = p.out.rows;  // the last row until step 3 turns it into a count
  find_first_last(p.ids, p.m, p.groups, first, last);
  __shared__ long long carry;  // tiles of the experts before this chunk, clamped to the capacity
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < p.groups; base += kGroupThreads) {
    const int e = base + static_cast<int>(threadIdx.x);
    const int start = e < p.groups ? first[e] : 0;
    const int end = e < p.groups ? last[e] : -1;
    const int rows = end >= start ? end - start + 1 : 0;
    long long total = 0;
    const int wanted = static_cast<int>(ceil_div(rows, kSfTileRows));
    const long long capacity = p.capacity;
    const int tile = static_cast<int>(min(carry + block_exclusive_sum(wanted, &total), capacity));
    const int tiles = min(wanted, p.capacity - tile);
    if (e < p.groups) {
      p.out.rows[e] = min(rows, tiles * kSfTileRows);
      p.out.first[e] = rows > 0 ? start : 0;
      p.out.tile[e] = tile;
      for (int t = 0; t < tiles; ++t) p.out.tile_group[tile + t] = e;
    }
    __syncthreads();  // every thread has read carry
    if (threadIdx.x == 0) carry = min(carry + total, capacity);
    __syncthreads();
  }
  for (int t = static_cast<int>(carry) + static_cast<int>(threadIdx.x); t < p.capacity; t += kGroupThreads) {
    p.out.tile_group[t] = -1;
  }
}

struct GroupSpansParams {
  const int32_t* ids;
  int32_t m;
  int32_t groups;
  int32_t* first;
  int32_t* rows;
};

// One block: each expert's span (grouping.cuh, find_spans) into global memory.
__global__ void __launch_bounds__(kGroupThreads) group_spans_kernel(const GroupSpansParams p) {
  griddep_wait();
  griddep_launch_dependents();
  find_spans(p.ids, p.m, p.groups, p.first, p.rows);
}

struct StridedRowsParams {
  int32_t groups;
  int32_t group_rows;
  int32_t capacity;  // tiles
  GroupScaleTiles out;
};

// Strided groups: group g's rows start at g R and take ceil(R / 128) tiles from g ceil(R / 128) on,
// which is what group_rows_kernel finds for the ids r / R (groups ceil(R / 128) <= capacity).
__global__ void __launch_bounds__(kMatrixThreads) strided_rows_kernel(const StridedRowsParams p) {
  griddep_wait();
  griddep_launch_dependents();
  const int tiles = static_cast<int>(ceil_div(p.group_rows, kSfTileRows));
  for (int t = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); t < p.capacity;
       t += static_cast<int>(gridDim.x * blockDim.x)) {
    const int g = t / tiles;
    p.out.tile_group[t] = g < p.groups ? g : -1;
    if (g < p.groups && t % tiles == 0) {
      p.out.first[g] = g * p.group_rows;
      p.out.rows[g] = p.group_rows;
      p.out.tile[g] = t;
    }
  }
}

struct MoveParams {
  const uint8_t* scales;
  int64_t nkb;
  int64_t nkt;
  int64_t rows;  // capacity * 128
  GroupScaleTiles out;
};

__global__ void __launch_bounds__(kMatrixThreads) move_scales_kernel(const MoveParams p) {
  griddep_wait();  // the tiles of group_rows_kernel
  griddep_launch_dependents();
  const int64_t kt = matrix_col();
  if (kt >= p.nkt) return;
  // Bytes of this K tile that are scale columns (the rest are the layout's zero padding).
  const int64_t columns = p.nkb - kt * kSfTileCols;
  const uint32_t mask = columns >= 4 ? 0xffffffffu : (1u << (8 * columns)) - 1u;
  for (int64_t row = matrix_first_row(); row < p.rows; row += matrix_row_stride()) {
    const int e = p.out.tile_group[row / kSfTileRows];
    if (e < 0) continue;
    const int64_t i = row - int64_t{p.out.tile[e]} * kSfTileRows;
    uint32_t word = 0;
    if (i < p.out.rows[e]) {
      const int64_t source = sf_offset(p.out.first[e] + i, kt * kSfTileCols, p.nkt);
      word = __ldg(reinterpret_cast<const uint32_t*>(p.scales + source)) & mask;
    }
    *reinterpret_cast<uint32_t*>(p.out.scales + sf_offset(row, kt * kSfTileCols, p.nkt)) = word;
  }
}

}  // namespace

int64_t carve_group_scale_tiles(void* scratch, int64_t m, int64_t groups, int64_t nkb, GroupScaleTiles* tiles) {
  int64_t offset = 0;
  const auto take = [&](auto*& part, int64_t bytes) {
    using T = std::remove_reference_t<decltype(*part)>;
    part = scratch == nullptr ? nullptr : reinterpret_cast<T*>(static_cast<uint8_t*>(scratch) + offset);
    offset += scratch_part_bytes(bytes);
  };
  const int64_t index_bytes = groups * static_cast<int64_t>(sizeof(int32_t));
  take(tiles->first, index_bytes);
  take(tiles->rows, index_bytes);
  take(tiles->tile, index_bytes);
  take(tiles->tile_group, group_scale_tiles(m, groups) * static_cast<int64_t>(sizeof(int32_t)));
  take(tiles->scales, group_scale_bytes(m, groups, nkb));
  return offset;
}

void find_group_spans(const int32_t* ids, int64_t m, int64_t groups, int32_t* first, int32_t* rows, bool pdl,
                      cudaStream_t stream) {
  if (groups < 1 || m < 0 || m > INT_MAX || groups > INT_MAX) {
    throw std::runtime_error("fp4_gemm: find_group_spans needs 1 <= groups and m < 2^31 rows");
  }
  const GroupSpansParams params{ids, static_cast<int32_t>(m), static_cast<int32_t>(groups), first, rows};
  launch_kernel(group_spans_kernel, dim3(1), dim3(kGroupThreads), 0, stream, pdl, params);
}

GroupRows group_rows_without_spans(const GemmProblem& p) {
  GroupRows rows;
  rows.grouping = p.grouping;
  rows.groups = p.groups;
  rows.m = p.m;
  rows.group_rows = p.group_rows;
  if (p.grouping == Grouping::Masked) rows.counts = p.group_index;
  if (p.grouping == Grouping::Contiguous) rows.ids = p.group_index;
  return rows;
}

GroupRows device_group_rows(const GemmProblem& p, int32_t* spans, cudaStream_t stream) {
  GroupRows rows = group_rows_without_spans(p);
  if (p.grouping == Grouping::Contiguous) {
    find_group_spans(p.group_index, p.m, p.groups, spans, spans + p.groups, p.pdl, stream);
    rows.first = spans;
    rows.rows = spans + p.groups;
  }
  return rows;
}

void tile_group_scales(const TileGroupScalesProblem& problem, cudaStream_t stream) {
  const int64_t capacity = group_scale_tiles(problem.m, problem.groups);
  const bool strided = problem.group_index == nullptr;
  if (problem.groups < 1 || problem.m < 0 || capacity * kSfTileRows > INT_MAX || problem.nkb < 1 ||
      !is_aligned(problem.scales, 4) || !is_aligned(problem.out.scales, 4) ||
      (strided && (problem.group_rows < 1 || problem.m != problem.groups * problem.group_rows))) {
    throw std::runtime_error("fp4_gemm: tile_group_scales needs 1 <= groups, (m / 128 + groups) * 128 < 2^31 rows, "
                             "4-byte aligned scale buffers, and m = groups * group_rows >= 1 for strided groups");
  }
  if (strided) {
    StridedRowsParams rows{static_cast<int32_t>(problem.groups), static_cast<int32_t>(problem.group_rows),
                           static_cast<int32_t>(capacity), problem.out};
    const int64_t blocks = std::min<int64_t>(ceil_div(capacity, kMatrixThreads), 1024);
    launch_kernel(strided_rows_kernel, dim3(unsigned(blocks)), dim3(kMatrixThreads), 0, stream, problem.pdl, rows);
  } else {
    GroupRowsParams rows{};
    rows.ids = problem.group_index;
    rows.m = static_cast<int32_t>(problem.m);
    rows.groups = static_cast<int32_t>(problem.groups);
    rows.capacity = static_cast<int32_t>(capacity);
    rows.out = problem.out;
    launch_kernel(group_rows_kernel, dim3(1), dim3(kGroupThreads), 0, stream, problem.pdl, rows);
  }

  MoveParams move{};
  move.scales = problem.scales;
  move.nkb = problem.nkb;
  move.nkt = sf_k_tiles(problem.nkb);
  move.rows = capacity * kSfTileRows;
  move.out = problem.out;
  const MatrixLaunch shape = matrix_launch(move.rows, move.nkt);
  // PDL: the move waits for group_rows_kernel's grid (griddep_wait) before it reads the tiles.
  launch_kernel(move_scales_kernel, shape.grid, shape.block, 0, stream, true, move);
}

}  // namespace fp4_gemm
