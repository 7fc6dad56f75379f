// The decoder warpgroup (EngineConfig::kDecodeWarps): each stage's packed B into a swizzled bf16
// tile, two rows a thread, ahead of the consumers; mbarriers hand the tiles over and back.
#pragma once

#include <cstdint>

#include "csrc/common/dequant.cuh"
#include "csrc/common/ptx.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/sm90/config.cuh"
#include "csrc/gemm/sm90/decode.cuh"
#include "csrc/gemm/sm90/wgmma.cuh"

namespace fp4_gemm::sm90 {

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
// they issue: decode() loads both 4-bit rows before converting either, which overlaps their
// latency; MXFP8's rows, twice as wide, cost more registers that way than the overlap gains.
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
    const uint4 v = ptx::ld_shared_u32x4(a.codes + stage + uint32_t(kRow * Layout::kSecondRowCodes + 16 * i));
    row.words[4 * i] = v.x, row.words[4 * i + 1] = v.y, row.words[4 * i + 2] = v.z, row.words[4 * i + 3] = v.w;
  }
  row.scale_word = ptx::ld_shared_u32(a.scales + stage + uint32_t(kRow * Layout::kSecondRowScales));
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
    ptx::st_shared_u32x4(a.chunks[c] + tile + uint32_t(kRow * Layout::kSecondRowChunks), out);
  }
}

// The decode warps (EngineConfig::kDecodeWarps): each stage's B into a bf16 tile, two rows a
// thread, ahead of the consumers by up to kBf16Tiles tiles (the same scheduler, ring and tile
// rotation; mbarriers hand the tiles over and back). Between tiles they wait for the consumers'
// epilogue, whose staging overlaps the tiles.
template <class Config>
__device__ __forceinline__ DecoderAddresses decoder_addresses(const SharedStorage<Config>& smem, int d) {
  DecoderAddresses a;
  a.codes = ptx::smem_addr(smem.b(0)) + uint32_t(d * Config::kRowBytesB);
  a.scales = ptx::smem_addr(smem.sfb(0)) + uint32_t(sf_offset(d, 0, 1));
  int offsets[8];
  b_chunk_offsets<1>(d, 0, offsets);
  const uint32_t tile = ptx::smem_addr(smem.bf16_tile(0));
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
  const uint32_t decoded0 = ptx::smem_addr(smem.decoded);
  DecoderRing<Config> ring(ptx::smem_addr(smem.full));
  for (WorkTile t; scheduler.next(t);) {
    typename DecoderCodes<Config>::Tiles tile_codes = codes.tiles(t.k_begin, t.k_end);
    const int k_tiles = int(t.k_end - t.k_begin);
    for (int i = 0; i < k_tiles; ++i, ring.step(), tile_codes.step()) {
      const uint32_t decoded = ring.tile_barrier(decoded0);
      ptx::mbar_wait(ring.full, ring.phase);
      ptx::mbar_wait(decoded + kDrained, ring.drained_parity);
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
      ptx::fence_async_shared();
      warp_arrive(ring.full + kEmpty, lane);
      if (lane == 0) ptx::mbar_arrive(decoded);
    }
    ptx::named_barrier_sync(kStagingFreeBarrier, Config::kConsumerThreads + Config::kDecoderThreads);
  }
}

}  // namespace fp4_gemm::sm90
