// Groups on whole scale tiles, for GEMM kernels whose groups must each start their scales on a
// 128-row SfAtom tile. Reference: reference.tile_group_scales_into. The groups are either
//   contiguous: from the expert id of every row (Grouping::Contiguous's A), or
//   strided:    group g owns rows [g R, (g + 1) R) (batched and masked A with R = group_rows, and
//               the weights of every grouping with R = N, where R is not a multiple of 128), which
//               are the contiguous groups of the ids r / R, computed without them.
//
// From the expert id of every row (device data; no host sync, so CUDA-graph capturable):
//   first[e], rows[e]  expert e's rows of A are [first[e], first[e] + rows[e]): its first and last
//                      row with id e (rows 0 when there is none); ids outside [0, groups) belong to
//                      no expert. Valid ids (docs/API.md, group_contiguous_gemm) make every expert's
//                      rows consecutive; other ids never cause an access out of bounds.
//   tile[e]            expert e's first tile in `scales`: exclusive prefix sum of ceil(rows / 128)
//   scales             each expert's scale rows re-laid from tile[e] on (row first[e] + i at
//                      workspace row tile[e] * 128 + i, both through sf_offset); the rest of an
//                      expert's last tile and the padding columns of every written tile are 0; tiles
//                      past the last expert's are not written.
// The tiles never exceed group_scale_tiles(m, groups) = ceil(m / 128) + groups (sum of
// ceil(rows_e / 128) <= sum of rows_e / 128 + 1), so callers size the workspace from shapes alone;
// the device clamps to it all the same.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/common/sf_layout.cuh"

namespace fp4_gemm {

constexpr int64_t group_scale_tiles(int64_t m, int64_t groups) { return ceil_div(m, kSfTileRows) + groups; }

constexpr int64_t group_scale_bytes(int64_t m, int64_t groups, int64_t nkb) {
  return group_scale_tiles(m, groups) * sf_k_tiles(nkb) * kSfTileBytes;
}

// Where the results lie.
struct GroupScaleTiles {
  int32_t* first;       // [groups]
  int32_t* rows;        // [groups]
  int32_t* tile;        // [groups]
  int32_t* tile_group;  // [group_scale_tiles]: the expert of each tile, -1 past the last one's
  uint8_t* scales;      // group_scale_bytes
};

// Carves the results from one scratch buffer (nullptr: only counts) and returns its bytes, each part
// 256-byte aligned.
int64_t carve_group_scale_tiles(void* scratch, int64_t m, int64_t groups, int64_t nkb, GroupScaleTiles* tiles);

struct TileGroupScalesProblem {
  const int32_t* group_index = nullptr;  // [m] expert id per row; nullptr: strided groups
  int64_t group_rows = 0;                // strided groups: R (then m = groups * R)
  int64_t m = 0;
  int64_t groups = 0;
  const uint8_t* scales = nullptr;  // swizzled scales of the m rows, 4-byte aligned
  int64_t nkb = 0;                  // scale columns
  GroupScaleTiles out{};
  bool pdl = false;
};

void tile_group_scales(const TileGroupScalesProblem& problem, cudaStream_t stream);

// Only the spans of contiguous groups (grouping.cuh): first[e] and rows[e] from expert e's first to
// its last row with id e (0 and 0 without any), the ids read on the device. Unclamped: kernels that
// index the SfAtom rows directly need no tiles of their own.
void find_group_spans(const int32_t* ids, int64_t m, int64_t groups, int32_t* first, int32_t* rows, bool pdl,
                      cudaStream_t stream);

}  // namespace fp4_gemm
