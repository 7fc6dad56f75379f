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
//      counter (shared memory, no atomics). Writes index_map, and for each placed slot its token
//      into the row's entry of the workspace's source map.
//   4. gather_rows: one warp per row of permute_x writes the row once, its token's row (16-byte
//      accesses when x and permute_x allow) or zeros when nobody lands on it, and the row's scale
//      bytes. Every byte of the outputs is written exactly once, rows in order. Blocks take the
//      same positions of all experts together: an expert's positions follow token order, so those
//      rows read nearby tokens, which a token's other slots have just brought into L2.
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
constexpr int kGatherThreads = 256;  // one row per warp
constexpr int kGatherUnroll = 4;     // vectors in flight per lane
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
  int64_t nkb, nkt, scale_rows;  // scale_rows: the swizzled grid's rows (experts * max_token_num, padded)
  int32_t* index_map;
  int32_t* counts;
  int32_t* workspace;  // [chunks, experts] counters, then [experts * max_token_num] source tokens
  int32_t* sources;    // the workspace's source map: a placed row's token (other entries unread)
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
    const bool placed = position >= 0 && position < p.max_token_num;
    if (slot < p.slots) p.index_map[slot] = placed ? position : -1;
    if (placed) p.sources[expert * p.max_token_num + position] = int32_t(slot / p.topk);
  }
}

// The token landing on a row, or -1 when nobody does: expert e's first min(counts[e],
// max_token_num) rows are filled, in position order.
__device__ __forceinline__ int64_t source_of(const PermuteParams& p, int64_t expert, int64_t position) {
  const bool filled = position < __ldg(p.counts + expert);
  return filled ? __ldg(p.sources + expert * p.max_token_num + position) : -1;
}

// Grid (experts, position blocks): block (e, b) takes rows e * max_token_num + b * 8 + warp, and
// so on by the grid's height.
template <class Vector>
__global__ void __launch_bounds__(kGatherThreads) gather_rows_kernel(const PermuteParams p) {
  griddep_wait();
  griddep_launch_dependents();
  constexpr int kWarps = kGatherThreads / 32;
  const int lane = threadIdx.x % 32;
  const int64_t expert = blockIdx.x;
  const int64_t vectors = p.row_bytes / int64_t(sizeof(Vector));
  for (int64_t position = int64_t(blockIdx.y) * kWarps + threadIdx.x / 32; position < p.max_token_num;
       position += int64_t(gridDim.y) * kWarps) {
    const int64_t row = expert * p.max_token_num + position;
    const int64_t token = source_of(p, expert, position);
    const Vector* src = reinterpret_cast<const Vector*>(p.x + (token < 0 ? 0 : token) * p.row_bytes);
    Vector* dst = reinterpret_cast<Vector*>(p.permute_x + row * p.row_bytes);
    for (int64_t v0 = lane; v0 < vectors; v0 += 32 * kGatherUnroll) {
      Vector data[kGatherUnroll];
#pragma unroll
      for (int u = 0; u < kGatherUnroll; ++u) {
        const int64_t v = v0 + u * 32;
        data[u] = token >= 0 && v < vectors ? __ldg(src + v) : Vector{};
      }
#pragma unroll
      for (int u = 0; u < kGatherUnroll; ++u) {
        if (v0 + u * 32 < vectors) dst[v0 + u * 32] = data[u];
      }
    }
    const uint8_t* token_scales = p.scale + (token < 0 ? 0 : token) * p.scale_row_bytes;
    for (int64_t kb = lane; kb < p.nkb; kb += 32) {
      p.out_scale[sf_offset(row, kb, p.nkt)] = token >= 0 ? __ldg(token_scales + (kb >> p.scale_shift)) : 0;
    }
  }
}

// The scale grid's padding rows past experts * max_token_num (when that is not a multiple of 128):
// zero, one thread per byte.
__global__ void __launch_bounds__(kGatherThreads) zero_padding_scales_kernel(const PermuteParams p) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t rows = p.experts * p.max_token_num;
  const int64_t cols = p.nkt * kSfTileCols;
  const int64_t i = int64_t(blockIdx.x) * kGatherThreads + threadIdx.x;
  if (i >= (p.scale_rows - rows) * cols) return;
  p.out_scale[sf_offset(rows + i / cols, i % cols, p.nkt)] = 0;
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
  p.nkb = problem.hidden / 32;
  p.nkt = sf_k_tiles(p.nkb);
  const int64_t rows = p.experts * p.max_token_num;
  p.scale_rows = scale_grid(ScaleLayout::Swizzled, rows, p.nkb).rows;
  p.index_map = problem.index_map;
  p.counts = problem.counts;
  p.workspace = problem.workspace;
  p.sources = problem.workspace + p.chunks * p.experts;

  // The op has no pdl argument: every launch is without programmatic dependent launch.
  const size_t counter_bytes = size_t(p.experts) * sizeof(int32_t);
  if (p.chunks > 0) {
    launch_kernel(chunk_count_kernel, dim3(unsigned(p.chunks)), dim3(kCountThreads), counter_bytes, stream, false, p);
  }
  launch_kernel(chunk_scan_kernel, dim3(unsigned(p.experts)), dim3(kScanThreads), 0, stream, false, p);
  if (p.chunks > 0) {
    launch_kernel(chunk_rank_kernel, dim3(unsigned(p.chunks)), dim3(32), counter_bytes, stream, false, p);
  }
  const bool vectors = is_aligned(problem.x, 16) && is_aligned(problem.permute_x, 16) && p.row_bytes % 16 == 0;
  const int64_t position_blocks = ceil_div(p.max_token_num, kGatherThreads / 32);
  const dim3 grid(unsigned(p.experts), unsigned(std::min<int64_t>(position_blocks, 65535)));
  vectors ? launch_kernel(gather_rows_kernel<uint4>, grid, dim3(kGatherThreads), 0, stream, false, p)
          : launch_kernel(gather_rows_kernel<uint8_t>, grid, dim3(kGatherThreads), 0, stream, false, p);
  const int64_t padding = (p.scale_rows - rows) * p.nkt * kSfTileCols;
  if (padding > 0) {
    launch_kernel(zero_padding_scales_kernel, dim3(unsigned(ceil_div(padding, kGatherThreads))),
                  dim3(kGatherThreads), 0, stream, false, p);
  }
}

}  // namespace fp4_gemm
