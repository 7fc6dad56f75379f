// Block-scale layouts (docs/FORMATS.md, "Scale-factor layouts").
//
// Swizzled is CUTLASS's Sm1xx SfAtom: 512-byte tiles of 128 rows x 4 scale columns, K-tile fastest,
// then row-tile; inside a tile, row m sits at (m % 32) * 16 + ((m % 128) / 32) * 4. Every GEMM
// consumes it. Plain is row-major [rows, nkb]. The Python twin is reference.sf_offset.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4_gemm {

enum class ScaleLayout : int { Swizzled = 0, Plain = 1 };

constexpr int kSfTileRows = 128;
constexpr int kSfTileCols = 4;
constexpr int kSfTileBytes = kSfTileRows * kSfTileCols;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Number of 4-column K tiles for `nkb` scale columns.
__host__ __device__ constexpr int64_t sf_k_tiles(int64_t nkb) { return ceil_div(nkb, kSfTileCols); }

// Byte offset of the scale of (row m, block kb) in a swizzled buffer with `nkt` K tiles.
__host__ __device__ constexpr int64_t sf_offset(int64_t m, int64_t kb, int64_t nkt) {
  return ((m / kSfTileRows) * nkt + kb / kSfTileCols) * kSfTileBytes + (m % 32) * 16 +
         ((m % kSfTileRows) / 32) * 4 + kb % kSfTileCols;
}

// The row m whose scales sit at byte `offset` of a swizzled buffer with `nkt` K tiles (sf_offset's
// inverse in m).
__host__ __device__ constexpr int64_t sf_row(int64_t offset, int64_t nkt) {
  const int64_t in_tile = offset % kSfTileBytes;
  return offset / kSfTileBytes / nkt * kSfTileRows + (in_tile % 16) / kSfTileCols * 32 + in_tile / 16;
}

// Extent of the scale grid a buffer stores, padding included: swizzled buffers hold whole tiles.
struct ScaleGrid {
  int64_t rows;
  int64_t cols;
};

__host__ __device__ constexpr ScaleGrid scale_grid(ScaleLayout layout, int64_t rows, int64_t nkb) {
  return layout == ScaleLayout::Swizzled
             ? ScaleGrid{ceil_div(rows, kSfTileRows) * kSfTileRows, sf_k_tiles(nkb) * kSfTileCols}
             : ScaleGrid{rows, nkb};
}

__host__ __device__ constexpr int64_t scale_index(ScaleLayout layout, int64_t m, int64_t kb, int64_t nkb) {
  return layout == ScaleLayout::Swizzled ? sf_offset(m, kb, sf_k_tiles(nkb)) : m * nkb + kb;
}

}  // namespace fp4_gemm
