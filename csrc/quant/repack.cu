// Streaming-layout repack: one thread per 16-byte chunk (c) of a row (n), reading rows contiguously
// and writing each chunk to its place in its 8 x 32-byte tile (chunks 2i and 2i + 1 of a row stay
// adjacent there, so writes fill whole 32-byte sectors). Buffers that are not 16-byte aligned are
// copied byte by byte.
#include "csrc/common/launch.cuh"
#include "csrc/quant/repack.h"

namespace fp4_gemm {
namespace {

constexpr int kChunkBytes = 16;
constexpr int kTileRows = 8;
constexpr int kTileRowBytes = 32;

struct RepackParams {
  const uint8_t* in;
  uint8_t* out;
  int64_t rows;
  int64_t row_bytes;
  int64_t chunks;  // per row
  bool vector;     // 16-byte accesses
};

__global__ void __launch_bounds__(kMatrixThreads) repack_kernel(const RepackParams p) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t c = matrix_col();
  if (c >= p.chunks) return;
  const int64_t tiles_per_row_group = p.row_bytes / kTileRowBytes;
  for (int64_t n = matrix_first_row(); n < p.rows; n += matrix_row_stride()) {
    const uint8_t* src = p.in + n * p.row_bytes + c * kChunkBytes;
    uint8_t* dst = p.out + ((n / kTileRows) * tiles_per_row_group + c / 2) * (kTileRows * kTileRowBytes) +
                   (n % kTileRows) * kTileRowBytes + (c % 2) * kChunkBytes;
    if (p.vector) {
      *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
    } else {
#pragma unroll
      for (int i = 0; i < kChunkBytes; ++i) dst[i] = __ldg(src + i);
    }
  }
}

}  // namespace

void repack_interleaved(const RepackProblem& problem, cudaStream_t stream) {
  RepackParams p;
  p.in = problem.in;
  p.out = problem.out;
  p.rows = problem.rows;
  p.row_bytes = problem.row_bytes;
  p.chunks = problem.row_bytes / kChunkBytes;
  p.vector = is_aligned(problem.in, kChunkBytes) && is_aligned(problem.out, kChunkBytes);
  if (p.rows == 0 || p.chunks == 0) return;
  const MatrixLaunch shape = matrix_launch(p.rows, p.chunks);
  // The op has no pdl argument: launch without programmatic dependent launch.
  launch_kernel(repack_kernel, shape.grid, shape.block, 0, stream, false, p);
}

}  // namespace fp4_gemm
