// MoE permutation kernels: positions in four launches, none of them ordered by atomics.
//
//   1. chunk_count: slots are cut into chunks of kPermuteChunkSlots consecutive slots (row-major
//      (token, slot) order); each block counts its chunk's slots per expert (shared-memory integer
//      atomics: a sum does not depend on their order) into workspace[chunk][expert].
//   2. chunk_scan: one block per expert turns its column of the workspace into exclusive prefix
//      sums over chunks (the chunk's first position for that expert) and writes the true total to
//      counts. It always runs, so counts is written (all zero) when there are no slots.
//   3. chunk_rank: one warp per chunk walks the chunk in order, 32 slots a step: __match_any_sync
//      groups the lanes of one expert, a slot's position is the expert's next position plus the
//      number of same-expert lanes before it, and the group's last lane advances the expert's
//      counter (shared memory, no atomics). Writes index_map.
//   4. copy_rows: one block per token reads the token's row once (16-byte loads when x and
//      permute_x allow) and stores it to every row its placed slots land on, then writes those
//      rows' scale bytes. Tokens with no placed slot read nothing.
//   5. zero_rows / zero_scale_words (after the scan, independent of 3 and 4): every row nothing
//      lands on is zeroed, values and scale bytes, so each byte of the outputs is written exactly
//      once and the caller need not zero-fill them first.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "csrc/common/launch.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/quant/permute.h"

namespace fp4_gemm {
namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kChunk = int(kPermuteChunkSlots);
constexpr int kCountThreads = 256;
constexpr int kScanThreads = 256;
constexpr int kRankSteps = kChunk / 32;  // slots per lane of the ranking warp
constexpr int kCopyThreads = 128;  // the most: short rows get fewer, so more tokens are in flight per SM
constexpr int kCopyUnroll = 4;  // vectors in flight per thread
constexpr int kZeroThreads = 256;
static_assert(kChunk % kCountThreads == 0 && kChunk % 32 == 0, "whole steps per chunk");

struct PermuteParams {
  const uint8_t* x;
  int64_t row_bytes;
  const uint8_t* scale;
  int64_t scale_row_bytes;  // bytes of one token's scales
  int scale_shift;          // block kb reads scale byte kb >> shift: 2 broadcast, 0 direct
  const int64_t* topk_ids;
  int64_t slots, topk, experts, max_token_num, chunks;
  uint8_t* permute_x;
  uint8_t* out_scale;
  bool scale_words_aligned;  // out_scale may be written 4 bytes at a time
  int64_t nkb, nkt;
  int32_t* index_map;
  int32_t* counts;
  int32_t* workspace;  // [chunks, experts]
};

// A slot's expert, or -1 for ids outside [0, experts) and for slots past the end (the last chunk).
__device__ __forceinline__ int expert_of(const PermuteParams& p, int64_t slot) {
  if (slot >= p.slots) return -1;
  const int64_t id = __ldg(p.topk_ids + slot);
  return id >= 0 && id < p.experts ? int(id) : -1;
}

__global__ void __launch_bounds__(kCountThreads) chunk_count_kernel(const PermuteParams p) {
  griddep_wait();
  griddep_launch_dependents();
  extern __shared__ int32_t histogram[];  // [experts]
  for (int64_t e = threadIdx.x; e < p.experts; e += kCountThreads) histogram[e] = 0;
  __syncthreads();

  const int64_t first = int64_t(blockIdx.x) * kChunk;
  int expert[kChunk / kCountThreads];
#pragma unroll
  for (int i = 0; i < kChunk / kCountThreads; ++i) expert[i] = expert_of(p, first + i * kCountThreads + threadIdx.x);
#pragma unroll
  for (int i = 0; i < kChunk / kCountThreads; ++i) {
    // One shared-memory atomic per expert present in the warp: a hot expert does not serialize.
    const unsigned peers = __match_any_sync(kFullMask, expert[i]);
    const bool last = (peers >> (threadIdx.x % 32)) == 1u;
    if (expert[i] >= 0 && last) atomicAdd(&histogram[expert[i]], __popc(peers));
  }
  __syncthreads();
  int32_t* row = p.workspace + int64_t(blockIdx.x) * p.experts;
  for (int64_t e = threadIdx.x; e < p.experts; e += kCountThreads) row[e] = histogram[e];
}

__global__ void __launch_bounds__(kScanThreads) chunk_scan_kernel(const PermuteParams p) {
  griddep_wait();
  griddep_launch_dependents();
  constexpr int kWarps = kScanThreads / 32;
  __shared__ int32_t warp_sums[kWarps];
  const int64_t expert = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  int32_t running = 0;  // slots of this expert in the chunks before this tile
  for (int64_t c0 = 0; c0 < p.chunks; c0 += kScanThreads) {
    const int64_t chunk = c0 + threadIdx.x;
    const bool inside = chunk < p.chunks;
    int32_t* cell = p.workspace + (inside ? chunk : 0) * p.experts + expert;
    const int32_t count = inside ? *cell : 0;
    int32_t inclusive = count;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int32_t below = __shfl_up_sync(kFullMask, inclusive, d);
      if (lane >= d) inclusive += below;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int32_t before = running, tile = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      before += w < warp ? warp_sums[w] : 0;
      tile += warp_sums[w];
    }
    if (inside) *cell = before + inclusive - count;
    running += tile;
    __syncthreads();  // warp_sums is rewritten by the next tile
  }
  if (threadIdx.x == 0) p.counts[expert] = running;
}

__global__ void __launch_bounds__(32) chunk_rank_kernel(const PermuteParams p) {
  griddep_wait();
  griddep_launch_dependents();
  extern __shared__ int32_t next_position[];  // [experts]: position of the expert's next slot
  const int lane = threadIdx.x;
  const int32_t* offsets = p.workspace + int64_t(blockIdx.x) * p.experts;
  for (int64_t e = lane; e < p.experts; e += 32) next_position[e] = offsets[e];

  // All of the chunk's ids are loaded up front, so their latency is paid once.
  const int64_t first = int64_t(blockIdx.x) * kChunk;
  int expert_of_step[kRankSteps];
#pragma unroll
  for (int i = 0; i < kRankSteps; ++i) expert_of_step[i] = expert_of(p, first + i * 32 + lane);
  __syncwarp();

  const unsigned lanes_before = (1u << lane) - 1;
#pragma unroll
  for (int i = 0; i < kRankSteps; ++i) {
    const int expert = expert_of_step[i];
    const unsigned peers = __match_any_sync(kFullMask, expert);
    const int32_t position = expert >= 0 ? next_position[expert] + __popc(peers & lanes_before) : -1;
    __syncwarp();  // every lane has read its expert's counter before the group's last lane moves it
    if (expert >= 0 && (peers >> lane) == 1u) next_position[expert] = position + 1;
    __syncwarp();
    const int64_t slot = first + i * 32 + lane;
    if (slot < p.slots) p.index_map[slot] = position < p.max_token_num ? position : -1;
  }
}

template <class Vector>
__global__ void __launch_bounds__(kCopyThreads) copy_rows_kernel(const PermuteParams p) {
  griddep_wait();
  griddep_launch_dependents();
  __shared__ int64_t dest_rows[kCopyThreads];  // per staged slot: its row of permute_x, or -1
  const int threads = int(blockDim.x);
  const int64_t token = blockIdx.x;
  const int64_t vectors = p.row_bytes / int64_t(sizeof(Vector));
  const Vector* src = reinterpret_cast<const Vector*>(p.x + token * p.row_bytes);
  const uint8_t* token_scales = p.scale + token * p.scale_row_bytes;

  // Slots are staged `threads` at a time (topk is usually far below that: one pass).
  for (int64_t s0 = 0; s0 < p.topk; s0 += threads) {
    const int staged = int(p.topk - s0 < threads ? p.topk - s0 : threads);
    int64_t dest = -1;
    if (int(threadIdx.x) < staged) {
      const int64_t slot = token * p.topk + s0 + threadIdx.x;
      const int32_t position = __ldg(p.index_map + slot);  // -1 unless placed
      if (position >= 0) dest = __ldg(p.topk_ids + slot) * p.max_token_num + position;
    }
    dest_rows[threadIdx.x] = dest;
    if (!__syncthreads_or(dest >= 0)) continue;  // no placed slot: the row is not even read

    for (int64_t v0 = threadIdx.x; v0 < vectors; v0 += threads * kCopyUnroll) {
      Vector data[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int64_t v = v0 + u * threads;
        if (v < vectors) data[u] = __ldg(src + v);
      }
      for (int j = 0; j < staged; ++j) {
        const int64_t row = dest_rows[j];
        if (row < 0) continue;
        Vector* dst = reinterpret_cast<Vector*>(p.permute_x + row * p.row_bytes);
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u) {
          const int64_t v = v0 + u * threads;
          if (v < vectors) dst[v] = data[u];
        }
      }
    }
    for (int64_t kb = threadIdx.x; kb < p.nkb; kb += threads) {
      const uint8_t byte = __ldg(token_scales + (kb >> p.scale_shift));
      for (int j = 0; j < staged; ++j) {
        const int64_t row = dest_rows[j];
        if (row >= 0) p.out_scale[sf_offset(row, kb, p.nkt)] = byte;
      }
    }
    __syncthreads();  // dest_rows is restaged
  }
}

// Whether a row of permute_x receives a slot: expert e's first min(counts[e], max_token_num) rows.
__device__ __forceinline__ bool row_is_filled(const PermuteParams& p, int64_t row) {
  const int64_t expert = row / p.max_token_num;
  return expert < p.experts && row - expert * p.max_token_num < __ldg(p.counts + expert);
}

// One warp per row of permute_x: unfilled rows are zeroed, filled ones left to copy_rows.
template <class Vector>
__global__ void __launch_bounds__(kZeroThreads) zero_rows_kernel(const PermuteParams p, int64_t rows) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t row = int64_t(blockIdx.x) * (kZeroThreads / 32) + threadIdx.x / 32;
  if (row >= rows || row_is_filled(p, row)) return;
  Vector* dst = reinterpret_cast<Vector*>(p.permute_x + row * p.row_bytes);
  for (int64_t v = threadIdx.x % 32; v < p.row_bytes / int64_t(sizeof(Vector)); v += 32) dst[v] = Vector{};
}

// One thread per 16-byte run of the swizzled scales: each of its four words is one row's 4 blocks
// of a K tile (sf_offset), zeroed unless the row is filled (padding rows of the last tile included).
__global__ void __launch_bounds__(kZeroThreads) zero_scale_words_kernel(const PermuteParams p, int64_t runs) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t run = int64_t(blockIdx.x) * kZeroThreads + threadIdx.x;
  if (run >= runs) return;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int64_t offset = (run * 4 + w) * kSfTileCols;
    if (row_is_filled(p, sf_row(offset, p.nkt))) continue;
    if (p.scale_words_aligned) {
      *reinterpret_cast<uint32_t*>(p.out_scale + offset) = 0;
    } else {
#pragma unroll
      for (int i = 0; i < kSfTileCols; ++i) p.out_scale[offset + i] = 0;
    }
  }
}

}  // namespace

void permute_to_masked(const PermuteProblem& problem, cudaStream_t stream) {
  if (problem.experts < 1 || problem.experts > kPermuteMaxExperts) {
    throw std::invalid_argument("fp4_gemm::permute_to_masked: the number of experts must be in [1, " +
                                std::to_string(kPermuteMaxExperts) + "]");
  }
  PermuteParams p;
  p.x = static_cast<const uint8_t*>(problem.x);
  p.row_bytes = problem.row_bytes;
  p.scale = problem.scale;
  p.scale_row_bytes = problem.broadcast_scale ? problem.hidden / 128 : problem.hidden / 32;
  p.scale_shift = problem.broadcast_scale ? 2 : 0;
  p.topk_ids = problem.topk_ids;
  p.slots = problem.tokens * problem.topk;
  p.topk = problem.topk;
  p.experts = problem.experts;
  p.max_token_num = problem.max_token_num;
  p.chunks = ceil_div(p.slots, kChunk);
  p.permute_x = static_cast<uint8_t*>(problem.permute_x);
  p.out_scale = problem.out_scale;
  p.scale_words_aligned = is_aligned(problem.out_scale, 4);
  p.nkb = problem.hidden / 32;
  p.nkt = sf_k_tiles(p.nkb);
  p.index_map = problem.index_map;
  p.counts = problem.counts;
  p.workspace = problem.workspace;

  // The op has no pdl argument: every launch is without programmatic dependent launch.
  const size_t counter_bytes = size_t(p.experts) * sizeof(int32_t);
  if (p.chunks > 0) {
    launch_kernel(chunk_count_kernel, dim3(unsigned(p.chunks)), dim3(kCountThreads), counter_bytes, stream, false, p);
  }
  launch_kernel(chunk_scan_kernel, dim3(unsigned(p.experts)), dim3(kScanThreads), 0, stream, false, p);
  const bool vectors = is_aligned(problem.x, 16) && is_aligned(problem.permute_x, 16) && p.row_bytes % 16 == 0;
  const int64_t rows = p.experts * p.max_token_num;
  const dim3 row_blocks(unsigned(ceil_div(rows, kZeroThreads / 32)));
  vectors ? launch_kernel(zero_rows_kernel<uint4>, row_blocks, dim3(kZeroThreads), 0, stream, false, p, rows)
          : launch_kernel(zero_rows_kernel<uint8_t>, row_blocks, dim3(kZeroThreads), 0, stream, false, p, rows);
  const ScaleGrid grid = scale_grid(ScaleLayout::Swizzled, rows, p.nkb);
  const int64_t runs = grid.rows * grid.cols / 16;  // whole 512-byte tiles: a multiple of 16 bytes
  launch_kernel(zero_scale_words_kernel, dim3(unsigned(ceil_div(runs, kZeroThreads))), dim3(kZeroThreads), 0, stream,
                false, p, runs);
  if (p.chunks == 0) return;
  launch_kernel(chunk_rank_kernel, dim3(unsigned(p.chunks)), dim3(32), counter_bytes, stream, false, p);
  const dim3 tokens(unsigned(problem.tokens));
  // Enough threads for one unrolled pass over a row, in whole warps: 64 for 4 KB rows, 128 from 8 KB.
  const int64_t row_vectors = vectors ? p.row_bytes / 16 : p.row_bytes;
  const dim3 threads(unsigned(std::clamp<int64_t>(ceil_div(row_vectors, 32 * kCopyUnroll) * 32, 32, kCopyThreads)));
  vectors ? launch_kernel(copy_rows_kernel<uint4>, tokens, threads, 0, stream, false, p)
          : launch_kernel(copy_rows_kernel<uint8_t>, tokens, threads, 0, stream, false, p);
}

}  // namespace fp4_gemm
