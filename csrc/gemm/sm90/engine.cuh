// The Hopper GEMM engine: block-scaled A [M, K] x B [N, K]^T with exact in-kernel dequantization
// to bf16 and wgmma with float32 accumulation.
//
// One CTA computes a kBlockM x kBlockN tile with three or four warpgroups:
//   warpgroup 0  producer: one thread streams packed A, packed B and both scale tiles through a
//                ring of kStages shared-memory stages with TMA (mbarrier "full"/"empty" pairs);
//   warpgroups 1, 2  consumers. A 128-row tile gives each 64 rows of A and all kBlockN columns; a
//                64-row tile (small M: no padding rows, twice the tiles) gives both the same 64 rows
//                and each half of the columns. Per 64-wide K tile they
//                - dequantize their A rows straight into wgmma register fragments,
//                - together dequantize the B tile into a bf16 tile in the 128-byte swizzle
//                  (three buffers rotate, so one barrier per K tile keeps them safe),
//                - issue four m64 x kWarpgroupN x k16 wgmmas (A from registers, B from shared
//                  memory: a 64-row tile's second warpgroup starts kBlockN / 2 rows into the bf16
//                  tile) and decode the next K tile while those run;
//   warpgroup 3  for dense 256-wide tiles (kDecodeWarps), the decoders: they dequantize each
//                stage's B tile instead of the consumers, ahead of them (the bf16 tiles handed
//                over and back by mbarriers); the consumers then decode only A, and issue their
//                wgmmas as m64 x 128 pieces (a 128-row tile's warpgroup two of them per k16 step,
//                a 64-row tile's one, on its half of the columns).
//
// K order inside a tile. Summation order is free, so wgmma's K slots need not hold the elements
// in order, only the same element for A and B. wgmma's register fragment gives thread
// q (= lane % 4) the slots 16s + 8h + 2q + b (k-step s, half h, b = 0, 1) as pair P = 2s + h of
// registers; the thread's elements of a row are the 16 consecutive ones 16q .. 16q + 15 (one 8- or
// 16-byte load, one block scale), and pair P holds the two of them a single decode produces:
//   FP4 (two codes per byte): elements i and i + 4 of the 8-element word P / 4, i = P % 4 (one
//       shift and one mask separate them);
//   FP8: elements 2P and 2P + 1.
// The bf16 B tile holds, at slot 16s + 8h + 2q + b of each row, that same element 16q + ... of the
// packed row, so a 16-byte swizzle chunk c (= P) of a row gathers one pair from each q.
//
// Exactness: every element times its block scale (NVFP4: times 2^-7 as well, which the epilogue
// multiplies back; see "operand decoding") is exact in bf16 (docs/FORMATS.md), so the result
// differs from the float64 reference only by float32 accumulation order.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

#include "csrc/common/dequant.cuh"
#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/problem.h"
#include "csrc/gemm/sm90/ptx.cuh"
#include "csrc/gemm/sm90/scheduler.cuh"

namespace fp4_gemm::sm90 {

using Bf16x2 = __nv_bfloat162;

// Where B's bf16 tile comes from. Packed: the consumers decode each packed K tile into a bf16 tile
// (above). Bf16: B was dequantized once, exactly, into a bf16 scratch matrix before the launch
// (dequantize.cu), and TMA loads its tiles already in the 128-byte swizzle; the consumers then
// decode only A, in wgmma's own K order. The second pays off once B would be decoded for enough
// 128-row tiles of A (backend.cu decides).
enum class BSource : int { Packed = 0, Bf16 = 1 };

constexpr int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

// Stream-K partial tiles (and flags) per CTA: a 64-row tile's owner may publish its own partial for
// a spread fix-up (spread_fixup), besides its first piece's as a contributor.
constexpr int partial_slots_per_cta(int block_m) { return block_m == 64 ? 2 : 1; }

template <OperandFormat kA, OperandFormat kB, int kBlockN_, BSource kBSource_ = BSource::Packed,
          Grouping kGrouping_ = Grouping::Dense, int kBlockM_ = 128>
struct EngineConfig {
  static constexpr OperandFormat kFormatA = kA;
  static constexpr OperandFormat kFormatB = kB;
  static constexpr BSource kBSource = kBSource_;
  static constexpr Grouping kGrouping = kGrouping_;
  static_assert(kGrouping == Grouping::Dense || kBSource == BSource::Packed, "a bf16 B is one dense weight");
  static_assert(kB != OperandFormat::Bf16 || kBSource == BSource::Bf16, "bf16 weights are read as they are");
  static constexpr bool kPackedB = kBSource_ == BSource::Packed;
  // A bf16 A (the W4A16 tier, OperandFormat::Bf16) comes by TMA in the 128-byte swizzle, unscaled:
  // with a packed B the consumers gather its fragments from shared memory; with a bf16 B both go to
  // wgmma from shared memory (kSharedA), a plain bf16 GEMM (the engine's ceiling).
  static constexpr bool kBf16A = kA == OperandFormat::Bf16;
  static constexpr bool kSharedA = kBf16A && !kPackedB;
  // Elements per scale block of the scaled operands (a bf16 operand has none).
  static constexpr int kBlockSize = block_size(kBf16A ? kB : kA) > 0 ? block_size(kBf16A ? kB : kA) : 32;
  static_assert(kBf16A || kB == OperandFormat::Bf16 || !kPackedB || block_size(kA) == block_size(kB),
                "one scale block size");
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  // The 64-row tile splits the columns between the consumer warpgroups; it is built for a packed B
  // (the bf16-B and shared-A loops read 128 rows of A) on 256-wide tiles.
  static_assert(kBlockM == 128 || (kBlockM == 64 && kPackedB && kBlockN == 256), "tiles 128 x N and 64 x 256");
  static constexpr int kWarpgroupN = kBlockM == 128 ? kBlockN : kBlockN / 2;  // one wgmma's columns
  static constexpr int kAccumulators = kWarpgroupN / 2;                       // floats per consumer thread
  // The stream-K owner's gather loads two partial tiles at a time (gather_partials).
  static constexpr bool kGatherPairs =
      kBlockM == 64 && kA == kB && (kA == OperandFormat::Nvfp4 || kA == OperandFormat::Mxfp4);
  // A split tile's spread fix-up (spread_fixup), 64-row tiles only (the 128-row tile's stream-K
  // tiles are shared by fewer CTAs at the shapes it serves, and the path's code made its kernels
  // 0-2.4 % slower there), hands out its columns in kFixupChunks chunks of kFixupOctets octets
  // (8 columns) of each warpgroup's columns.
  static constexpr bool kSpreadFixup = partial_slots_per_cta(kBlockM) == 2;
  static constexpr int kOctets = kWarpgroupN / 8;
  static constexpr int kFixupChunks = 8;
  static constexpr int kFixupOctets = kOctets / kFixupChunks;
  static constexpr int kBlockK = 64;  // one 128-byte bf16 row of the swizzled B tile
  static constexpr int kConsumerThreads = 256;
  // Dense 256-wide tiles with a packed B (128 or 64 rows) have a decoder warpgroup (kDecodeWarps):
  // it decodes all of B into the rotating bf16 tiles, running ahead of the consumers (mbarriers
  // hand the tiles over and back), and the consumers decode only A into fragments and issue the
  // wgmmas. In the consumers' own instruction stream the decode and the wgmmas overlapped little:
  // at 256 x 17408 x 5120 NVFP4 the K loop took 110 us, without the decode 77 us, without the
  // wgmmas 72 us (benchmarks/NOTES.md). A 64-row tile's decoders ran it 1.01-1.12x faster at
  // M = 64 and 1.04-1.20x at M = 96..192 than its consumers decoding B themselves (H200).
  static constexpr bool kDecodeWarps = kPackedB && kGrouping == Grouping::Dense && kBlockN == 256;
  static constexpr int kDecoderThreads = kDecodeWarps ? 128 : 0;
  static constexpr int kThreads = 128 + kConsumerThreads + kDecoderThreads;
  // The warps that free a stage of the TMA ring once they read their part of it.
  static constexpr int kStageReaders = (kConsumerThreads + kDecoderThreads) / 32;
  // The columns of one wgmma instruction: with decode warps (512 threads, 128 registers at launch)
  // ptxas needs each instruction to fit in those, an n256 wgmma's 128 accumulators do not.
  static constexpr int kWgmmaN = kDecodeWarps ? 128 : kWarpgroupN;
  static_assert(kWarpgroupN % kWgmmaN == 0 && kWarpgroupN / kWgmmaN <= 2, "one or two wgmmas per k16 step");

  static constexpr int kRowBytesA = kBlockK * element_bits(kA) / 8;
  static constexpr int kRowBytesB = kBlockK * element_bits(kB) / 8;
  static constexpr int kTileBytesA = kBlockM * kRowBytesA;
  static constexpr int kTileBytesB = kBlockN * kRowBytesB;
  // The SfAtom columns holding this K tile: A's rows and B's kBlockN rows start on a 128-row atom in
  // a dense problem (a 64-row tile at row 0 or 64 of one); a group's rows may start anywhere in one
  // (its first row, g * N), so a grouped tile reads one atom more of each.
  static constexpr int kScaleTilesA = kBf16A ? 0 : kGrouping == Grouping::Dense ? 1 : 2;
  static constexpr int kScaleTilesB = kBlockN / kSfTileRows + (kGrouping == Grouping::Dense ? 0 : 1);
  static constexpr int kScaleBytesA = kSfTileBytes * kScaleTilesA;
  static constexpr int kScaleBytesB = kSfTileBytes * kScaleTilesB;
  static constexpr int kBf16TileBytes = kBlockN * kBlockK * 2;
  // A stage: packed A, packed B and both scale columns; or, with a bf16 B, B's swizzled tile first
  // (1024-byte aligned for wgmma), then packed A and its scales.
  // A bf16 A leads a packed stage, so its swizzled tile needs 1024-byte aligned stages.
  static constexpr int kStageBytes =
      kPackedB ? round_up(kTileBytesA + kTileBytesB + kScaleBytesA + kScaleBytesB, kBf16A ? 1024 : 16)
               : round_up(kBf16TileBytes + kTileBytesA + kScaleBytesA, 1024);
  // Float accumulators of one warpgroup staged for the epilogue; a row stride of 8 (mod 32) words
  // makes a warp's fragment stores conflict-free.
  static constexpr int kStagingStride = kBlockN + 8;
  // The region before the ring: the rotating decoded B tiles (packed B; with decode warps handed
  // over and back by mbarriers), which the epilogue staging reuses, or the staging alone.
  static constexpr int kBf16Tiles = kPackedB ? 3 : 0;
  static constexpr int kRegionBytes = round_up(
      kBf16Tiles * kBf16TileBytes > 64 * kStagingStride * 4 ? kBf16Tiles * kBf16TileBytes : 64 * kStagingStride * 4,
      1024);
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr int kBarrierBytes = 256;  // full, empty (kStages <= 8 each), decoded, drained
  // Contiguous: the block spans (grouping.cuh, spans_in_block), after the barriers.
  static constexpr int kSpanBytes = kGrouping == Grouping::Contiguous ? int(span_table_bytes(kBlockSpanLimit)) : 0;
  static constexpr int kFixedBytes = kRegionBytes + kBarrierBytes + kSpanBytes + 1024;
  static constexpr int kRingFit = (kMaxSmem - kFixedBytes) / kStageBytes;
  static constexpr int kStages = kRingFit > 8 ? 8 : kRingFit;
  static_assert(kStages >= 2, "the ring needs two stages");
  static_assert((2 * kStages + 2 * kBf16Tiles) * 8 <= kBarrierBytes, "the barriers");
  // + 1024: the dynamic shared memory base is only 16-byte aligned; the tiles need 1024.
  static constexpr int kSmemBytes = kFixedBytes + kStages * kStageBytes;

  // Consumer threads per B row and the 16-byte bf16 chunks (of 8 per row) each converts; with decode
  // warps the consumers convert none, and a decode thread two whole rows, d and d + 128.
  static constexpr int kThreadsPerRowB = kConsumerThreads / kBlockN;
  static constexpr int kChunksPerThread = 8 / kThreadsPerRowB;
  static_assert(!kDecodeWarps || 2 * kDecoderThreads == kBlockN, "two B rows a decode thread");
  static_assert(kBlockN == 128 || kBlockN == 256, "tile widths 128 and 256");

  // A decoded operand value is its true value times 2^-kValueExponent (see "operand decoding"):
  // NVFP4 decoded in the packed-B K order is 2^-7 of it, everything else is the value itself.
  // The epilogue multiplies the accumulators by 2^(kValueExponentA + kValueExponentB), exactly.
  static constexpr int kValueExponentA = kA == OperandFormat::Nvfp4 && kPackedB ? 7 : 0;
  static constexpr int kValueExponentB = kB == OperandFormat::Nvfp4 && kPackedB ? 7 : 0;
  // The register-fragment K loop unrolled twice (two fragment buffers alternating, no moves), where
  // it measured faster (benchmarks/NOTES.md): not for MXFP8, whose larger loop body ran 1-3% slower
  // unrolled, nor for E0M3 weights (not measured).
  static constexpr bool kAlternatingFragments = kA != OperandFormat::Mxfp8 && kB != OperandFormat::E0m3;
  static_assert(!kBf16A || kB == OperandFormat::Bf16 || kB == OperandFormat::Nvfp4 || kB == OperandFormat::Mxfp4,
                "bf16 activations pair with 4-bit weights (the fragment order of a packed B) or bf16 weights");

  // The CTA's 384 x 168 registers, shifted to the consumers (setmaxnreg). A grouped producer walks
  // the groups and addresses up to five scale atoms per stage: it gets 16 more (at 40 it spilled in
  // its K loop); dense consumers keep 232 (a build with 224 ran 64 x 17408 x 5120 NVFP4 at 0.78x
  // cuBLAS on the H200 against 0.89x before).
  // With decode warps the 512 threads' 128 registers at launch go 24 (producer), 64 (decoders) and
  // 208 (consumers).
  static constexpr int kProducerRegisters = kDecodeWarps ? 24 : kGrouping == Grouping::Dense ? 40 : 56;
  static constexpr int kDecoderRegisters = 64;
  static constexpr int kConsumerRegisters = kDecodeWarps ? 208 : kGrouping == Grouping::Dense ? 232 : 224;
  // setmaxnreg moves registers inside the CTA's launch allocation (65536 / kThreads, in steps of 8,
  // per thread): a larger sum leaves the consumers' increase waiting forever.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static_assert(128 * kProducerRegisters + kDecoderThreads * kDecoderRegisters + 256 * kConsumerRegisters <=
                    kThreads * kLaunchRegisters,
                "the CTA's registers");
};

// Named barriers: 0 is __syncthreads; the consumers' own (epilogue, stream-K, a stage's decode);
// with decode warps, the consumers' release of the epilogue staging, which overlaps the decoded
// buffers, to the decoders.
constexpr int kConsumerBarrier = 1;
constexpr int kStagingFreeBarrier = 2;

// Kernel arguments besides the two tensor maps (plain values: captured by CUDA graphs as is).
struct EngineParams {
  int64_t m, n, k;  // m: rows of A, all groups; n: rows of each weight matrix
  const uint8_t* sfa;
  const uint8_t* sfb;
  int64_t sf_k_atoms;      // SfAtom columns per 128-row tile: ceil(nkb / 4)
  int64_t nkb;             // scale blocks per row
  int64_t sf_row_tiles_a;  // 128-row tiles of A's scale buffer
  int64_t sf_row_tiles_b;  // 128-row tiles of B's scale buffer (all groups' rows)
  ScheduleParams schedule;
  // Dense stream-K (scheduler.cuh): per CTA, partial_slots_per_cta flags and float partial tiles in
  // fragment order (a contributor's first piece; a 64-row tile's owner's last piece). Null when
  // every CTA owns whole tiles.
  int* flags;
  float* partials;
  GemmEpilogue epilogue;
};

// ---- operand decoding ---------------------------------------------------------------------------
//
// Per block, a factor is made once per K tile from its scale code (dequant.cuh: two blocks per
// conversion); per pair of elements, the decode is the bit placement of the shared codec and one
// packed multiply by the factor (MXFP4: two, see below). Exactness (docs/FORMATS.md):
//   NVFP4   E2M1 bit pattern (value * 2^-126) times s * 2^119: value * s * 2^-7. A nonzero product
//           is at least 0.5 * 2^-9 * 2^-7 (a normal bf16) and has at most 2 + 4 significant bits,
//           so it is exact; 448 * 2^119 < 2^128, and the NaN code 0x7F gives a NaN factor. The
//           float32 products of two such operands are the true ones times 2^-14: all multiples of
//           2^-34, never subnormal, so the accumulation is the same as on the true values, and the
//           epilogue multiplies 2^14 back.
//   MXFP4   UE8M0 factors span 2^-127 .. 2^127, more than one bf16 factor can add to a pattern: the
//           pattern times 2^126 is the true value, then times 2^k (as before the factors).
//   MXFP8   E4M3 values by the hardware conversion (exact), times 2^k.
//   E0M3    (128 + m) - 128 = m, then the sign, times s.

// A K tile's scale codes of one row: the row's four code bytes of the tile's SfAtom column, shifted
// to the tile's first block (32-element blocks: columns 2 and 3 for odd tiles) and masked to the
// blocks inside K. A code masked to 0 gives a finite factor (0, or 2^-127 for UE8M0), so the zero
// elements TMA delivers past K stay zero whatever the padding bytes hold (a NaN code, say).
struct TileCodes {
  uint32_t shift;  // bits: 8 * the tile's first column
  uint32_t mask;   // bytes of the blocks before the end of K
  __device__ __forceinline__ uint32_t operator()(uint32_t word) const { return (word >> shift) & mask; }
};

template <class Config>
__device__ __forceinline__ TileCodes tile_codes(int64_t kt, int64_t nkb) {
  constexpr int kBlocks = Config::kBlockK / Config::kBlockSize;
  const int64_t first = kt * kBlocks;
  const int64_t in_k = nkb - first;  // >= 1
  return {uint32_t(8 * (first % kSfTileCols)), in_k >= kBlocks ? ~0u : (1u << (8 * in_k)) - 1u};
}

// The factors of two blocks (codes in bits 0-7 and 8-15; block 0 in the low half).
template <OperandFormat kFormat, int kValueExponent>
__device__ __forceinline__ Bf16x2 block_factors(uint32_t codes) {
  if constexpr (kFormat == OperandFormat::Mxfp8 || kFormat == OperandFormat::Mxfp4) {
    return ue8m0x2_bf16x2(codes);
  } else {
    // NVFP4 bit patterns (kValueExponent 7) take s * 2^119; true values take s.
    return ue4m3x2_bf16x2<(kValueExponent > 0 ? 126 - kValueExponent : 0)>(codes);
  }
}


// One block's factor in both halves.
__device__ __forceinline__ Bf16x2 low_factor(Bf16x2 f) { return __low2bfloat162(f); }
__device__ __forceinline__ Bf16x2 high_factor(Bf16x2 f) { return __high2bfloat162(f); }

// The four scale bytes of `row` (0..383) in one K column of consecutive 128-row SfAtom tiles.
__device__ __forceinline__ uint32_t scale_word(const uint8_t* scales, int row) {
  return *reinterpret_cast<const uint32_t*>(scales + (row / kSfTileRows) * kSfTileBytes +
                                            sf_offset(row % kSfTileRows, 0, 1));
}

// Pair j (0..3) of an 8-element word of a 4-bit operand, elements j and j + 4 (see above), times
// its block's factor (both halves).
template <OperandFormat kFormat, int kValueExponent>
__device__ __forceinline__ uint32_t decode_nibble_pair(uint32_t word, int j, Bf16x2 factor) {
  Bf16x2 value;
  if constexpr (kFormat == OperandFormat::E0m3) {
    value = decode_e0m3_pair<__nv_bfloat16>(nibble_pair_stride4(word, j));
  } else if constexpr (kFormat == OperandFormat::Nvfp4 && kValueExponent > 0) {
    value = e2m1_stride4_patterns<__nv_bfloat16>(word, j);
  } else {
    value = decode_e2m1_stride4<__nv_bfloat16>(word, j);
  }
  return pair_bits(__hmul2(value, factor));
}

// This thread's 16 A elements of the K tile in rows `row` and `row` + 8 (elements 16q .. 16q + 15
// of each: one 8- or 16-byte load and one block each), scaled, as the eight bf16 pairs of each
// row's fragment, P = 0..7. The rows' scales are rows sf_row0 + row, + 8 of the stage's scale atoms
// (sf_row0: where the tile's first row sits in its first atom).
template <class Config>
__device__ __forceinline__ void load_a_rows(const uint8_t* tile, const uint8_t* scales, int row, int sf_row0, int q,
                                            const TileCodes& codes, uint32_t (&top)[8], uint32_t (&bottom)[8]) {
  constexpr OperandFormat kFormat = Config::kFormatA;
  constexpr int kExponent = Config::kValueExponentA;
  // Byte `block` of each row's codes, top row's in bits 0-7 and the bottom row's in bits 8-15.
  const uint32_t block = uint32_t((16 * q) / block_size(kFormat));
  const uint32_t two = __byte_perm(codes(scale_word(scales, sf_row0 + row)),
                                   codes(scale_word(scales, sf_row0 + row + 8)), block | ((block + 4) << 4));
  const Bf16x2 factors = block_factors<kFormat, kExponent>(two);
  const Bf16x2 factor[2] = {low_factor(factors), high_factor(factors)};
  uint32_t* pairs[2] = {top, bottom};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint8_t* src = tile + (row + 8 * r) * Config::kRowBytesA;
    if constexpr (kFormat == OperandFormat::Mxfp8) {
      const uint4 bytes = *reinterpret_cast<const uint4*>(src + 16 * q);
      const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        Bf16x2 two_values[2];
        dequant_e4m3x4<__nv_bfloat16>(words[w], two_values);
        pairs[r][2 * w] = pair_bits(__hmul2(two_values[0], factor[r]));
        pairs[r][2 * w + 1] = pair_bits(__hmul2(two_values[1], factor[r]));
      }
    } else {
      const uint2 bytes = *reinterpret_cast<const uint2*>(src + 8 * q);
#pragma unroll
      for (int pair = 0; pair < 8; ++pair) {
        pairs[r][pair] = decode_nibble_pair<kFormat, kExponent>(pair < 4 ? bytes.x : bytes.y, pair % 4, factor[r]);
      }
    }
  }
}

// This thread's 16 A elements of one row of the K tile in wgmma's own K order (bf16 B, which TMA
// delivers in order): pair 2s + h is elements 16s + 8h + 2q + {0, 1}. Each thread reads its rows
// whole (the four threads of a row read the same bytes: broadcasts).
template <class Config>
__device__ __forceinline__ void load_a_row_natural(const uint8_t* tile, const uint8_t* scales, int row, int sf_row0,
                                                   int q, const TileCodes& codes, uint32_t (&pairs)[8]) {
  constexpr OperandFormat kFormat = Config::kFormatA;
  constexpr int kGroup = block_size(kFormat);
  const uint32_t row_codes = codes(scale_word(scales, sf_row0 + row));
  // Blocks 0, 1 and (16-element blocks) 2, 3 of the tile.
  const Bf16x2 factors[2] = {block_factors<kFormat, 0>(row_codes), block_factors<kFormat, 0>(row_codes >> 16)};
  constexpr int kWords = Config::kRowBytesA / 4;
  uint32_t words[kWords];
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(tile + row * Config::kRowBytesA + 16 * i);
    words[4 * i] = v.x, words[4 * i + 1] = v.y, words[4 * i + 2] = v.z, words[4 * i + 3] = v.w;
  }
#pragma unroll
  for (int pair = 0; pair < 8; ++pair) {  // pair = 2s + h: elements 16s + 8h + 2q + {0, 1}
    const int block = (8 * pair) / kGroup;
    const Bf16x2 scale = block % 2 ? high_factor(factors[block / 2]) : low_factor(factors[block / 2]);
    Bf16x2 value;
    if constexpr (kFormat == OperandFormat::Mxfp8) {
      Bf16x2 two[2];  // bytes 8 * pair + 2q, + 1: half-word q % 2 of word 2 * pair + q / 2
      const uint32_t word = q < 2 ? words[2 * pair] : words[2 * pair + 1];  // static indices: registers
      dequant_e4m3x4<__nv_bfloat16>(word >> (16 * (q % 2)), two);
      value = two[0];
    } else {
      const uint32_t n = nibble_pair(words[pair], 2 * q);  // byte q of word pair: nibbles 2q, 2q + 1
      value = kFormat == OperandFormat::E0m3 ? decode_e0m3_pair<__nv_bfloat16>(n) : decode_e2m1_pair<__nv_bfloat16>(n);
    }
    pairs[pair] = pair_bits(__hmul2(value, scale));
  }
}

// The byte offset of 16-byte chunk c of row r in a tile of 128-byte rows in the 128-byte swizzle
// (what TMA writes and wgmma reads): 8-row atoms of 1024 bytes, chunks XOR-ed by the row in the atom.
__device__ __forceinline__ int sw128_offset(int r, int c) { return (r / 8) * 1024 + (r % 8) * 128 + ((c ^ (r % 8)) * 16); }

// This thread's 16 elements of a bf16 A row (elements 16q .. 16q + 15 of the K tile, chunks 2q and
// 2q + 1 of the swizzled row) as the eight pairs of a packed B's K order: pair P holds elements
// 8 (P / 4) + P % 4 and that + 4, the same half of two words (one byte permute each).
template <class Config>
__device__ __forceinline__ void load_a_row_bf16(const uint8_t* tile, int row, int q, uint32_t (&pairs)[8]) {
  const uint4 lo = *reinterpret_cast<const uint4*>(tile + sw128_offset(row, 2 * q));
  const uint4 hi = *reinterpret_cast<const uint4*>(tile + sw128_offset(row, 2 * q + 1));
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // w[j]: elements 2j, 2j + 1
#pragma unroll
  for (int pair = 0; pair < 8; ++pair) {
    const int first = 8 * (pair / 4) + pair % 4;
    pairs[pair] = __byte_perm(w[first / 2], w[(first + 4) / 2], pair % 2 ? 0x7632 : 0x5410);
  }
}

// The A fragments of one K tile: k-step s takes pairs 2s (slots 2q, 2q + 1) and 2s + 1 (slots
// 2q + 8, 2q + 9) of rows g and g + 8; the pairs come in the permuted K order of a packed B
// (load_a_rows) or in wgmma's own order for a bf16 B (load_a_row_natural).
template <class Config>
__device__ __forceinline__ void load_a_fragments(const uint8_t* tile, const uint8_t* scales, int sf_row0,
                                                 int warp_row, int lane, const TileCodes& codes,
                                                 uint32_t (&frag)[4][4]) {
  const int q = lane % 4;
  const int row0 = warp_row + lane / 4;
  uint32_t top[8], bottom[8];
  if constexpr (Config::kBf16A) {
    load_a_row_bf16<Config>(tile, row0, q, top);
    load_a_row_bf16<Config>(tile, row0 + 8, q, bottom);
  } else if constexpr (Config::kPackedB) {
    load_a_rows<Config>(tile, scales, row0, sf_row0, q, codes, top, bottom);
  } else {
    load_a_row_natural<Config>(tile, scales, row0, sf_row0, q, codes, top);
    load_a_row_natural<Config>(tile, scales, row0 + 8, sf_row0, q, codes, bottom);
  }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    frag[s][0] = top[2 * s];
    frag[s][1] = bottom[2 * s];
    frag[s][2] = top[2 * s + 1];
    frag[s][3] = bottom[2 * s + 1];
  }
}

// Where this thread's chunk i of a decoded B tile goes, one of kPerRow threads of a row: row `row`,
// chunk c = i * kPerRow + sub of it in the 128-byte swizzle. The same for every K tile: the decoding
// threads keep them in registers.
template <int kPerRow>
__device__ __forceinline__ void b_chunk_offsets(int row, int sub, int (&offsets)[8 / kPerRow]) {
#pragma unroll
  for (int i = 0; i < 8 / kPerRow; ++i) {
    offsets[i] = (row / 8) * 1024 + (row % 8) * 128 + (((i * kPerRow + sub) ^ (row % 8)) * 16);
  }
}

// Converts this thread's share of the packed B tile into the swizzled bf16 tile: row `row`, chunks
// c = i * kPerRow + sub (at `offsets`, b_chunk_offsets). Chunk c holds pair P = c of each q = 0..3
// (see the file comment). Word indices stay compile-time constants (sub < kPerRow never changes
// them), so the row's words live in registers.
template <class Config, int kPerRow>
__device__ __forceinline__ void convert_b_row(const uint8_t* tile, const uint8_t* scales, int sf_row0,
                                              uint8_t* bf16_tile, int row, int sub, const TileCodes& codes,
                                              const int (&offsets)[8 / kPerRow]) {
  static_assert(kPerRow == 1 || kPerRow == 2, "one or two threads a row (MXFP8's word index needs it)");
  constexpr OperandFormat kFormat = Config::kFormatB;
  constexpr int kGroup = block_size(kFormat);
  constexpr int kExponent = Config::kValueExponentB;
  constexpr int kRowBytes = Config::kRowBytesB;
  constexpr int kWords = kRowBytes / 4;
  uint32_t words[kWords];
  const uint8_t* src = tile + row * kRowBytes;
#pragma unroll
  for (int i = 0; i < kWords / 4; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(src + 16 * i);
    words[4 * i] = v.x, words[4 * i + 1] = v.y, words[4 * i + 2] = v.z, words[4 * i + 3] = v.w;
  }
  // Factors of the row's blocks in this tile, in pairs: q's block is q for 16-element blocks, q / 2
  // for 32-element ones.
  constexpr int kBlocks = Config::kBlockK / kGroup;
  const uint32_t row_codes = codes(scale_word(scales, sf_row0 + row));
  Bf16x2 factors[kBlocks / 2];
#pragma unroll
  for (int i = 0; i < kBlocks / 2; ++i) factors[i] = block_factors<kFormat, kExponent>(row_codes >> (16 * i));
  Bf16x2 scale[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int block = (16 * q) / kGroup;
    scale[q] = block % 2 ? high_factor(factors[block / 2]) : low_factor(factors[block / 2]);
  }
#pragma unroll
  for (int i = 0; i < 8 / kPerRow; ++i) {
    constexpr int kStride = kPerRow;
    const int c = i * kStride + sub;
    Bf16x2 v[4];  // MXFP8: the chunk's values before their factors
    if constexpr (kFormat == OperandFormat::Mxfp8) {
      // Elements 16q + 2c + {0, 1} are half-word c % 2 of word 4q + c / 2.
      const uint32_t select = c % 2 ? 0x7632 : 0x5410;
      Bf16x2 lo[2], hi[2];
      const int word = (i * kStride) / 2;  // = c / 2, constant once unrolled
      dequant_e4m3x4<__nv_bfloat16>(__byte_perm(words[word], words[4 + word], select), lo);
      dequant_e4m3x4<__nv_bfloat16>(__byte_perm(words[8 + word], words[12 + word], select), hi);
      v[0] = lo[0], v[1] = lo[1], v[2] = hi[0], v[3] = hi[1];
    }
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if constexpr (kFormat == OperandFormat::Mxfp8) {
        o[q] = pair_bits(__hmul2(v[q], scale[q]));
      } else {
        // Pair c of q lives in word 2q + c / 4 (elements 16q + 8(c / 4) ..).
        const int word = (i * kStride) / 4;  // = c / 4, constant once unrolled
        o[q] = decode_nibble_pair<kFormat, kExponent>(words[2 * q + word], c % 4, scale[q]);
      }
    }
    *reinterpret_cast<uint4*>(bf16_tile + offsets[i]) = out;
  }
}

// ---- the decoder warpgroup's conversion ---------------------------------------------------------
//
// convert_b_row's job for the decode warps (EngineConfig::kDecodeWarps), which the consumers wait
// for, in fewer instructions per K tile, writing the same bf16 values:
// - every shared-memory address is a register kept across K tiles plus the K tile's stage or bf16
//   tile (uniform) plus a constant, one LDS/STS operand with no address arithmetic; a thread's
//   second row, d + 128, sits a constant distance from its first in the stage, in the scale atoms
//   (the next SfAtom tile, same place) and in the bf16 tile (16 KiB: the same swizzle), so both
//   rows share those registers;
// - the K tile's scale codes are selected once per tile (DecoderCodes) instead of from the 64-bit
//   tile index, and taken as their factors from their place in the word (dequant.cuh's
//   ue8m0x2_bf16x2_spread and ue4m3x2_bf16x2 of a half-word: no shifts to line them up);
// - E0M3 takes the multiply placement of E2M1 (stride4_patterns, instead of an integer base's
//   subtraction and a separate sign), and MXFP8's pairs are converted from their half-word in place.

// The decoder thread's shared-memory addresses for its first row d (the second: kSecondRow* on).
struct DecoderAddresses {
  uint32_t codes;      // row d's packed codes in stage 0
  uint32_t scales;     // row d's scale word in stage 0's SfAtom column
  uint32_t chunks[8];  // row d's chunk c (pair c of each q, see the file comment) in bf16 tile 0
};

template <class Config>
struct DecoderLayout {
  static constexpr int kSecondRowCodes = Config::kDecoderThreads * Config::kRowBytesB;
  static constexpr int kSecondRowScales = kSfTileBytes;
  static constexpr int kSecondRowChunks = Config::kDecoderThreads * Config::kBlockK * 2;
  static_assert(Config::kDecoderThreads == kSfTileRows && Config::kDecoderThreads % 8 == 0,
                "row d + 128: the next SfAtom tile and the same swizzle phase");
};

// A K tile's scale codes of a row, as tile_codes gives them, selected per K tile by one compare and
// select instead of 64-bit arithmetic: only the last K tile of K can end inside its blocks.
// 16-element blocks: a mask of the row's scale word. 32-element blocks: a byte_perm selector that
// also spreads the tile's two codes into the halves (c0 | c1 << 16): bytes 0, 1 (0x4140) or, in odd
// K tiles, 2, 3 (0x4342), and a zero byte (selector 5 or 7: a byte of the zero word) for a block
// past K. `tiles` gives the selection for a work tile's K tiles, first to last.
template <class Config>
struct DecoderCodes {
  static constexpr int kBlocks = Config::kBlockK / Config::kBlockSize;
  static_assert(kBlocks == 4 || kBlocks == 2, "16- or 32-element blocks");
  static constexpr uint32_t kFull = kBlocks == 4 ? ~0u : 0x4140u;
  static constexpr uint32_t kOdd = 0x0202u;  // kFull ^ kOdd: the odd K tiles' selector
  int64_t last_kt;  // the last K tile
  uint32_t last;    // 16-element blocks: its mask; 32-element: the bits it sets in its selector

  __device__ explicit DecoderCodes(int64_t nkb) : last_kt((nkb - 1) / kBlocks) {
    const int64_t in_k = nkb - last_kt * kBlocks;  // 1 .. kBlocks
    if constexpr (kBlocks == 4) {
      last = in_k >= 4 ? kFull : (1u << (8 * in_k)) - 1u;
    } else {
      last = in_k >= 2 ? 0u : 0x0400u;
    }
  }

  // The selection for K tiles k_begin + i: select(i), then step() to the next.
  struct Tiles {
    uint32_t current;   // K tile k_begin + i's selector (32-element blocks), stepped
    uint32_t at_last;   // the last K tile's mask or selector
    int last_i;         // the last K tile's index from k_begin, or -1 (not here, or whole)

    __device__ __forceinline__ uint32_t select(int i) const {
      return i == last_i ? at_last : kBlocks == 4 ? kFull : current;
    }
    __device__ __forceinline__ void step() {
      if constexpr (kBlocks == 2) current ^= kOdd;
    }
  };
  __device__ __forceinline__ Tiles tiles(int64_t k_begin, int64_t k_end) const {
    Tiles r;
    r.current = (k_begin & 1) ? kFull ^ kOdd : kFull;
    r.at_last = kBlocks == 4 ? last : (((last_kt & 1) ? kFull ^ kOdd : kFull) | last);
    // A last K tile with all its blocks inside K takes the others' selection.
    const bool partial = kBlocks == 4 ? last != kFull : last != 0u;
    r.last_i = partial && last_kt < k_end ? int(last_kt - k_begin) : -1;
    return r;
  }
};

// The decoder's ring position (RingPosition's) as byte offsets of the stage in the ring and of the
// bf16 tile in the region, and as the stage's full[s] barrier address. Stepped by adds and selects,
// each stays a uniform register that loads, stores and barrier operations take as it is.
template <class Config>
struct DecoderRing {
  static constexpr uint32_t kLastStage = (Config::kStages - 1) * Config::kStageBytes;
  static constexpr uint32_t kLastTile = (Config::kBf16Tiles - 1) * Config::kBf16TileBytes;
  // A bf16 tile's offset over this is its barrier's (8 bytes each): a shift.
  static constexpr uint32_t kTileBytesPerBarrierByte = Config::kBf16TileBytes / 8;
  static_assert((kTileBytesPerBarrierByte & (kTileBytesPerBarrierByte - 1)) == 0, "a power of two");
  uint32_t full0;  // full[0]
  uint32_t stage = 0, full, phase = 0;
  uint32_t tile = 0, drained_parity = 1;  // drained[i]: waited on the phase before decoded[i]'s

  __device__ explicit DecoderRing(uint32_t full_barriers) : full0(full_barriers), full(full_barriers) {}
  // The bf16 tile's barrier among decoded[0 ..] (from its address `decoded0`).
  __device__ __forceinline__ uint32_t tile_barrier(uint32_t decoded0) const {
    return decoded0 + tile / kTileBytesPerBarrierByte;
  }
  __device__ __forceinline__ void step() {
    const bool last_stage = stage == kLastStage, last_tile = tile == kLastTile;
    stage = last_stage ? 0 : stage + Config::kStageBytes;
    full = last_stage ? full0 : full + 8;
    phase ^= last_stage ? 1u : 0u;
    tile = last_tile ? 0 : tile + Config::kBf16TileBytes;
    drained_parity ^= last_tile ? 1u : 0u;
  }
};

// Row d + kRow * 128 of the stage's packed B tile: its codes and its scale word. The loads are
// volatile (ordered with the barriers and the stores), so where they sit in the source is where
// they issue: decode() loads both 4-bit rows before converting either (measured on the H200, both
// ways: about 1% faster; MXFP8's rows, twice as wide, ran 5-8% slower that way).
template <class Config>
struct DecoderRow {
  uint32_t words[Config::kRowBytesB / 4];
  uint32_t scale_word;
};

template <class Config, int kRow>
__device__ __forceinline__ DecoderRow<Config> load_b_row(const DecoderAddresses& a, uint32_t stage) {
  using Layout = DecoderLayout<Config>;
  DecoderRow<Config> row;
#pragma unroll
  for (int i = 0; i < Config::kRowBytesB / 16; ++i) {
    const uint4 v = ld_shared_u32x4(a.codes + stage + uint32_t(kRow * Layout::kSecondRowCodes + 16 * i));
    row.words[4 * i] = v.x, row.words[4 * i + 1] = v.y, row.words[4 * i + 2] = v.z, row.words[4 * i + 3] = v.w;
  }
  row.scale_word = ld_shared_u32(a.scales + stage + uint32_t(kRow * Layout::kSecondRowScales));
  return row;
}

// Row d + kRow * 128 into the bf16 tile: what convert_b_row<Config, 1> writes for that row.
// `tile`: the K tile's bf16 tile as a byte offset; `select`: DecoderCodes of the K tile.
template <class Config, int kRow>
__device__ __forceinline__ void decode_b_row(const DecoderAddresses& a, const DecoderRow<Config>& row, uint32_t tile,
                                             uint32_t select) {
  using Layout = DecoderLayout<Config>;
  constexpr OperandFormat kFormat = Config::kFormatB;
  const uint32_t* words = row.words;
  const uint32_t row_codes = row.scale_word;
  // The factor of q's block: block q for 16-element blocks, q / 2 for 32-element ones.
  Bf16x2 scale[4];
  if constexpr (block_size(kFormat) == 16) {
    static_assert(kFormat != OperandFormat::Nvfp4 || Config::kValueExponentB == 7, "NVFP4 patterns times s * 2^119");
    constexpr int kExponent = kFormat == OperandFormat::Nvfp4 ? 126 - Config::kValueExponentB : 3;
    const uint32_t codes = row_codes & select;
    const Bf16x2 factors[2] = {ue4m3x2_bf16x2<kExponent, 0>(codes), ue4m3x2_bf16x2<kExponent, 1>(codes)};
#pragma unroll
    for (int q = 0; q < 4; ++q) scale[q] = q % 2 ? high_factor(factors[q / 2]) : low_factor(factors[q / 2]);
  } else {
    const Bf16x2 factors = ue8m0x2_bf16x2_spread(__byte_perm(row_codes, 0u, select));
#pragma unroll
    for (int q = 0; q < 4; ++q) scale[q] = q < 2 ? low_factor(factors) : high_factor(factors);
  }
  constexpr uint32_t kUnbias = Pair<__nv_bfloat16>::kE2M1Unbias;  // 2^126 in both halves
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      Bf16x2 value;
      if constexpr (kFormat == OperandFormat::Mxfp8) {
        // Elements 16q + 2c + {0, 1} are half-word c % 2 of word 4q + c / 2 (convert_b_row).
        const uint32_t word = words[4 * q + c / 2];
        value = __float22bfloat162_rn(__half22float2(c % 2 ? e4m3x2_half2<1>(word) : e4m3x2_half2<0>(word)));
      } else {
        // Pair c of q lives in word 2q + c / 4 (elements 16q + 8(c / 4) ..). E2M1: s.ee.m as
        // decode_nibble_pair places it. E0M3: s.mmm with m at the top of the mantissa, a subnormal
        // m * 2^-129; times 2^126 that is m * 2^-3, a normal bf16, and times the factor s * 2^3 it
        // is m * s (at most 3 + 4 significant bits): both products exact, so the value is
        // decode_e0m3_pair's times s, the sign of a zero included (every step is a product).
        const uint32_t word = words[2 * q + c / 4];
        const uint32_t patterns = stride4_patterns<kFormat == OperandFormat::E0m3 ? 4 : 6>(word, c % 4);
        value = pair_from_bits<__nv_bfloat16>(patterns);
        if constexpr (kFormat != OperandFormat::Nvfp4) value = __hmul2(value, pair_from_bits<__nv_bfloat16>(kUnbias));
      }
      o[q] = pair_bits(__hmul2(value, scale[q]));
    }
    st_shared_u32x4(a.chunks[c] + tile + uint32_t(kRow * Layout::kSecondRowChunks), out);
  }
}

// ---- wgmma ----------------------------------------------------------------------------------------

template <int kBlockN>
struct Wgmma;
template <>
struct Wgmma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
  using OpShared = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <>
struct Wgmma<256> {
  using Op = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
  using OpShared = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};

// An m64 x kN x k16 wgmma into accumulators kFirst .. kFirst + kN / 2 - 1 (the fragment layout of
// an n256 wgmma's columns 2 kFirst .., so two n128 halves fill the same registers as one n256).
template <int kN, int kFirst, int kAll, size_t... I>
__device__ __forceinline__ void wgmma_rs(const uint32_t (&a)[4], uint64_t desc_b, float (&acc)[kAll],
                                         std::index_sequence<I...>) {
  Wgmma<kN>::Op::fma(a[0], a[1], a[2], a[3], desc_b, acc[kFirst + I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <int kN, size_t... I>
__device__ __forceinline__ void wgmma_ss(uint64_t desc_a, uint64_t desc_b, float (&acc)[kN / 2],
                                         std::index_sequence<I...>) {
  Wgmma<kN>::OpShared::fma(desc_a, desc_b, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}

// Four k16 steps with both operands in shared memory (kSharedA): this warpgroup's 64 rows of the
// swizzled A tile (8 KiB apart) and the B tile; both descriptors advance 32 bytes per step. The
// accumulators are pinned by the caller around the whole K loop, not here: a definition of them
// while the previous batch is in flight would make ptxas serialize the wgmmas.
template <class Config>
__device__ __forceinline__ void issue_tile_shared(const uint8_t* a_rows, const uint8_t* bf16_tile,
                                                  float (&acc)[Config::kAccumulators]) {
  static_assert(Config::kBlockM == 128, "both operands from shared memory: 128-row tiles");
  const uint64_t desc_a = sw128_descriptor(a_rows), desc_b = sw128_descriptor(bf16_tile);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    wgmma_ss<Config::kWarpgroupN>(desc_a + uint64_t(2 * s), desc_b + uint64_t(2 * s), acc,
                                  std::make_index_sequence<Config::kAccumulators>{});
  }
  wgmma_commit();
}

// Four k16 steps over one 64-wide K tile; the descriptor advances 32 bytes (16 elements) per step.
// `b_rows`: this warpgroup's first row of the bf16 B tile (its first output column). A step is one
// wgmma of the warpgroup's kWarpgroupN columns, or two of kWgmmaN = 128 (the second 128 rows,
// 16 KiB, further into the tile).
template <class Config>
__device__ __forceinline__ void issue_tile(uint32_t (&frag)[4][4], const uint8_t* b_rows,
                                           float (&acc)[Config::kAccumulators]) {
  const uint64_t desc = sw128_descriptor(b_rows);
  // Every fragment and accumulator value is final before the fence: an instruction defining a
  // wgmma input after it makes ptxas serialize the wgmmas.
#pragma unroll
  for (int s = 0; s < 4; ++s) pin_registers(frag[s]);
  pin_registers(acc);
  wgmma_fence();
  constexpr int kN = Config::kWgmmaN;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    wgmma_rs<kN, 0>(frag[s], desc + uint64_t(2 * s), acc, std::make_index_sequence<kN / 2>{});
    if constexpr (kN < Config::kWarpgroupN) {
      constexpr uint64_t kHalf = kN * Config::kBlockK * 2 / 16;  // the descriptor counts 16 bytes
      wgmma_rs<kN, kN / 2>(frag[s], desc + kHalf + uint64_t(2 * s), acc, std::make_index_sequence<kN / 2>{});
    }
  }
  wgmma_commit();
  pin_registers(acc);
}

// ---- the kernel -----------------------------------------------------------------------------------

template <class Config>
struct SharedStorage {
  uint8_t* region;  // kRegionBytes, 1024-byte aligned: rotating decoded B tiles and/or the epilogue staging
  uint8_t* stages;  // kStages x kStageBytes
  uint64_t* full;
  uint64_t* empty;
  uint64_t* decoded;  // decode warps: bf16 tile i holds a stage's decoded B
  uint64_t* drained;  // decode warps: the wgmmas reading bf16 tile i retired

  __device__ explicit SharedStorage(uint8_t* raw) {
    // Pointer arithmetic (not an integer round trip) keeps the pointers known to be shared memory,
    // so accesses compile to LDS/STS.
    uint8_t* base = raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
    region = base;
    stages = base + Config::kRegionBytes;
    full = reinterpret_cast<uint64_t*>(stages + Config::kStages * Config::kStageBytes);
    empty = full + Config::kStages;
    decoded = empty + Config::kStages;
    drained = decoded + Config::kBf16Tiles;
  }
  // Contiguous: where the block spans go (kSpanBytes, after the barriers).
  __device__ int32_t* spans() const {
    return reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(full) + Config::kBarrierBytes);
  }
  // The spans the scheduler reads from shared memory: a contiguous problem's of few rows (the
  // backend leaves groups.first null, and engine_kernel finds them), else none.
  __device__ const int32_t* block_spans(const EngineParams& p) const {
    if constexpr (Config::kGrouping == Grouping::Contiguous) {
      return p.schedule.groups.first == nullptr ? spans() : nullptr;
    }
    return nullptr;
  }
  __device__ uint8_t* stage(int s) const { return stages + s * Config::kStageBytes; }
  // Packed B: A, B, SFA, SFB. Bf16 B: B's swizzled tile, A, SFA.
  __device__ uint8_t* a(int s) const { return stage(s) + (Config::kPackedB ? 0 : Config::kBf16TileBytes); }
  __device__ uint8_t* b(int s) const { return Config::kPackedB ? a(s) + Config::kTileBytesA : stage(s); }
  __device__ uint8_t* sfa(int s) const {
    return Config::kPackedB ? b(s) + Config::kTileBytesB : a(s) + Config::kTileBytesA;
  }
  __device__ uint8_t* sfb(int s) const { return sfa(s) + Config::kScaleBytesA; }
  // The decoded bf16 B tile `i` (0 .. kBf16Tiles - 1, packed B).
  __device__ uint8_t* bf16_tile(int i) const { return region + i * Config::kBf16TileBytes; }
  __device__ float* staging() const { return reinterpret_cast<float*>(region); }
};

// ---- the pipeline ----------------------------------------------------------------------------------

// The K tiles streamed so far as a ring position: the stage, the parity of its barriers' current
// phase, and (packed B) the rotating bf16 tile. Counters stepped once per K tile instead of
// divisions of a 64-bit tile count in the K loop.
template <class Config>
struct RingPosition {
  int stage = 0;
  uint32_t phase = 0;
  int bf16_tile = 0;
  uint32_t bf16_phase = 0;  // decode warps: the parity of bf16 tile bf16_tile's decoded/drained phase

  __device__ __forceinline__ RingPosition next() const {
    RingPosition n = *this;
    n.phase ^= stage == Config::kStages - 1 ? 1u : 0u;
    n.stage = stage == Config::kStages - 1 ? 0 : stage + 1;
    const bool last_bf16_tile = Config::kBf16Tiles == 0 || bf16_tile == Config::kBf16Tiles - 1;
    n.bf16_phase ^= last_bf16_tile ? 1u : 0u;
    n.bf16_tile = last_bf16_tile ? 0 : bf16_tile + 1;
    return n;
  }
};

// Where a tile's rows sit in the scale buffers: the first 128-row SfAtom tile that holds them, how
// many the stage holds, and the tile's first row inside the first one.
struct ScaleRows {
  int64_t first_tile;
  int tiles;
  int row0;
};

template <int kRows, int kMaxTiles>
__device__ __forceinline__ ScaleRows scale_rows(int64_t first_row, int64_t buffer_tiles) {
  const int64_t first_tile = first_row / kSfTileRows;
  const int row0 = int(first_row % kSfTileRows);
  const int64_t wanted = (row0 + kRows + kSfTileRows - 1) / kSfTileRows;
  const int64_t left = buffer_tiles - first_tile;
  const int64_t tiles = wanted < left ? wanted : left;
  return {first_tile, int(tiles < kMaxTiles ? tiles : kMaxTiles), row0};
}

template <class Config>
__device__ __forceinline__ ScaleRows a_scale_rows(const WorkTile& t, const EngineParams& p) {
  return scale_rows<Config::kBlockM, Config::kScaleTilesA>(t.m0, p.sf_row_tiles_a);
}

// B's rows of the tile: rows n0 .. of weight matrix `group`, i.e. rows group * N + n0 .. of B.
template <class Config>
__device__ __forceinline__ ScaleRows b_scale_rows(const WorkTile& t, const EngineParams& p) {
  return scale_rows<Config::kBlockN, Config::kScaleTilesB>(t.group * p.n + t.n0, p.sf_row_tiles_b);
}

template <class Config>
using EngineScheduler = Scheduler<Config::kGrouping, Config::kBlockM, Config::kBlockN>;

template <class Config>
__device__ __forceinline__ void produce(const SharedStorage<Config>& smem, const CUtensorMap* map_a,
                                        const CUtensorMap* map_b, const EngineParams& p) {
  // The scale column of K tile kt: 16-element blocks fill one SfAtom column per tile, 32-element
  // blocks one per two tiles.
  constexpr int kTilesPerAtom = kSfTileCols * Config::kBlockSize / Config::kBlockK;
  EngineScheduler<Config> scheduler(p.schedule, smem.block_spans(p));
  RingPosition<Config> ring;
  for (WorkTile t; scheduler.next(t);) {
    const ScaleRows sa = a_scale_rows<Config>(t, p), sb = b_scale_rows<Config>(t, p);
    const int64_t b_row = t.group * p.n + t.n0;
    const int a_atoms = Config::kBf16A ? 0 : sa.tiles;
    const uint32_t bytes = Config::kPackedB ? Config::kTileBytesA + Config::kTileBytesB + (a_atoms + sb.tiles) * kSfTileBytes
                                            : Config::kBf16TileBytes + Config::kTileBytesA + a_atoms * kSfTileBytes;
    for (int64_t kt = t.k_begin; kt < t.k_end; ++kt, ring = ring.next()) {
      const int s = ring.stage;
      mbar_wait(&smem.empty[s], ring.phase ^ 1);
      mbar_arrive_expect_tx(&smem.full[s], bytes);
      tma_load_2d(smem.a(s), map_a, &smem.full[s], int32_t(kt * Config::kRowBytesA), int32_t(t.m0));
      const int32_t b_column = int32_t(kt * (Config::kPackedB ? Config::kRowBytesB : Config::kBlockK * 2));
      tma_load_2d(smem.b(s), map_b, &smem.full[s], b_column, int32_t(b_row));
      const int64_t atom = kt / kTilesPerAtom;
      for (int r = 0; !Config::kBf16A && r < sa.tiles; ++r) {
        bulk_load(smem.sfa(s) + r * kSfTileBytes, p.sfa + ((sa.first_tile + r) * p.sf_k_atoms + atom) * kSfTileBytes,
                  kSfTileBytes, &smem.full[s]);
      }
      for (int r = 0; Config::kPackedB && r < sb.tiles; ++r) {
        bulk_load(smem.sfb(s) + r * kSfTileBytes, p.sfb + ((sb.first_tile + r) * p.sf_k_atoms + atom) * kSfTileBytes,
                  kSfTileBytes, &smem.full[s]);
      }
    }
  }
}

// The epilogue. Accumulators go through shared memory (the bf16 tiles are free once both
// warpgroups retired their last wgmma; the ring is not, the producer may be filling it with the
// next tile), so that the global stores are wide and coalesced. (Storing from the fragment layout,
// or walking the staging as column pairs, cost ~60 instructions per pair with bounds and 64-bit
// addressing, and ~9.5 us per 128 x 256 tile on the H200: a quarter of a short stream-K piece;
// benchmarks/NOTES.md, "the engine's fixed cost".) Only the tile's rows that its group owns are
// written (rows below m_end; contiguous groups: rows with the group's id).
//
// Plain scaling into 16-bit outputs of rows of a multiple of eight (store_tile_16bit): the whole
// tile is staged at once in the output type, both warpgroups at the same time, then each thread
// copies 16-byte row pieces out. Otherwise (store_tile): 64 rows at a time (one warpgroup's of a
// 128-row tile, or both warpgroups' column halves of a 64-row tile) land as float2 rows, then each
// thread takes one column quad (the same four columns in every row, so the bias is read once per
// tile) and walks the rows, one 16-byte shared load and one store of four outputs per row.
template <class Config, class T>
__device__ __forceinline__ void store_tile_16bit(const SharedStorage<Config>& smem, const EngineParams& p,
                                                 const float (&acc)[Config::kAccumulators], const WorkTile& t,
                                                 int consumer, float alpha) {
  // Rows 16-byte aligned; a warp's fragment writes (8 rows x 4 pairs) hit 32 distinct banks.
  constexpr int kStride = Config::kBlockN + 8;
  static_assert(Config::kBlockM * kStride * 2 <= 64 * Config::kStagingStride * 4, "the staging holds the tile");
  constexpr int kOctetsPerRow = Config::kBlockN / 8;
  constexpr int kRowsPerPass = Config::kConsumerThreads / kOctetsPerRow;
  constexpr int kValueExponent = Config::kValueExponentA + Config::kValueExponentB;
  constexpr bool kColumnHalves = Config::kBlockM == 64;
  auto* staging = reinterpret_cast<T*>(smem.staging());
  const int warpgroup = consumer / 128, lane = consumer % 32;
  const int row0 = (kColumnHalves ? 0 : 64 * warpgroup) + ((consumer % 128) / 32) * 16 + lane / 4;
  const int col0 = (kColumnHalves ? warpgroup * Config::kWarpgroupN : 0) + 2 * (lane % 4);
  named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; i += 2) {
    float x = acc[i], y = acc[i + 1];
    if constexpr (kValueExponent > 0) {  // the decoded operands' power of two, back (exact)
      x *= exp2i(kValueExponent);
      y *= exp2i(kValueExponent);
    }
    const int row = row0 + 8 * ((i % 4) / 2), col = col0 + 8 * (i / 4);
    *reinterpret_cast<uint32_t*>(staging + row * kStride + col) = pack_pair<T>(x * alpha, y * alpha);
  }
  named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
  const int col = 8 * (consumer % kOctetsPerRow);
  const int64_t n = t.n0 + col, m_end = t.m_end < p.m ? t.m_end : p.m;
  const int rows = int(m_end - t.m0 < Config::kBlockM ? m_end - t.m0 : Config::kBlockM);
  if (n < p.n) {
    T* out = static_cast<T*>(p.epilogue.out) + n;
#pragma unroll 4
    for (int row = consumer / kOctetsPerRow; row < rows; row += kRowsPerPass) {
      const int64_t m = t.m0 + row;
      if constexpr (Config::kGrouping == Grouping::Contiguous) {
        if (!p.schedule.groups.owns(t.group, m)) continue;
      }
      const uint4 v = *reinterpret_cast<const uint4*>(staging + row * kStride + col);
      store_b32x4(out + m * p.n, v.x, v.y, v.z, v.w);
    }
  }
  // The staging overlaps the bf16 B tiles, which a persistent CTA's next tile decodes into as soon
  // as its first stage arrives: every consumer has read the staging before any of them goes on.
  named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
}

template <class Config>
__device__ __forceinline__ void store_tile(const SharedStorage<Config>& smem, const EngineParams& p,
                                           const float (&acc)[Config::kAccumulators], const WorkTile& t,
                                           int consumer) {
  float* staging = smem.staging();
  const int warpgroup = consumer / 128, warp_row = ((consumer % 128) / 32) * 16, lane = consumer % 32;
  const GemmEpilogue& e = p.epilogue;
  const GroupRows& groups = p.schedule.groups;
  const float alpha = epilogue_alpha(e, t.group);
  const int64_t m_end = t.m_end < p.m ? t.m_end : p.m;
  // Plain scaling (the common case) skips the per-element bias, residual and activation tests.
  const bool plain = e.bias == nullptr && e.residual == nullptr && e.activation == Activation::None;
  if (plain && octet_stores(e, p.n)) {
    if (e.out_format == OutFormat::Fp16) return store_tile_16bit<Config, __half>(smem, p, acc, t, consumer, alpha);
    return store_tile_16bit<Config, __nv_bfloat16>(smem, p, acc, t, consumer, alpha);
  }
  constexpr int kQuadsPerRow = Config::kBlockN / 4;
  constexpr int kRowsPerPass = Config::kConsumerThreads / kQuadsPerRow;
  constexpr int kValueExponent = Config::kValueExponentA + Config::kValueExponentB;
  constexpr bool kColumnHalves = Config::kBlockM == 64;
  const int col0 = kColumnHalves ? warpgroup * Config::kWarpgroupN : 0;  // this warpgroup's first column
  const int quad_col = 4 * (consumer % kQuadsPerRow), first_row = consumer / kQuadsPerRow;
  const int64_t n = t.n0 + quad_col;
  const bool quad = quad_stores(e, p.n);
  float bias[4] = {};
  for (int j = 0; j < 4 && e.bias != nullptr; ++j) {
    if (n + j < p.n) bias[j] = bias_at(e, n + j, p.n, t.group);
  }
  // The staged half's first `rows` rows (at tile row m0), the quad of each through the epilogue.
  // Plain scaling is its own loop, unrolled; the general epilogue's stays rolled (code size).
  const auto store_rows = [&](auto plain_tag, int64_t m0, int rows) {
    constexpr bool kPlain = decltype(plain_tag)::value;
#pragma unroll(kPlain ? 4 : 1)
    for (int row = first_row; row < rows; row += kRowsPerPass) {
      const int64_t m = m0 + row;
      if constexpr (Config::kGrouping == Grouping::Contiguous) {
        if (!groups.owns(t.group, m)) continue;
      }
      const float4 v = *reinterpret_cast<const float4*>(staging + row * Config::kStagingStride + quad_col);
      float y[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (kValueExponent > 0) y[j] *= exp2i(kValueExponent);  // the decoded operands' power of two, back (exact)
        if constexpr (kPlain) {
          y[j] *= alpha;
        } else if (n + j < p.n) {
          y[j] = activate(e.activation, epilogue_sum_with_bias(e, y[j], alpha, bias[j], m, n + j, p.n));
        }
      }
      store_quad(e, m, n, p.n, quad, y);
    }
  };
  for (int half = 0; half < Config::kBlockM / 64; ++half) {
    named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
    if (kColumnHalves || warpgroup == half) {
#pragma unroll
      for (int i = 0; i < Config::kAccumulators; i += 2) {
        const int row = warp_row + lane / 4 + 8 * ((i % 4) / 2);
        const int col = col0 + 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<float2*>(staging + row * Config::kStagingStride + col) = make_float2(acc[i], acc[i + 1]);
      }
    }
    named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
    const int64_t m0 = t.m0 + 64 * half;
    const int rows = int(m_end - m0 < 64 ? m_end - m0 : 64);  // <= 0: none of this half's rows exist
    if (n >= p.n) continue;
    if (plain) {
      store_rows(std::true_type{}, m0, rows);
    } else {
      store_rows(std::false_type{}, m0, rows);
    }
  }
  // The staging overlaps the bf16 B tiles, which a persistent CTA's next tile decodes into as soon
  // as its first stage arrives: every consumer has read the staging before any of them goes on.
  named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
}

// Stream-K: this CTA's partial tile (its first piece of work) for the tile's owner, in its slot.
template <class Config>
__device__ __forceinline__ void publish_partial(const EngineParams& p, const float (&acc)[Config::kAccumulators],
                                                int64_t slot, int consumer) {
  // Two accumulators per 8-byte store (__stcg: the owner reads them from L2), consumer-major per
  // pair. (16-byte loads in the gather made ptxas spill in the MXFP8 K loop; an st.global through
  // inline assembly here made it serialize the wgmmas, C7514.)
  auto* partial = reinterpret_cast<float2*>(p.partials + slot * Config::kBlockM * Config::kBlockN);
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; i += 2) {
    __stcg(partial + (i / 2) * Config::kConsumerThreads + consumer, make_float2(acc[i], acc[i + 1]));
  }
  __threadfence();
  named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
  if (consumer == 0) flag_release(p.flags + slot);
}

// Stream-K: waits until the partials of slot `lead` and of CTAs first..last are published, one
// consumer thread a flag, so that a CTA waits for the slowest of them once instead of for each in
// turn.
template <class Config>
__device__ __forceinline__ void await_partials(const EngineParams& p, int64_t lead, int64_t first, int64_t last,
                                               int consumer) {
  const int64_t count = last - first + 2;
  for (int64_t i = consumer; i < count; i += Config::kConsumerThreads) {
    flag_acquire(p.flags + (i == 0 ? lead : first + i - 1));
  }
  named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
}

// Stream-K, a split tile its owner finishes alone (a 128-row tile, or a 64-row one that fewer than
// kSpreadFixupSharers CTAs end in; spread_fixup is for the others): the owner adds the partials of
// CTAs first..last, in that order (the sum does not depend on which contributor finished first).
// Their flags are awaited all at once (await_partials).
// kGatherPairs: the 64-row tile of NVFP4 or MXFP4 loads two partials at a time (its 64 accumulators
// leave the registers for them): one L2 round trip for both. It measured 1.01-1.05x at M = 64 on the
// H200, most where a tile has many pieces (64 x 2048 x 7168: 16); MXFP8 ran 1-2 % slower with it,
// W4A16 no faster, and the 128-row tile has no registers for it (benchmarks/NOTES.md, session 18).
template <class Config>
__device__ __forceinline__ void gather_partials(const EngineParams& p, float (&acc)[Config::kAccumulators],
                                                int64_t first, int64_t last, int consumer) {
  await_partials<Config>(p, first, first + 1, last, consumer);
  int64_t first_single = first;
  if constexpr (Config::kGatherPairs) {
    constexpr int kPairs = Config::kAccumulators / 2;
    const auto partial_of = [&](int64_t cta) {
      return reinterpret_cast<const float2*>(p.partials + cta * Config::kBlockM * Config::kBlockN) + consumer;
    };
    for (; first_single + 1 <= last; first_single += 2) {
      float2 v[2][kPairs];
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kPairs; ++i) v[b][i] = __ldcg(partial_of(first_single + b) + i * Config::kConsumerThreads);
      }
#pragma unroll
      for (int b = 0; b < 2; ++b) {
#pragma unroll
        for (int i = 0; i < kPairs; ++i) acc[2 * i] += v[b][i].x, acc[2 * i + 1] += v[b][i].y;
      }
    }
  }
  for (int64_t cta = first_single; cta <= last; ++cta) {
    const auto* partial = reinterpret_cast<const float2*>(p.partials + cta * Config::kBlockM * Config::kBlockN);
#pragma unroll
    for (int i = 0; i < Config::kAccumulators; i += 2) {
      const float2 v = __ldcg(partial + (i / 2) * Config::kConsumerThreads + consumer);
      acc[i] += v.x, acc[i + 1] += v.y;
    }
  }
}

// Stream-K: a 64-row split tile shared by at least this many CTAs that end in it spreads its fix-up
// over them (spread_fixup); fewer leave it to the owner (gather_partials). Measured on the H200
// (benchmarks/NOTES.md, session 19) against the owner alone: 1.27-1.44x at 22 sharers
// (64 x 1536 x 7168), 1.08-1.21x at 16 (64 x 2048 x 7168); a first version spreading from 2 sharers
// on ran 0.95-1.00x at 8 (64 x 4096 x 7168) and 0.89-0.92x at 2-3.
constexpr int kSpreadFixupSharers = 12;

// Stream-K, a split tile shared by kSpreadFixupSharers or more CTAs that end in it (its owner and
// the contributors whose work ends there; the owner then publishes its partial too): CTA owner + c,
// for c < kFixupChunks, waits for all the tile's partials, adds chunk c of them (an eighth of the
// tile) in the owner's gather's order (the owner's first, then in CTA order: bitwise the same sums)
// and stores it through the epilogue from the fragment layout, with store_tile's operations per
// element. One SM reading every partial is bound by its share of L2 bandwidth (about 0.55 us per
// 64 KB partial on the H200, 16-22 partials at 64 x 1536..2048 x 7168); spread, each of 8 SMs reads
// an eighth. The chunk is a runtime index into the partials only, so the code is one copy: a copy
// per chunk, adding into the accumulators, made the kernels' other shapes 1-3 % slower; this one
// still costs the 64-row kernels 0.4-2.9 % where it is not taken (benchmarks/NOTES.md).
template <class Config>
__device__ __forceinline__ void spread_fixup(const EngineParams& p, const WorkTile& t, int64_t owner_slot,
                                             int64_t owner, int64_t last, int chunk, int consumer) {
  static_assert(kSpreadFixupSharers >= Config::kFixupChunks, "a sharer for every chunk");
  constexpr int kPairs = 2 * Config::kFixupOctets;  // float2 of the chunk a thread holds
  // Partials in flight at once: 64 floats, 32 for E0M3 weights.
  constexpr int kBatch = (Config::kFormatB == OperandFormat::E0m3 ? 16 : 32) / kPairs;
  const int64_t count = last - owner + 1;
  await_partials<Config>(p, owner_slot, owner + 1, last, consumer);
  // A batch past the last partial loads the last one again and adds nothing.
  const auto chunk_of = [&](int64_t i) {
    const int64_t slot = i == 0 ? owner_slot : owner + (i < count ? i : count - 1);
    return reinterpret_cast<const float2*>(p.partials + slot * Config::kBlockM * Config::kBlockN) +
           chunk * kPairs * Config::kConsumerThreads + consumer;
  };
  float2 sum[kPairs] = {};  // every element is assigned partial 0 first
  for (int64_t i = 0; i < count; i += kBatch) {
    float2 v[kBatch][kPairs];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) v[b][j] = __ldcg(chunk_of(i + b) + j * Config::kConsumerThreads);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const bool first = i + b == 0, inside = i + b < count;
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        sum[j].x = first ? v[b][j].x : inside ? sum[j].x + v[b][j].x : sum[j].x;
        sum[j].y = first ? v[b][j].y : inside ? sum[j].y + v[b][j].y : sum[j].y;
      }
    }
  }
  // Pair P of the fragment: rows row0 + 8 (P % 2), columns col0 + 8 (P / 2) and the next.
  constexpr bool kColumnHalves = Config::kBlockM == 64;
  constexpr int kValueExponent = Config::kValueExponentA + Config::kValueExponentB;
  const int warpgroup = consumer / 128, lane = consumer % 32;
  const int row0 = (kColumnHalves ? 0 : 64 * warpgroup) + ((consumer % 128) / 32) * 16 + lane / 4;
  const int col0 = (kColumnHalves ? warpgroup * Config::kWarpgroupN : 0) + 2 * (lane % 4);
  const GemmEpilogue& e = p.epilogue;
  const float alpha = epilogue_alpha(e, t.group);
  const int64_t m_end = t.m_end < p.m ? t.m_end : p.m;
  // One copy of the epilogue's code (rolled; the pairs shift down through sum[0]).
#pragma unroll 1
  for (int j = 0; j < kPairs; ++j) {
    const float2 v = sum[0];
#pragma unroll
    for (int k = 0; k + 1 < kPairs; ++k) sum[k] = sum[k + 1];
    const int pair = chunk * kPairs + j;
    const int64_t m = t.m0 + row0 + 8 * (pair % 2), n = t.n0 + col0 + 8 * (pair / 2);
    if (m >= m_end || n >= p.n) continue;
    float x = v.x, y = v.y;
    if constexpr (kValueExponent > 0) {  // the decoded operands' power of two, back (exact)
      x *= exp2i(kValueExponent);
      y *= exp2i(kValueExponent);
    }
    store_pair(e, m, n, p.n, epilogue_value(e, x, alpha, m, n, p.n, t.group),
               epilogue_value(e, y, alpha, m, n + 1, p.n, t.group));
  }
}

// Decode warps: the consumers are done with the epilogue staging (and the decoded buffers under
// it), the decoders may go on to the next tile.
template <class Config>
__device__ __forceinline__ void free_staging() {
  if constexpr (Config::kDecodeWarps) {
    named_barrier_arrive(kStagingFreeBarrier, Config::kConsumerThreads + Config::kDecoderThreads);
  }
}

// One arrive of this warp on `barrier` (a pointer or a shared-memory address), once every lane is
// done with what it guards.
template <class Barrier>
__device__ __forceinline__ void warp_arrive(Barrier barrier, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(barrier);
}

// After a warp decoded its share of a stage: frees the stage. One proxy fence, before the arrive,
// orders both sides of the generic/async boundary: the bf16 tiles' stores before the wgmmas that
// read them (the caller then hands the tiles over), and this stage's shared loads (still in flight
// at the arrive, their registers used after it) before the producer's next TMA write into the
// stage, which the arrive's release alone does not (benchmarks/NOTES.md).
template <class Config>
__device__ __forceinline__ void free_decoded_stage(const SharedStorage<Config>& smem, int stage, int lane) {
  fence_async_shared();
  warp_arrive(&smem.empty[stage], lane);
}

template <class Config>
__device__ __forceinline__ void consume(const SharedStorage<Config>& smem, const EngineParams& p) {
  const int consumer = int(threadIdx.x) - 128;  // 0..255
  // The warp's 16 rows: in a 128-row tile warpgroup 1 has rows 0..63, 2 rows 64..127; in a 64-row
  // tile both have rows 0..63, and warpgroup 2 the second half of the columns (rows of the B tile).
  const int warp_row = ((consumer % (2 * Config::kBlockM)) / 32) * 16;
  const int b_columns = Config::kBlockM == 64 ? (consumer / 128) * Config::kWarpgroupN * Config::kBlockK * 2 : 0;
  const int lane = consumer % 32;
  const int b_row = consumer / Config::kThreadsPerRowB;
  const int b_sub = consumer % Config::kThreadsPerRowB;
  const int64_t nkb = p.nkb;
  int b_offsets[Config::kChunksPerThread];
  b_chunk_offsets<Config::kThreadsPerRowB>(b_row, b_sub, b_offsets);
  float acc[Config::kAccumulators];
  uint32_t frag[2][4][4];

  // Waits for K tile kt (ring position r), decodes it (A into registers, B into its bf16 tile),
  // frees its stage, and meets the other consumer warpgroup so the whole bf16 tile is written
  // before any wgmma. sf_a / sf_b: the tile's first row in the stage's scale atoms. With decode
  // warps B is theirs: the consumers decode A only, and wait for the bf16 tile by mbarrier.
  //
  // With a bf16 B from TMA, only A is decoded; the stage is freed once the wgmma reading its B tile
  // retired, and the warpgroups need not meet.
  const auto stage_in = [&](int64_t kt, const RingPosition<Config>& r, int sf_a, int sf_b, uint32_t(&f)[4][4]) {
    const int s = r.stage;
    mbar_wait(&smem.full[s], r.phase);
    const TileCodes codes = tile_codes<Config>(kt, nkb);
    if constexpr (Config::kPackedB) {
      if constexpr (Config::kDecodeWarps) {  // B is the decoders'; its tile comes by mbarrier
        load_a_fragments<Config>(smem.a(s), smem.sfa(s), sf_a, warp_row, lane, codes, f);
        free_decoded_stage(smem, s, lane);
      } else {
        pin_registers(b_offsets);  // kept, not recomputed per K tile
        convert_b_row<Config, Config::kThreadsPerRowB>(smem.b(s), smem.sfb(s), sf_b, smem.bf16_tile(r.bf16_tile),
                                                        b_row, b_sub, codes, b_offsets);
        load_a_fragments<Config>(smem.a(s), smem.sfa(s), sf_a, warp_row, lane, codes, f);
        free_decoded_stage(smem, s, lane);
        named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);  // the whole bf16 tile is written
      }
    } else {
      load_a_fragments<Config>(smem.a(s), smem.sfa(s), sf_a, warp_row, lane, codes, f);
    }
  };
  const auto b_tile = [&](const RingPosition<Config>& r) -> const uint8_t* {
    return (Config::kPackedB ? smem.bf16_tile(r.bf16_tile) : smem.b(r.stage)) + b_columns;
  };
  // Frees a stage once this warp's wgmmas reading it retired (stages read by wgmma).
  const auto release = [&](int stage) { warp_arrive(&smem.empty[stage], lane); };

  EngineScheduler<Config> scheduler(p.schedule, smem.block_spans(p));
  RingPosition<Config> ring;  // of the next K tile to wait for
  for (WorkTile t; scheduler.next(t);) {
    // A dense tile starts on a scale tile (a compile-time 0 keeps the decode's addressing as it was),
    // a dense 64-row one on row 0 or 64 of one.
    constexpr bool kDense = Config::kGrouping == Grouping::Dense;
    const int sf_a = kDense && Config::kBlockM == 128 ? 0 : a_scale_rows<Config>(t, p).row0;
    const int sf_b = kDense ? 0 : b_scale_rows<Config>(t, p).row0;
#pragma unroll
    for (int i = 0; i < Config::kAccumulators; ++i) acc[i] = 0.0f;
    if constexpr (Config::kSharedA) {
      // Both operands in shared memory: one batch of wgmmas stays in flight while the next is
      // issued, and a stage is freed once the batch reading it retired.
      const int64_t a_rows = (consumer / 128) * 64 * Config::kRowBytesA;  // this warpgroup's 64 rows
      pin_registers(acc);
      int previous = 0;  // the stage the batch in flight reads
      for (int64_t kt = t.k_begin; kt < t.k_end; ++kt, ring = ring.next()) {
        const int s = ring.stage;
        mbar_wait(&smem.full[s], ring.phase);
        issue_tile_shared<Config>(smem.a(s) + a_rows, smem.b(s), acc);
        wgmma_wait<1>();
        if (kt > t.k_begin) release(previous);
        previous = s;
      }
      wgmma_wait<0>();
      release(previous);
    } else {
      // wgmma(kt) runs while tile kt + 1 is decoded. It is retired (wait 0) before wgmma(kt + 1) is
      // issued: a wgmma whose inputs are defined while an earlier one is in flight, in the same
      // pipeline stage, makes ptxas serialize them all. Tile kt + 1 overwrites the bf16 tile of
      // kt - 2: the other warpgroup retired wgmma(kt - 2) before it reached the barrier of tile kt,
      // which this thread has passed. (With two tiles, wgmma(kt - 1) of the other warpgroup may
      // still be reading.) The two fragment buffers alternate with the loop unrolled twice, or
      // (kAlternatingFragments false) tile kt + 1's fragments are handed over with moves, keeping
      // one copy of the loop body in the instruction cache.
      const auto step = [&](int64_t kt, uint32_t(&f)[4][4], uint32_t(&next_f)[4][4]) {
        const RingPosition<Config> next = ring.next();
        if constexpr (Config::kDecodeWarps) mbar_wait(&smem.decoded[ring.bf16_tile], ring.bf16_phase);
        issue_tile<Config>(f, b_tile(ring), acc);
        if (kt + 1 < t.k_end) stage_in(kt + 1, next, sf_a, sf_b, next_f);
        wgmma_wait<0>();
        for (auto& r : f) pin_registers(r);  // alive until retired: tile kt + 1 cannot reuse them
        if constexpr (!Config::kPackedB) release(ring.stage);
        // decode warps: the bf16 tile goes back once the wgmmas reading it retired
        if constexpr (Config::kDecodeWarps) warp_arrive(&smem.drained[ring.bf16_tile], lane);
        ring = next;
      };
      stage_in(t.k_begin, ring, sf_a, sf_b, frag[0]);
      if constexpr (Config::kAlternatingFragments) {
        for (int64_t kt = t.k_begin; kt < t.k_end; kt += 2) {
          step(kt, frag[0], frag[1]);
          if (kt + 1 < t.k_end) step(kt + 1, frag[1], frag[0]);
        }
      } else {
        for (int64_t kt = t.k_begin; kt < t.k_end; ++kt) {
          step(kt, frag[0], frag[1]);
          for (int s = 0; s < 4; ++s) {
            for (int r = 0; r < 4; ++r) frag[0][s][r] = frag[1][s][r];
          }
        }
      }
    }
    pin_registers(acc);

    bool owner_stores = true;  // the tile through store_tile: a whole tile, or a split one's owner alone
    if constexpr (Config::kGrouping == Grouping::Dense) {
      if (t.k_begin > 0 || t.k_end < p.schedule.k_tiles) {  // a split tile (stream-K)
        const bool owns = t.k_begin == 0;
        const int64_t owner = scheduler.owner(t), last = scheduler.last_contributor(t);
        const int sharers = int(last - owner) + (scheduler.ends_in(last, t) ? 1 : 0);
        if (Config::kSpreadFixup && sharers >= kSpreadFixupSharers) {  // spread over the CTAs ending here
          publish_partial<Config>(p, acc, owns ? scheduler.owner_slot(owner) : scheduler.slot(), consumer);
          const int sharer = int(blockIdx.x - owner);  // chunk `sharer`: one each, the sharers past them idle
          if ((owns || scheduler.ends_in(blockIdx.x, t)) && sharer < Config::kFixupChunks) {
            spread_fixup<Config>(p, t, scheduler.owner_slot(owner), owner, last, sharer, consumer);
          }
          owner_stores = false;
        } else if (!owns) {  // a later piece of a tile its owner finishes alone
          publish_partial<Config>(p, acc, scheduler.slot(), consumer);
          owner_stores = false;
        } else {  // the owner (this CTA) alone
          gather_partials<Config>(p, acc, scheduler.slot() + 1, last, consumer);
        }
      }
    }
    if (owner_stores) store_tile<Config>(smem, p, acc, t, consumer);
    free_staging<Config>();
  }
}

// The decode warps (EngineConfig::kDecodeWarps): each stage's B into a bf16 tile, two rows a
// thread, ahead of the consumers by up to kBf16Tiles tiles (the same scheduler, ring and tile
// rotation; mbarriers hand the tiles over and back). Between tiles they wait for the consumers'
// epilogue, whose staging overlaps the tiles.
template <class Config>
__device__ __forceinline__ DecoderAddresses decoder_addresses(const SharedStorage<Config>& smem, int d) {
  DecoderAddresses a;
  a.codes = smem_addr(smem.b(0)) + uint32_t(d * Config::kRowBytesB);
  a.scales = smem_addr(smem.sfb(0)) + uint32_t(sf_offset(d, 0, 1));
  int offsets[8];
  b_chunk_offsets<1>(d, 0, offsets);
  const uint32_t tile = smem_addr(smem.bf16_tile(0));
#pragma unroll
  for (int c = 0; c < 8; ++c) a.chunks[c] = tile + uint32_t(offsets[c]);
  return a;
}

template <class Config>
__device__ __forceinline__ void decode(const SharedStorage<Config>& smem, const EngineParams& p) {
  const int d = int(threadIdx.x) - 128 - Config::kConsumerThreads;  // 0 .. kDecoderThreads - 1
  const int lane = d % 32;
  DecoderAddresses a = decoder_addresses(smem, d);
  // empty[s] is kStages barriers after full[s], drained[i] kBf16Tiles after decoded[i] (SharedStorage).
  constexpr uint32_t kEmpty = 8 * Config::kStages, kDrained = 8 * Config::kBf16Tiles;
  const DecoderCodes<Config> codes(p.nkb);
  EngineScheduler<Config> scheduler(p.schedule, smem.block_spans(p));
  const uint32_t decoded0 = smem_addr(smem.decoded);
  DecoderRing<Config> ring(smem_addr(smem.full));
  for (WorkTile t; scheduler.next(t);) {
    typename DecoderCodes<Config>::Tiles tile_codes = codes.tiles(t.k_begin, t.k_end);
    const int k_tiles = int(t.k_end - t.k_begin);
    for (int i = 0; i < k_tiles; ++i, ring.step(), tile_codes.step()) {
      const uint32_t decoded = ring.tile_barrier(decoded0);
      mbar_wait(ring.full, ring.phase);
      mbar_wait(decoded + kDrained, ring.drained_parity);
      pin_registers(a.chunks);  // kept, not recomputed per K tile
      const uint32_t select = tile_codes.select(i);
      if constexpr (Config::kRowBytesB <= 32) {  // 4-bit B: both rows' loads in flight at once
        const DecoderRow<Config> first = load_b_row<Config, 0>(a, ring.stage);
        const DecoderRow<Config> second = load_b_row<Config, 1>(a, ring.stage);
        decode_b_row<Config, 0>(a, first, ring.tile, select);
        decode_b_row<Config, 1>(a, second, ring.tile, select);
      } else {  // MXFP8's 64-byte rows: two at once cost more registers than the overlap gains
        decode_b_row<Config, 0>(a, load_b_row<Config, 0>(a, ring.stage), ring.tile, select);
        decode_b_row<Config, 1>(a, load_b_row<Config, 1>(a, ring.stage), ring.tile, select);
      }
      // free_decoded_stage's fence and arrive on empty[s], then the bf16 tile's hand-over
      fence_async_shared();
      warp_arrive(ring.full + kEmpty, lane);
      if (lane == 0) mbar_arrive(decoded);
    }
    named_barrier_sync(kStagingFreeBarrier, Config::kConsumerThreads + Config::kDecoderThreads);
  }
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    engine_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                  const EngineParams p) {
  extern __shared__ uint8_t smem_raw[];
  const SharedStorage<Config> smem(smem_raw);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_a);
    prefetch_tensor_map(&map_b);
    for (int s = 0; s < Config::kStages; ++s) {
      mbar_init(&smem.full[s], 1);
      mbar_init(&smem.empty[s], Config::kStageReaders);
    }
    for (int b = 0; Config::kDecodeWarps && b < Config::kBf16Tiles; ++b) {
      mbar_init(&smem.decoded[b], Config::kDecoderThreads / 32);
      mbar_init(&smem.drained[b], Config::kConsumerThreads / 32);
    }
    mbar_init_fence();
  }
  __syncthreads();
  griddep_wait();  // the group spans (contiguous) and the operands may come from the previous kernel
  griddep_launch_dependents();
  if constexpr (Config::kGrouping == Grouping::Contiguous) {
    const GroupRows& groups = p.schedule.groups;
    if (smem.block_spans(p) != nullptr) {
      find_spans(groups.ids, int(groups.m), int(groups.groups), smem.spans(), smem.spans() + groups.groups);
    }
  }

  if (threadIdx.x < 128) {
    lower_registers<Config::kProducerRegisters>();
    if (threadIdx.x == 0) produce<Config>(smem, &map_a, &map_b, p);
  } else if (!Config::kDecodeWarps || threadIdx.x < 128 + Config::kConsumerThreads) {
    raise_registers<Config::kConsumerRegisters>();
    consume<Config>(smem, p);
  } else if constexpr (Config::kDecodeWarps) {
    lower_registers<Config::kDecoderRegisters>();
    decode<Config>(smem, p);
  }
}

}  // namespace fp4_gemm::sm90
