// The register-streaming skinny kernel: out = epilogue(A @ B^T) for a dense problem of at most 64
// activation rows (up to 8 token tiles of 8; above 16 on sm_90 only, backend.cu) against 4-bit
// weights (NVFP4, MXFP4; A in B's format or bf16, W4A16) or MXFP8 weights (A MXFP8) (docs/API.md,
// "Decode and speculative-verify kernels"; reference: reference.gemm).
//
// Work. A cluster of S CTAs owns P consecutive 16-row tiles of B (the mma's M side); CTA rank q
// takes the q-th of S slices of K (whole steps of 128 bytes of a row). Its warps are Wt groups of
// Wk: group j streams tiles j, j + Wt, ... of the P, warp i of a group the i-th of Wk sub-slices of
// the CTA's slice. No shared stages, no producer warp, no mbarriers: lane (g, t) loads chunks 2t and
// 2t + 1 (16 bytes each: 32 4-bit or 16 8-bit elements) of every step of rows g and g + 8 straight
// into registers with non-allocating loads, the next step's while it decodes this one, and the scale
// codes of those chunks' blocks with one load per row (four NVFP4, two MXFP4 or one MXFP8 block:
// consecutive bytes of the SfAtom layout). Rows past N and chunks past K are never read: their words
// and codes are zeros.
//
// Activations. Before the weight loop the CTA decodes (block-scaled A) or gathers (bf16 A) its M
// rows, its slice of K, once into shared memory as the mma's B fragments in the weights' element
// order (operands.cuh's ActivationChunk), the chunks of the last step past K as zeros; one
// __syncthreads. The weight loop then reads one 16-byte fragment (four bf16 pairs: those of one
// 4-bit word, or of two 8-bit words) per token tile with a shared load (the lanes of tokens past M
// read a row of zeros). The Wt groups share them.
//
// Reduction, in a fixed order: each warp stores its accumulators of every tile to shared memory;
// after one __syncthreads the CTA sums the Wk sub-slices in warp order. With S = 1 it applies the
// epilogue (epilogue.cuh) and stores; with S > 1 it keeps the sums in shared memory, the cluster
// synchronizes, and CTA q sums its share of the outputs over the S CTAs in rank order through
// distributed shared memory, applies the epilogue and stores; a second cluster barrier keeps every
// CTA's shared memory alive until all have read it. No global scratch, no atomics: results are
// bitwise equal run to run and under CUDA-graph replay.
//
// NVFP4 outputs are encoded here, one launch: a 16-row tile is one NVFP4 block of each token's
// output row (two tiles under GeGLU, whose output has half the columns), finished and encoded as
// the staged backend's encode kernel does it (nvfp4_output.cuh), and the CTA of rank 0 writes the
// scale grid's padding of its blocks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "csrc/common/launch.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/nvfp4_output.cuh"
#include "csrc/gemm/problem.h"
#include "csrc/gemm/skinny/geometry.h"
#include "csrc/gemm/skinny/operands.cuh"
#include "csrc/gemm/skinny/primitives.cuh"

namespace fp4_gemm::skinny {

constexpr int kStreamStepBytes = 128;                        // bytes of a row one warp step takes
constexpr int kStreamStepChunks = kStreamStepBytes / 16;     // 16-byte chunks: two per lane
constexpr int kStreamFragmentBytes = 16;                     // one lane's four bf16 pairs
constexpr int kStreamMaxWarps = 8;
constexpr int kStreamMaxTiles = 32;

// CTAs of 8 warps per SM the registers are sized for: the accumulators and activation fragments
// grow with the token tiles (16 and 32 registers each at 4 and 8 tiles).
template <int kTokenTiles>
constexpr int kStreamMinBlocks = kTokenTiles <= 2 ? 3 : kTokenTiles == 4 ? 2 : 1;

// Weight tiles of one NVFP4 output block (16 output columns): one, or two under GeGLU, whose output
// has half the columns (the planner gives a CTA whole blocks).
__host__ __device__ constexpr int stream_tiles_per_block(Activation activation) {
  return activation == Activation::Geglu ? 2 : 1;
}

// Shared memory of one activation row's fragments of a step: the step's elements as bf16.
__host__ __device__ constexpr int stream_step_fragment_bytes(int element_bits) {
  return kStreamStepBytes * 8 / element_bits * 2;
}
struct StreamArgs {
  const uint8_t* a;    // [m, a_row_bytes]: block-scaled values, or bf16
  const uint8_t* sfa;  // SfAtom scales of A's rows (block-scaled A)
  int64_t a_row_bytes;
  int64_t sfa_k_tiles;
  const uint8_t* b;    // [n, b_row_bytes] row-major
  const uint8_t* sfb;  // SfAtom scales of B's rows
  int64_t b_row_bytes;
  int64_t sfb_k_tiles;
  int64_t n;
  int m;               // activation rows (<= 8 per token tile)
  int row_chunks;      // b_row_bytes / 16
  int steps;           // ceil(row_chunks / 8): the steps of a row
  int splits;          // S: CTAs of a cluster, rank q the q-th slice of K of the same tiles
  int slice_warps;     // Wk: warps of a group, each a sub-slice of the CTA's slice
  int tile_warps;      // Wt: groups of Wk warps, each its own tiles (blockDim.x = 32 Wk Wt)
  int tiles_per_cta;   // P
  int token_stride;    // bytes of one activation row's fragments in shared memory (64 mod 128)
  int partial_offset;  // the warps' partial sums, after the activations (and the cluster's sums)
  GemmEpilogue epilogue;
  float unbias;        // 2^(the codecs' unbias exponents)
};

template <OperandFormat kA, OperandFormat kB, int kTokenTiles>
struct RegisterStreamKernel {
  using CodecB = OperandCodec<kB>;
  using Chunk = ActivationChunk<kA, kB>;
  static_assert(CodecB::kElementBits == 4 || CodecB::kElementBits == 8, "4-bit or 8-bit weights");
  static constexpr int kPairs = WordShape<kB>::kPairs;          // bf16 pairs per word: 4 (4-bit), 2 (8-bit)
  static constexpr int kMmaSteps = kPairs / 2;                   // mma k16 steps per word
  static constexpr int kFragmentWords = 4 / kPairs;              // words whose pairs fill one fragment
  static constexpr int kChunkFragments = kChunkWords / kFragmentWords;
  static constexpr int kStepFragmentBytes = stream_step_fragment_bytes(CodecB::kElementBits);
  static_assert(kStepFragmentBytes == 2 * kChunkFragments * 4 * kStreamFragmentBytes, "fragment layout");
  // Scale bytes of a lane's two chunks of a row: 4 NVFP4, 2 MXFP4, 1 MXFP8 (both chunks one block).
  static constexpr int kLaneBlocks = 2 * WordShape<kB>::kChunkElements / CodecB::kBlock;
  static constexpr int kChunkCodeBits = 8 * (kLaneBlocks / 2);  // where the second chunk's codes start
  // Bytes between the scale groups of consecutive steps (SfAtom: 4 blocks per 512-byte tile column).
  static constexpr int kScaleStepBytes = 4 * kLaneBlocks / kSfTileCols * kSfTileBytes;
  static constexpr int kAcc = 4 * kTokenTiles;

  // One lane's registers of a step: rows g and g + 8, chunks 2t and 2t + 1.
  struct Step {
    uint32_t words[2][2][kChunkWords];
    uint32_t codes[2];
  };

  // One lane's two rows at its chunks of the current step, and how many chunks of each it may read
  // (the row's, or none past N).
  struct LaneRows {
    const uint8_t* values[2];
    const uint8_t* scales[2];
    int limit[2];
  };

  // ---- the activations ---------------------------------------------------------------------------

  // Fragment u of chunk c of a token's row at: step c / 8, then (chunk parity h, fragment u), then
  // lane t = (c % 8) / 2, so that the four lanes of a quarter warp read 64 consecutive bytes.
  __device__ __forceinline__ static int fragment_offset(int c, int u) {
    return (c / kStreamStepChunks) * kStepFragmentBytes + ((c % 2) * kChunkFragments + u) * 64 +
           ((c % kStreamStepChunks) / 2) * kStreamFragmentBytes;
  }

  // Steps [first_step, first_step + steps) of rows 0 .. m - 1 of A, then a row of zeros that the
  // lanes of the tokens past M read.
  __device__ static void stage_activations(const StreamArgs& args, uint8_t* act, int first_step, int steps) {
    const int chunks = steps * kStreamStepChunks;
    const int first_chunk = first_step * kStreamStepChunks;
    const int items = (args.m + 1) * chunks;
    for (int item = int(threadIdx.x); item < items; item += int(blockDim.x)) {
      const int token = item / chunks;
      const int c = item % chunks;
      uint32_t pairs[kChunkWords][kPairs] = {};
      if (token < args.m && first_chunk + c < args.row_chunks) {
        Chunk chunk;
        chunk.load(args.a, args.sfa, args.a_row_bytes, args.sfa_k_tiles, token, first_chunk + c);
        chunk.fragments(pairs);
      }
      uint8_t* row = act + token * args.token_stride;
#pragma unroll
      for (int u = 0; u < kChunkFragments; ++u) {
        const auto pair = [&](int i) { return pairs[(4 * u + i) / kPairs][(4 * u + i) % kPairs]; };
        *reinterpret_cast<uint4*>(row + fragment_offset(c, u)) = make_uint4(pair(0), pair(1), pair(2), pair(3));
      }
    }
  }

  // ---- the weight stream -------------------------------------------------------------------------

  // The step whose first chunk (of the lane) is `chunk`, then the rows move to the next step.
  // kMasked: chunks at or past a row's limit are not read and hold zeros (words and scale codes).
  template <bool kMasked>
  __device__ __forceinline__ static void load_step(LaneRows& rows, int chunk, Step& s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (!kMasked || chunk + c < rows.limit[h]) v = load_streaming(rows.values[h] + c * 16);
        s.words[h][c][0] = v.x, s.words[h][c][1] = v.y, s.words[h][c][2] = v.z, s.words[h][c][3] = v.w;
      }
      uint32_t codes = 0;
      if (!kMasked || chunk < rows.limit[h]) {
        if constexpr (kLaneBlocks == 4) {
          codes = __ldg(reinterpret_cast<const uint32_t*>(rows.scales[h]));
        } else if constexpr (kLaneBlocks == 2) {
          codes = __ldg(reinterpret_cast<const uint16_t*>(rows.scales[h]));
        } else {
          codes = __ldg(rows.scales[h]);
        }
      }
      // A second chunk past K: its blocks' codes are padding (possibly NaN codes), never used. (An
      // MXFP8 block spans both chunks, and K is a multiple of it: both or neither are past K.)
      if constexpr (kLaneBlocks > 1) {
        if (kMasked && chunk + 1 >= rows.limit[h]) codes &= (1u << kChunkCodeBits) - 1;
      }
      s.codes[h] = codes;
      rows.values[h] += kStreamStepBytes;
      rows.scales[h] += kScaleStepBytes;
    }
  }

  // acc[tt] += B(16 rows, step) x act(tt)^T. kRest: the MX factors' second multiply (operand_codec.cuh).
  template <bool kRest>
  __device__ __forceinline__ static void mma_step(const Step& s, const typename CodecB::Factors (&f)[2][2],
                                                  const uint8_t* const (&act)[kTokenTiles], int offset,
                                                  float (&acc)[kTokenTiles][4]) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int u = 0; u < kChunkFragments; ++u) {
        uint32_t x[kTokenTiles][4];
#pragma unroll
        for (int tt = 0; tt < kTokenTiles; ++tt) {
          const uint4 v = *reinterpret_cast<const uint4*>(act[tt] + offset + (c * kChunkFragments + u) * 64);
          x[tt][0] = v.x, x[tt][1] = v.y, x[tt][2] = v.z, x[tt][3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < kFragmentWords; ++i) {
          const int w = u * kFragmentWords + i;
          uint32_t p[2][kPairs];
          CodecB::template decode<kRest>(s.words[0][c][w], f[0][c], w, p[0]);
          CodecB::template decode<kRest>(s.words[1][c][w], f[1][c], w, p[1]);
#pragma unroll
          for (int k = 0; k < kMmaSteps; ++k) {
            const uint32_t a_frag[4] = {p[0][2 * k], p[1][2 * k], p[0][2 * k + 1], p[1][2 * k + 1]};
#pragma unroll
            for (int tt = 0; tt < kTokenTiles; ++tt) {
              const uint32_t b_frag[2] = {x[tt][i * kPairs + 2 * k], x[tt][i * kPairs + 2 * k + 1]};
              mma_bf16_16x8x16(acc[tt], a_frag, b_frag);
            }
          }
        }
      }
    }
  }

  // act[tt]: this lane's fragments (token tt * 8 + g, or the zero row; lane t); offset: the step's.
  __device__ __forceinline__ static void compute_step(const Step& s, const uint8_t* const (&act)[kTokenTiles],
                                                      int offset, float (&acc)[kTokenTiles][4]) {
    typename CodecB::Factors f[2][2];
    bool twice = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        f[h][c] = CodecB::factors(s.codes[h] >> (kChunkCodeBits * c));
        if constexpr (CodecB::kHasRest) twice = twice || f[h][c].twice;
      }
    }
    if constexpr (CodecB::kHasRest) {
      if (__any_sync(0xFFFFFFFFu, twice)) {
        mma_step<true>(s, f, act, offset, acc);
        return;
      }
    }
    mma_step<false>(s, f, act, offset, acc);
  }

  // Steps [begin, end) of the lane's rows (at step `begin`), two register sets in turn: the next
  // step's loads are in flight while this one is decoded. Only the last step of a row and a tile
  // past N need masks (`whole`: the steps before `whole_steps` of a tile inside N). act holds the
  // fragments of the steps from `first_step` (the CTA's slice) on.
  __device__ __forceinline__ static void stream_slice(LaneRows& rows, const uint8_t* const (&act)[kTokenTiles],
                                                      int first_step, int begin, int end,
                                                      int whole_steps, bool whole_tile, int t,
                                                      float (&acc)[kTokenTiles][4]) {
    const auto load = [&](int step, Step& s) {
      if (whole_tile && step < whole_steps) {
        load_step<false>(rows, step * kStreamStepChunks + 2 * t, s);
      } else {
        load_step<true>(rows, step * kStreamStepChunks + 2 * t, s);
      }
    };
    Step even, odd;
    load(begin, even);
    for (int step = begin; step < end; step += 2) {
      if (step + 1 < end) load(step + 1, odd);
      compute_step(even, act, (step - first_step) * kStepFragmentBytes, acc);
      if (step + 1 < end) {
        if (step + 2 < end) load(step + 2, even);
        compute_step(odd, act, (step + 1 - first_step) * kStepFragmentBytes, acc);
      }
    }
  }

  // ---- the reduction and the epilogue ------------------------------------------------------------

  // The sum over the Wk sub-slices, in warp order, of output (row, token) of the CTA's tile `tile`.
  __device__ __forceinline__ static float slice_sum(const StreamArgs& args, const float* partial, int tile, int token,
                                                    int row) {
    // mma_bf16_16x8x16's accumulator: lane (g, t) holds rows g, g + 8 x tokens 2t, 2t + 1.
    const int lane = (row % 8) * 4 + (token % 8) / 2;
    const int element = (token / 8) * 4 + (row / 8) * 2 + token % 2;
    const float* src = partial + (int64_t(tile) * args.slice_warps * 32 + lane) * kAcc + element;
    float s = src[0];
    for (int w = 1; w < args.slice_warps; ++w) s += src[w * 32 * kAcc];
    return s;
  }

  // Outputs [item_begin, item_end) of the CTA's tiles, as (tile, token, pair of adjacent rows): the
  // pair's sums from sum_pair(tile, token, row), the epilogue, the store.
  template <class SumPair>
  __device__ static void store_outputs(const StreamArgs& args, int64_t first_tile, int item_begin, int item_end,
                                       const SumPair& sum_pair) {
    const GemmEpilogue& e = args.epilogue;
    const float alpha = epilogue_alpha(e, 0) * args.unbias;
    const int pairs = kStreamTileRows / 2;
    for (int item = item_begin + int(threadIdx.x); item < item_end; item += int(blockDim.x)) {
      const int tile = item / (args.m * pairs);
      const int token = item / pairs % args.m;
      const int r = 2 * (item % pairs);
      const int64_t n = (first_tile + tile) * kStreamTileRows + r;
      if (n >= args.n) continue;
      const float2 sum = sum_pair(tile, token, r);
      const float y0 = epilogue_value(e, sum.x, alpha, token, n, args.n, 0);
      const float y1 = n + 1 < args.n ? epilogue_value(e, sum.y, alpha, token, n + 1, args.n, 0) : 0.0f;
      store_pair(e, token, n, args.n, y0, y1);
    }
  }

  // ---- NVFP4 outputs -----------------------------------------------------------------------------

  __device__ __forceinline__ static int64_t output_blocks(const StreamArgs& args) {
    return args.n / stream_tiles_per_block(args.epilogue.activation) / kNvfp4OutGroup;
  }

  // Blocks [item_begin, item_end) of the CTA's, as (block, token), encoded (nvfp4_output.cuh). A
  // block's 16 columns are finished by 8 lanes, two each (rows 2r, 2r + 1 of its tile), or under
  // GeGLU by 16, one each (gelu(row 2r) * row 2r + 1 of the pair of tiles); the block's first lane
  // gathers them by shuffles, encodes and stores it. The loop is warp-uniform (full-mask shuffles).
  template <class SumPair>
  __device__ static void store_nvfp4(const StreamArgs& args, int64_t first_tile, int item_begin, int item_end,
                                     const SumPair& sum_pair) {
    const GemmEpilogue& e = args.epilogue;
    const float alpha = epilogue_alpha(e, 0) * args.unbias;
    const bool geglu = e.activation == Activation::Geglu;
    const int block_lanes = geglu ? 16 : 8;
    const int blocks_per_warp = 32 / block_lanes;
    const int lane = int(threadIdx.x) % 32;
    const int r = lane % block_lanes;
    const int first_lane = lane - r;
    const int64_t nkb = output_blocks(args);
    const int64_t first_block = first_tile / stream_tiles_per_block(e.activation);
    uint8_t* values = static_cast<uint8_t*>(e.out);
    const bool vector = reinterpret_cast<uintptr_t>(values) % kNvfp4OutBlockBytes == 0;
    const int warps = int(blockDim.x) / 32;
    for (int base = item_begin + int(threadIdx.x) / 32 * blocks_per_warp; base < item_end;
         base += warps * blocks_per_warp) {
      const int item = base + lane / block_lanes;
      const int block = item / args.m;
      const int token = item % args.m;
      float v0 = 0.0f, v1 = 0.0f;
      if (item < item_end) {
        const int tile = geglu ? 2 * block + r / 8 : block;
        const int row = 2 * (r % 8);
        const int64_t n = (first_tile + tile) * kStreamTileRows + row;
        const float2 sum = sum_pair(tile, token, row);
        const float y0 = epilogue_sum(e, sum.x, alpha, token, n, args.n, 0);
        const float y1 = epilogue_sum(e, sum.y, alpha, token, n + 1, args.n, 0);
        if (geglu) {
          v0 = nvfp4_output_value(e, y0, y1);
        } else {
          v0 = nvfp4_output_value(e, y0, 0.0f);
          v1 = nvfp4_output_value(e, y1, 0.0f);
        }
      }
      float x[kNvfp4OutGroup];
      if (geglu) {
#pragma unroll
        for (int i = 0; i < kNvfp4OutGroup; ++i) x[i] = __shfl_sync(0xFFFFFFFFu, v0, first_lane + i);
      } else {
#pragma unroll
        for (int i = 0; i < kNvfp4OutGroup; ++i) x[i] = __shfl_sync(0xFFFFFFFFu, i % 2 ? v1 : v0, first_lane + i / 2);
      }
      if (item < item_end && r == 0) {
        const int64_t kb = first_block + block;
        const uint8_t scale = encode_nvfp4_block(x, values + (token * nkb + kb) * kNvfp4OutBlockBytes, vector);
        e.out_scales[scale_index(ScaleLayout::Swizzled, token, kb, nkb)] = scale;
      }
    }
  }

  // The padding of the output's swizzled scale grid, zeros: the rows past M of the CTA's blocks, and
  // in the CTA of the last block every row of the columns past the last block.
  __device__ static void store_nvfp4_padding(const StreamArgs& args, int64_t first_tile, int tiles) {
    const int tiles_per_block = stream_tiles_per_block(args.epilogue.activation);
    const int64_t nkb = output_blocks(args);
    const ScaleGrid grid = scale_grid(ScaleLayout::Swizzled, args.m, nkb);
    const int64_t first_block = first_tile / tiles_per_block;
    const int64_t blocks = tiles / tiles_per_block;
    const int64_t pad_rows = grid.rows - args.m;
    const int64_t pad_cols = first_block + blocks == nkb ? grid.cols - nkb : 0;
    const int64_t items = blocks * pad_rows + pad_cols * grid.rows;
    for (int64_t item = threadIdx.x; item < items; item += blockDim.x) {
      const bool row_pad = item < blocks * pad_rows;
      const int64_t j = row_pad ? item : item - blocks * pad_rows;
      const int64_t kb = row_pad ? first_block + j / pad_rows : nkb + j / grid.rows;
      const int64_t row = row_pad ? args.m + j % pad_rows : j % grid.rows;
      args.epilogue.out_scales[scale_index(ScaleLayout::Swizzled, row, kb, nkb)] = 0;
    }
  }

  // Share `share` of `shares` of the outputs of the CTA's `tiles` tiles (sums from sum_pair), in the
  // output's encoding.
  template <class SumPair>
  __device__ static void store_share(const StreamArgs& args, int64_t first_tile, int tiles, int share, int shares,
                                     const SumPair& sum_pair) {
    const bool nvfp4 = nvfp4_output(args.epilogue);
    const int items = nvfp4 ? tiles / stream_tiles_per_block(args.epilogue.activation) * args.m
                            : tiles * args.m * (kStreamTileRows / 2);
    const int begin = int(int64_t(share) * items / shares);
    const int end = int(int64_t(share + 1) * items / shares);
    if (nvfp4) {
      store_nvfp4(args, first_tile, begin, end, sum_pair);
      if (share == 0) store_nvfp4_padding(args, first_tile, tiles);
    } else {
      store_outputs(args, first_tile, begin, end, sum_pair);
    }
  }

  // S > 1: this CTA's sums of its tiles' outputs [tile][token][row] into `sums`, the cluster
  // barrier, then this rank's share of the outputs summed over the ranks in rank order.
  __device__ static void store_cluster(const StreamArgs& args, const float* partial, float* sums, int64_t first_tile,
                                       int tiles, int rank) {
    const int outputs = tiles * args.m * kStreamTileRows;
    for (int item = int(threadIdx.x); item < outputs; item += int(blockDim.x)) {
      const int row = item % kStreamTileRows;
      const int token = item / kStreamTileRows % args.m;
      const int tile = item / (kStreamTileRows * args.m);
      sums[item] = slice_sum(args, partial, tile, token, row);
    }
    ptx::cluster_sync();  // every rank's sums are complete and visible
    store_share(args, first_tile, tiles, rank, args.splits, [&](int tile, int token, int r) {
      const float* own = sums + (tile * args.m + token) * kStreamTileRows + r;
      float2 sum = ptx::load_cluster_float2(ptx::cluster_address(own, 0));
      for (int q = 1; q < args.splits; ++q) {
        const float2 v = ptx::load_cluster_float2(ptx::cluster_address(own, uint32_t(q)));
        sum.x += v.x;
        sum.y += v.y;
      }
      return sum;
    });
    ptx::cluster_sync();  // no CTA leaves while another may still read its sums
  }

  __device__ static void run(const StreamArgs& args) {
    extern __shared__ __align__(128) uint8_t smem[];
    griddep_wait();
    griddep_launch_dependents();
    const int rank = int(blockIdx.x) % args.splits;
    const int first_step = rank * args.steps / args.splits;
    const int slice_steps = (rank + 1) * args.steps / args.splits - first_step;
    stage_activations(args, smem, first_step, slice_steps);
    __syncthreads();

    const int warp = int(threadIdx.x) / 32;
    const int sub_slice = warp % args.slice_warps;
    const int tile_group = warp / args.slice_warps;
    const int lane = int(threadIdx.x) % 32;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int begin = first_step + sub_slice * slice_steps / args.slice_warps;
    const int end = first_step + (sub_slice + 1) * slice_steps / args.slice_warps;
    const int64_t first_tile = int64_t(blockIdx.x / args.splits) * args.tiles_per_cta;
    const int64_t row_tiles = ceil_div(args.n, kStreamTileRows);
    const int tiles = int(row_tiles - first_tile < args.tiles_per_cta ? row_tiles - first_tile : args.tiles_per_cta);
    const uint8_t* act[kTokenTiles];
#pragma unroll
    for (int tt = 0; tt < kTokenTiles; ++tt) {
      const int token = tt * 8 + g < args.m ? tt * 8 + g : args.m;
      act[tt] = smem + token * args.token_stride + t * kStreamFragmentBytes;
    }
    float* partial = reinterpret_cast<float*>(smem + args.partial_offset);
    // The lane's scale bytes of its first step: tile column t (NVFP4), t / 2, bytes 2 (t % 2) (MXFP4),
    // or byte t (MXFP8).
    const int scale_lane = (t * kLaneBlocks / kSfTileCols) * kSfTileBytes + (t * kLaneBlocks) % kSfTileCols;

    const int whole_steps = args.row_chunks / kStreamStepChunks;
    for (int p = tile_group; p < tiles; p += args.tile_warps) {
      const int64_t row0 = (first_tile + p) * kStreamTileRows;
      LaneRows rows;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + g + 8 * h;
        rows.limit[h] = r < args.n ? args.row_chunks : 0;
        rows.values[h] = args.b + r * args.b_row_bytes + int64_t(begin) * kStreamStepBytes + 2 * t * 16;
        rows.scales[h] = args.sfb + sf_offset(r, 0, args.sfb_k_tiles) + scale_lane + int64_t(begin) * kScaleStepBytes;
      }
      float acc[kTokenTiles][4] = {};
      if (begin < end) {
        stream_slice(rows, act, first_step, begin, end, whole_steps, row0 + kStreamTileRows <= args.n, t, acc);
      }
      float* dst = partial + ((int64_t(p) * args.slice_warps + sub_slice) * 32 + lane) * kAcc;
#pragma unroll
      for (int tt = 0; tt < kTokenTiles; ++tt) {
        *reinterpret_cast<float4*>(dst + 4 * tt) = make_float4(acc[tt][0], acc[tt][1], acc[tt][2], acc[tt][3]);
      }
    }
    __syncthreads();
    if (args.splits > 1) {
      store_cluster(args, partial, reinterpret_cast<float*>(smem), first_tile, tiles, rank);
      return;
    }
    store_share(args, first_tile, tiles, 0, 1, [&](int tile, int token, int r) {
      return make_float2(slice_sum(args, partial, tile, token, r), slice_sum(args, partial, tile, token, r + 1));
    });
  }
};

template <OperandFormat kA, OperandFormat kB, int kTokenTiles>
__global__ void __launch_bounds__(kStreamMaxWarps * 32, kStreamMinBlocks<kTokenTiles>)
    register_stream_kernel(const __grid_constant__ StreamArgs args) {
  RegisterStreamKernel<kA, kB, kTokenTiles>::run(args);
}

}  // namespace fp4_gemm::skinny
