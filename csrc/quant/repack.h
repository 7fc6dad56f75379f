// Repack of a row-major packed 4-bit weight into the streaming layout of the decode GEMV
// (docs/API.md, fp4_repack_b_interleaved_sm120; reference: reference.interleave_rows): tiles of
// 8 rows x 32 bytes (64 elements), tile (n / 8, k / 64) at byte ((n / 8) * (K / 64) + k / 64) * 256,
// the tile's rows 32 bytes apart. Only value bytes move; the scales keep their layout.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4_gemm {

struct RepackProblem {
  const uint8_t* in;  // [rows, row_bytes] row-major
  uint8_t* out;       // [rows, row_bytes] bytes in the streaming layout; must not overlap `in`
  int64_t rows;       // multiple of 8
  int64_t row_bytes;  // multiple of 32 (K % 64 == 0)
};

void repack_interleaved(const RepackProblem& problem, cudaStream_t stream);

}  // namespace fp4_gemm
