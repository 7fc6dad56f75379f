// The skinny GEMM kernel: out = epilogue(A @ B[g]^T) for at most 16 activation rows per group g
// against weights streamed once from memory (docs/API.md, "Decode and speculative-verify kernels").
// Dense, batched, masked and contiguous problems alike: a group's rows come from GroupRows
// (grouping.cuh), read on the device.
//
// Work. A *unit* is one group's 128 weight rows (one SfAtom row tile) against one chunk of at most
// 16 of its activation rows. A cluster of S CTAs owns a unit; CTA rank q streams the q-th of S
// slices of K. Clusters walk the units in a rising sequence (GroupCursor), so that a group with no
// rows has no unit and reads no weight byte, and a group with more than 16 rows has one unit per
// 16-row chunk (its weight streams once per chunk).
// A contiguous problem's spans come from find_group_spans' kernel, or, for few rows, from every CTA
// itself (grouping.cuh's block spans, found in the prologue): one launch instead of two.
//
// Streaming. One producer warp fills a ring of `stages` shared buffers, each completing on an
// mbarrier: a *stage* is the unit's 128 rows x L slabs of 64 bytes, one TMA box (cp.async.bulk.tensor;
// one bulk copy per 8-row tile of the streaming layout), plus the SfAtom tiles of those K columns, one
// bulk copy. 2L consumer warps each take 64 rows (four mma tiles of 16) x one slab of every stage;
// with L odd the stage's row stride is 64 mod 128 bytes, so that their 16-byte reads hit distinct
// banks. The CTAs of a cluster split every row's stages, whole stages each.
//
// Decode and MMA. The MMA runs with A and B swapped: 16 weight rows are its M side, 8 activation
// rows its N side. Lane (g, t) reads chunk t of the slab of rows g and g + 8, decodes each 32-bit
// word into bf16 pairs with the block scale folded in (operand_codec.cuh), and feeds mma k16 steps.
// The activation rows of a stage are decoded once per CTA into a shared buffer laid out as the
// mma's B fragments (double-buffered, one consumer barrier per stage), in the same element order.
//
// Reduction, in a fixed order: the L slab warps of a row group add into the CTA's partial sums in
// warp order; with S > 1 every CTA then signals the cluster (mbarriers on every CTA, arrived at
// over distributed shared memory), and CTA q sums rows [q * 128 / S, (q + 1) * 128 / S) of the S
// partials in rank order, applies the epilogue (epilogue.cuh) and stores. No global scratch, no
// counters, no memset: results are bitwise equal run to run, under CUDA-graph replay and on
// concurrent streams.
//
// The hand-over is ordered by two cluster-scope mbarriers per CTA. `ready`: after the named
// barrier that ends the partial sums, one thread fences (fence.acq_rel.cluster) and arrives with
// release semantics on every rank's `ready`; each rank's threads wait on their own with acquire
// semantics before reading any rank's partials. `consumed`: after the named barrier that ends those
// reads, one thread arrives on every rank's `consumed`; a rank waits on its own before it writes
// the buffers its partials alias (the next unit's activations), and before it exits. compute-
// sanitizer's racecheck does not model mbarrier synchronization between the CTAs of a cluster and
// reports the remote reads as hazards; tests/test_gemm_skinny.py holds the results bitwise equal
// while other work shifts when the ranks arrive.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "csrc/common/launch.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/grouping.cuh"
#include "csrc/gemm/problem.h"
#include "csrc/gemm/skinny/geometry.h"
#include "csrc/gemm/skinny/operands.cuh"
#include "csrc/gemm/skinny/primitives.cuh"

namespace fp4_gemm::skinny {

constexpr int kTileRows = 16;    // weight rows of one mma
constexpr int kTileTokens = 8;   // activation rows of one mma
constexpr int kBlockRows = kSfTileRows;  // weight rows of a unit
constexpr int kGroupTiles = 4;   // mma tiles of a consumer warp
constexpr int kGroupRows = kGroupTiles * kTileRows;
constexpr int kRowGroups = kBlockRows / kGroupRows;
constexpr int kSlabBytes = 64;   // bytes of a row a consumer warp takes from a stage
constexpr int kChunkBytes = 16;  // one lane's read
constexpr int kSlabChunks = kSlabBytes / kChunkBytes;
static_assert(kChunkWords == kChunkBytes / 4);
constexpr int kMaxLanes = 4;     // slab warps per row group
constexpr int kMaxStages = 8;
constexpr int kPartialStride = kBlockRows + 4;  // floats per activation row of the partial sums
constexpr int kConsumerBarrier = 1;             // named barrier of the consumer warps

struct SkinnyArgs {
  CUtensorMap b_map;   // row-major B as a [groups * n, b_row_bytes] byte matrix, boxes of one stage
  const uint8_t* a;    // [rows of A, a_row_bytes]: block-scaled values, or bf16
  const uint8_t* sfa;  // SfAtom scales of A's rows (block-scaled A)
  int64_t a_row_bytes;
  int64_t sfa_k_tiles;
  const uint8_t* b;    // groups x [n, b_row_bytes], row-major or the streaming layout
  const uint8_t* sfb;  // SfAtom scales of all groups' rows
  int64_t b_row_bytes;
  int64_t sfb_k_tiles;
  int64_t n;           // rows of each weight matrix
  int64_t row_blocks;  // ceil(n / 128)
  int64_t slabs;       // ceil(b_row_bytes / 64)
  int64_t row_stages;  // ceil(slabs / lanes): the stages of one row
  GroupRows groups;
  int splits;       // S: CTAs of a cluster, each a slice of K
  int lanes;        // L: slab warps per row group (2L consumer warps), slabs per stage
  int stages;       // ring buffers
  int row_stride;   // bytes of one row in a stage (row-major B): lanes * 64
  int rows_bytes;   // bytes of a stage's rows; its SfAtom tiles follow
  int stage_bytes;
  int act_offset;   // the two activation buffers (and the partial sums), after the ring
  int act_bytes;    // one activation buffer
  int span_offset;  // >= 0: a contiguous problem's block spans (grouping.cuh, spans_in_block) in
                    // the shared memory from here; -1: groups.first and groups.rows
  GemmEpilogue epilogue;
  float unbias;     // 2^(the codecs' unbias exponents)
};

// A unit: rows [a_row0, a_row0 + tokens) of A (all of group `group`) against weight rows
// [row_block * 128, +128) of that group.
struct Unit {
  int64_t group;
  int64_t a_row0;
  int tokens;
  int64_t row_block;
};

// The units of one cluster: next, next + stride, ... over every group's units.
struct UnitWalk {
  GroupCursor cursor;
  int64_t next;
  int64_t stride;
  int64_t row_blocks;

  // block_spans: the CTA's own contiguous spans (shared memory), or null: the GroupRows'.
  __device__ __forceinline__ bool advance(const GroupRows& groups, const int32_t* block_spans, Unit& unit) {
    const int64_t row_blocks_ = row_blocks;
    const auto units = [row_blocks_](const GroupSpan& span) { return row_blocks_ * ceil_div(span.rows, kMaxTokens); };
    if (!cursor.seek(groups, next, units, block_spans)) return false;
    const int64_t local = next - cursor.base;
    const int64_t chunk = local / row_blocks;
    const int64_t rows_left = cursor.span.rows - chunk * kMaxTokens;
    unit = {cursor.group, cursor.span.first + chunk * kMaxTokens, int(rows_left < kMaxTokens ? rows_left : kMaxTokens),
            local % row_blocks};
    next += stride;
    return true;
  }
};

template <OperandFormat kA, OperandFormat kB, int kTokenTiles, bool kInterleaved>
struct SkinnyKernel {
  using CodecB = OperandCodec<kB>;
  using Shape = WordShape<kB>;
  static constexpr bool kBf16A = kA == OperandFormat::Bf16;
  static constexpr int kPairs = Shape::kPairs;  // per word
  static constexpr int kSteps = kPairs / 2;     // mma k16 steps per word
  static constexpr int kChunkElements = Shape::kChunkElements;
  static constexpr int kSlabElements = kSlabChunks * kChunkElements;
  static constexpr int kBlock = CodecB::kBlock;
  static constexpr int kTokens = kTokenTiles * kTileTokens;
  static constexpr int kActWordBytes = kPairs * 4;                       // one lane's word of a fragment
  static constexpr int kActChunkBytes = kChunkWords * 32 * kActWordBytes;  // one (slab, token tile)
  using Chunk = ActivationChunk<kA, kB>;
  using Acc = float[kGroupTiles][kTokenTiles][4];

  // One lane's chunk of the activation rows, loaded a stage ahead.
  struct ActivationRaw {
    Chunk chunk;
    bool valid;
  };

  // ---- the activation buffer --------------------------------------------------------------------

  // Lane (g, t)'s chunk t of `slab` for activation row tt * 8 + g of the unit.
  __device__ __forceinline__ static void load_activation(const SkinnyArgs& args, const Unit& unit, int64_t slab,
                                                         int tile, int lane, ActivationRaw& raw) {
    const int token = tile * kTileTokens + (lane >> 2);
    const int64_t chunk = slab * kSlabChunks + (lane & 3);
    raw.valid = token < unit.tokens && chunk * kChunkBytes < args.b_row_bytes;
    if (!raw.valid) return;
    raw.chunk.load(args.a, args.sfa, args.a_row_bytes, args.sfa_k_tiles, unit.a_row0 + token, chunk);
  }

  // The lane's four words as the B fragments of their mma steps (zeros where no data lies).
  __device__ __forceinline__ static void store_activation(const ActivationRaw& raw, uint8_t* chunk_buffer, int lane) {
    uint32_t pairs[kChunkWords][kPairs] = {};
    if (raw.valid) raw.chunk.fragments(pairs);
#pragma unroll
    for (int w = 0; w < kChunkWords; ++w) {
      uint8_t* dst = chunk_buffer + w * (32 * kActWordBytes) + lane * kActWordBytes;
      if constexpr (kPairs == 4) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(pairs[w][0], pairs[w][1], pairs[w][2], pairs[w][3]);
      } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(pairs[w][0], pairs[w][1]);
      }
    }
  }

  // ---- one slab of a stage ----------------------------------------------------------------------

  // Where chunk c (of the stage's K range) of row r (of the unit) lies in a stage. Row-major: rows
  // at row_stride. Streaming layout: the stage holds each 8-row tile's K range contiguously, as
  // 32-byte pieces of 8 rows (reference.interleave_rows).
  __device__ __forceinline__ static const uint8_t* stage_chunk(const SkinnyArgs& args, const uint8_t* stage, int r,
                                                               int c) {
    if constexpr (kInterleaved) {
      return stage + (r >> 3) * (8 * args.lanes * kSlabBytes) + (c >> 1) * 256 + (r & 7) * 32 + (c & 1) * kChunkBytes;
    } else {
      return stage + r * args.row_stride + c * kChunkBytes;
    }
  }

  // The scale codes of row r's blocks from `block` on, from the stage's SfAtom tiles (which start
  // at tile first_tile of the row tile).
  __device__ __forceinline__ static uint32_t stage_scale_codes(const uint8_t* tiles, int r, int64_t block,
                                                               int64_t first_tile) {
    const uint8_t* word = tiles + (block / kSfTileCols - first_tile) * kSfTileBytes + (r % 32) * 16 + (r / 32) * 4;
    return *reinterpret_cast<const uint32_t*>(word) >> (8 * (block & 3));
  }

  // The B fragments of word w of the slab for token tile tt (kernel.cuh's activation layout).
  __device__ __forceinline__ static void load_fragments(const uint8_t* act, int slab, int tt, int w, int lane,
                                                        uint32_t (&x)[kPairs]) {
    const uint8_t* src = act + ((slab * kTokenTiles + tt) * kChunkWords + w) * (32 * kActWordBytes) + lane * kActWordBytes;
    if constexpr (kPairs == 4) {
      const uint4 v = *reinterpret_cast<const uint4*>(src);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      x[0] = v.x, x[1] = v.y;
    }
  }

  // acc[tile][tt] += B(16 rows, slab) x act(tt)^T for the warp's four tiles, slab `slab` of the
  // stage. kTail: chunks at or beyond `valid_chunks` (past K, in the last stage of a slice) hold no
  // data; their words and scale codes are zeroed, so that whatever the buffer holds adds nothing. The
  // activation fragments are read again for every tile (cheap shared loads), which keeps the
  // registers of a word's fragments, not of the whole slab's, live.
  template <bool kTail>
  __device__ __forceinline__ static void compute_slab(const SkinnyArgs& args, const uint8_t* stage,
                                                      const uint8_t* act, int slab, int row_group, int lane,
                                                      int64_t first_block, int valid_chunks, Acc& acc) {
    const int g = lane >> 2;
    const int t = lane & 3;
    const int c = slab * kSlabChunks + t;
    const bool empty = kTail && c >= valid_chunks;
    const int64_t block = first_block + int64_t(c) * kChunkElements / kBlock;
    const int64_t first_tile = first_block / kSfTileCols;
    const uint8_t* tiles = stage + args.rows_bytes;
#pragma unroll
    for (int i = 0; i < kGroupTiles; ++i) {
      const int r0 = row_group * kGroupRows + i * kTileRows + g;
      uint32_t words[2][kChunkWords];
      typename CodecB::Factors factors[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        const uint4 v = *reinterpret_cast<const uint4*>(stage_chunk(args, stage, r, c));
        words[h][0] = v.x, words[h][1] = v.y, words[h][2] = v.z, words[h][3] = v.w;
        uint32_t codes = stage_scale_codes(tiles, r, block, first_tile);
        if (empty) {
          codes = 0;
#pragma unroll
          for (int w = 0; w < kChunkWords; ++w) words[h][w] = 0;
        }
        factors[h] = CodecB::factors(codes);
      }
      if constexpr (CodecB::kHasRest) {
        if (__any_sync(0xFFFFFFFFu, factors[0].twice || factors[1].twice)) {
          tile_mma<true>(words, factors, act, slab, lane, acc[i]);
          continue;
        }
      }
      tile_mma<false>(words, factors, act, slab, lane, acc[i]);
    }
  }

  // One tile's slab: the two rows' words decoded and multiplied with every token tile.
  template <bool kRest>
  __device__ __forceinline__ static void tile_mma(const uint32_t (&words)[2][kChunkWords],
                                                  const typename CodecB::Factors (&factors)[2], const uint8_t* act,
                                                  int slab, int lane, float (&acc)[kTokenTiles][4]) {
#pragma unroll
    for (int w = 0; w < kChunkWords; ++w) {
      uint32_t x[kTokenTiles][kPairs];
#pragma unroll
      for (int tt = 0; tt < kTokenTiles; ++tt) load_fragments(act, slab, tt, w, lane, x[tt]);
      uint32_t p[2][kPairs];
      CodecB::template decode<kRest>(words[0][w], factors[0], w, p[0]);
      CodecB::template decode<kRest>(words[1][w], factors[1], w, p[1]);
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const uint32_t a_frag[4] = {p[0][2 * s], p[1][2 * s], p[0][2 * s + 1], p[1][2 * s + 1]};
#pragma unroll
        for (int tt = 0; tt < kTokenTiles; ++tt) {
          const uint32_t b_frag[2] = {x[tt][2 * s], x[tt][2 * s + 1]};
          mma_bf16_16x8x16(acc[tt], a_frag, b_frag);
        }
      }
    }
  }

  // The CTA's contiguous spans, where it finds them (span_offset >= 0), else null. Recomputed from
  // the parameters where needed rather than held in a register through the slab loop.
  __device__ static const int32_t* block_spans(const SkinnyArgs& args, const uint8_t* smem) {
    return args.span_offset >= 0 ? reinterpret_cast<const int32_t*>(smem + args.span_offset) : nullptr;
  }

  // ---- the producer warp ------------------------------------------------------------------------

  __device__ static void produce(const SkinnyArgs& args, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                 int64_t slab_begin, int64_t slab_end, UnitWalk walk, int lane) {
    constexpr int64_t kElementsPerByte = 8 / CodecB::kElementBits;
    uint32_t it = 0;
    Unit unit;
    while (walk.advance(args.groups, block_spans(args, smem), unit)) {
      const int64_t local_row0 = unit.row_block * kBlockRows;
      const int rows = int(args.n - local_row0 < kBlockRows ? args.n - local_row0 : kBlockRows);
      const int64_t row0 = unit.group * args.n + local_row0;  // of the flattened [groups * n, K] weight
      const uint8_t* row_tile_scales = args.sfb + (row0 / kBlockRows) * args.sfb_k_tiles * kSfTileBytes;
      const int64_t k_end = slab_end * kSlabBytes < args.b_row_bytes ? slab_end * kSlabBytes : args.b_row_bytes;
      for (int64_t slab = slab_begin; slab < slab_end; slab += args.lanes, ++it) {
        const int slot = int(it % uint32_t(args.stages));
        ptx::mbar_wait(&empty[slot], ((it / uint32_t(args.stages)) & 1) ^ 1);
        const int64_t k0 = slab * kSlabBytes;
        const int64_t stage_end = k0 + args.lanes * kSlabBytes < k_end ? k0 + args.lanes * kSlabBytes : k_end;
        const uint32_t bytes = uint32_t(stage_end - k0);
        const int64_t first_tile = k0 * kElementsPerByte / kBlock / kSfTileCols;
        const int64_t end_tile = ceil_div(ceil_div(stage_end * kElementsPerByte, kBlock), kSfTileCols);
        const uint32_t tile_bytes = uint32_t((end_tile - first_tile) * kSfTileBytes);
        uint8_t* stage = smem + slot * args.stage_bytes;
        if constexpr (kInterleaved) {
          // One bulk copy per 8-row tile: its K range is contiguous in the streaming layout.
          if (lane == 0) ptx::mbar_arrive_expect_tx(&full[slot], uint32_t(rows) * bytes + tile_bytes);
          __syncwarp();
          const int64_t tile_stride = 8 * args.b_row_bytes;  // one 8-row tile's whole K range
          for (int e = lane; e < rows / 8; e += 32) {
            ptx::bulk_load(stage + e * (8 * args.lanes * kSlabBytes), args.b + (row0 / 8 + e) * tile_stride + 8 * k0,
                            8 * bytes, &full[slot]);
          }
        } else if (lane == 0) {
          // One box of 128 rows x the stage's K range; rows past the matrix and bytes past K arrive
          // as zeros (and count toward the transaction all the same).
          ptx::mbar_arrive_expect_tx(&full[slot], uint32_t(args.rows_bytes) + tile_bytes);
          ptx::tma_load_2d(stage, &args.b_map, &full[slot], int32_t(k0), int32_t(row0));
        }
        if (lane == 0) {
          ptx::bulk_load(stage + args.rows_bytes, row_tile_scales + first_tile * kSfTileBytes, tile_bytes, &full[slot]);
        }
      }
    }
  }

  // ---- the consumer warps -----------------------------------------------------------------------

  // The warp's accumulators into the CTA's partial sums [token][row] (first: store, else add).
  __device__ __forceinline__ static void accumulate(float* partial, const Acc& acc, int row_group, int lane,
                                                    bool first) {
    const int g = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int i = 0; i < kGroupTiles; ++i) {
#pragma unroll
      for (int tt = 0; tt < kTokenTiles; ++tt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_group * kGroupRows + i * kTileRows + g + 8 * (e >> 1);
          const int token = tt * kTileTokens + 2 * t + (e & 1);
          float& p = partial[token * kPartialStride + row];
          p = first ? acc[i][tt][e] : p + acc[i][tt][e];
        }
      }
    }
  }

  // This rank's rows of the unit: the S partials summed in rank order, the epilogue, the store.
  __device__ static void store_slice(const SkinnyArgs& args, const Unit& unit, float* partial, int rank, int thread,
                                     int threads) {
    const GemmEpilogue& e = args.epilogue;
    const int pair_begin = rank * (kBlockRows / 2) / args.splits;
    const int pairs = (rank + 1) * (kBlockRows / 2) / args.splits - pair_begin;
    const int items = pairs * unit.tokens;
    const float alpha = epilogue_alpha(e, unit.group) * args.unbias;
    for (int item = thread; item < items; item += threads) {
      const int token = item / pairs;
      const int local = 2 * (pair_begin + item % pairs);
      const int64_t n = unit.row_block * kBlockRows + local;
      const int64_t row = unit.a_row0 + token;
      if (n >= args.n || !args.groups.owns(unit.group, row)) continue;
      float* own = partial + token * kPartialStride + local;
      float2 sum = *reinterpret_cast<const float2*>(own);
      if (args.splits > 1) {
        sum = ptx::load_cluster_float2(ptx::cluster_address(own, 0));
        for (int r = 1; r < args.splits; ++r) {
          const float2 v = ptx::load_cluster_float2(ptx::cluster_address(own, uint32_t(r)));
          sum.x += v.x;
          sum.y += v.y;
        }
      }
      const float y0 = epilogue_value(e, sum.x, alpha, row, n, args.n, unit.group);
      const float y1 = n + 1 < args.n ? epilogue_value(e, sum.y, alpha, row, n + 1, args.n, unit.group) : 0.0f;
      store_pair(e, row, n, args.n, y0, y1);
    }
  }

  __device__ static void consume(const SkinnyArgs& args, uint8_t* smem, uint64_t* full, uint64_t* empty,
                                 uint64_t* ready, uint64_t* consumed, int64_t slab_begin, int64_t slab_end,
                                 UnitWalk walk, int rank, int warp, int lane) {
    const int lanes = args.lanes;
    const int threads = kRowGroups * lanes * 32;
    const int row_group = warp / lanes;  // compute: rows; activation: the token tile it decodes
    const int slab_lane = warp % lanes;
    const bool prepares = row_group < kTokenTiles;
    float* partial = reinterpret_cast<float*>(smem + args.act_offset);
    uint32_t it = 0;
    uint32_t units_done = 0;
    Unit unit;
    while (walk.advance(args.groups, block_spans(args, smem), unit)) {
      // The partial sums alias the activation buffers: every rank must have read this CTA's last ones.
      if (args.splits > 1 && units_done > 0) ptx::mbarrier_wait_cluster(consumed, (units_done - 1) & 1);
      Acc acc = {};
      ActivationRaw raw;
      if (prepares) load_activation(args, unit, slab_begin + slab_lane, row_group, lane, raw);
      for (int64_t slab = slab_begin; slab < slab_end; slab += lanes, ++it) {
        const int stage_slabs = int(slab_end - slab < lanes ? slab_end - slab : lanes);
        uint8_t* act = smem + args.act_offset + (it & 1) * args.act_bytes;
        if (prepares && slab_lane < stage_slabs) {
          store_activation(raw, act + (slab_lane * kTokenTiles + row_group) * kActChunkBytes, lane);
          if (slab + lanes + slab_lane < slab_end) load_activation(args, unit, slab + lanes + slab_lane, row_group, lane, raw);
        }
        // This buffer is complete, and nobody still reads the one the next stage overwrites.
        ptx::named_barrier_sync(kConsumerBarrier, threads);
        const int slot = int(it % uint32_t(args.stages));
        ptx::mbar_wait(&full[slot], (it / uint32_t(args.stages)) & 1);
        if (slab_lane < stage_slabs) {
          const int64_t chunks_left = (args.b_row_bytes - slab * kSlabBytes) / kChunkBytes;
          const int valid_chunks = int(chunks_left < lanes * kSlabChunks ? chunks_left : lanes * kSlabChunks);
          const uint8_t* stage = smem + slot * args.stage_bytes;
          const int64_t first_block = slab * kSlabElements / kBlock;
          if (valid_chunks < stage_slabs * kSlabChunks) {
            compute_slab<true>(args, stage, act, slab_lane, row_group, lane, first_block, valid_chunks, acc);
          } else {
            compute_slab<false>(args, stage, act, slab_lane, row_group, lane, first_block, valid_chunks, acc);
          }
        }
        ptx::mbar_arrive(&empty[slot]);  // every lane: its own reads of the stage
      }

      ptx::named_barrier_sync(kConsumerBarrier, threads);  // every warp is done with the activation buffers
      for (int l = 0; l < lanes; ++l) {
        if (slab_lane == l) accumulate(partial, acc, row_group, lane, l == 0);
        ptx::named_barrier_sync(kConsumerBarrier, threads);
      }
      if (args.splits > 1) {
        if (warp == 0 && lane == 0) {
          ptx::fence_cluster();
          for (int r = 0; r < args.splits; ++r) ptx::mbarrier_arrive_cluster(ptx::cluster_address(ready, uint32_t(r)));
        }
        ptx::mbarrier_wait_cluster(ready, units_done & 1);
      }
      store_slice(args, unit, partial, rank, warp * 32 + lane, threads);
      ptx::named_barrier_sync(kConsumerBarrier, threads);  // done reading every rank's partial sums
      if (args.splits > 1 && warp == 0 && lane == 0) {
        for (int r = 0; r < args.splits; ++r) ptx::mbarrier_arrive_cluster(ptx::cluster_address(consumed, uint32_t(r)));
      }
      ++units_done;
    }
    // No CTA leaves while another rank may still read its shared memory.
    if (args.splits > 1 && units_done > 0) ptx::mbarrier_wait_cluster(consumed, (units_done - 1) & 1);
  }

  __device__ static void run(const SkinnyArgs& args) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t full[kMaxStages];
    __shared__ uint64_t empty[kMaxStages];
    __shared__ uint64_t ready;
    __shared__ uint64_t consumed;
    const int warp = int(threadIdx.x) / 32;
    const int lane = int(threadIdx.x) % 32;
    const int consumers = kRowGroups * args.lanes;
    if (threadIdx.x == 0) {
      for (int s = 0; s < args.stages; ++s) {
        ptx::mbar_init(&full[s], 1);
        ptx::mbar_init(&empty[s], uint32_t(consumers) * 32);
      }
      ptx::mbar_init(&ready, uint32_t(args.splits));
      ptx::mbar_init(&consumed, uint32_t(args.splits));
      ptx::mbar_init_fence();
      if constexpr (!kInterleaved) ptx::prefetch_tensor_map(&args.b_map);
    }
    if (args.splits > 1) {
      ptx::cluster_sync();  // every CTA's barriers exist before anyone arrives on them
    } else {
      __syncthreads();
    }
    griddep_wait();
    griddep_launch_dependents();
    // Rank q streams stages [q * R / S, (q + 1) * R / S) of every row (R stages a row): whole boxes,
    // so that no box reads into another rank's slice.
    const int rank = int(blockIdx.x) % args.splits;
    const int64_t slab_begin = rank * args.row_stages / args.splits * args.lanes;
    const int64_t stage_end = (rank + 1) * args.row_stages / args.splits * args.lanes;
    const int64_t slab_end = stage_end < args.slabs ? stage_end : args.slabs;
    UnitWalk walk{};
    walk.next = int64_t(blockIdx.x) / args.splits;
    walk.stride = int64_t(gridDim.x) / args.splits;
    walk.row_blocks = args.row_blocks;
    if (args.span_offset >= 0) {
      // Few rows: reading the ids here costs less than a kernel launch of their own.
      int32_t* spans = reinterpret_cast<int32_t*>(smem + args.span_offset);
      const int groups = int(args.groups.groups);
      find_spans(args.groups.ids, int(args.groups.m), groups, spans, spans + groups);
    }
    if (warp == consumers) {
      produce(args, smem, full, empty, slab_begin, slab_end, walk, lane);
    } else {
      consume(args, smem, full, empty, &ready, &consumed, slab_begin, slab_end, walk, rank, warp, lane);
    }
  }
};

// 128 registers a thread: two CTAs of the default shape (3 slab warps per row group, 224 threads)
// fit an SM's register file, with no spill in the slab loop.
template <OperandFormat kA, OperandFormat kB, int kTokenTiles, bool kInterleaved>
__global__ void __maxnreg__(128) skinny_gemm_kernel(const __grid_constant__ SkinnyArgs args) {
  SkinnyKernel<kA, kB, kTokenTiles, kInterleaved>::run(args);
}

}  // namespace fp4_gemm::skinny
