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

// ---- the decoder warpgroup's addressing ---------------------------------------------------------
//
// The decoders write what convert_b_row writes, with the same two steps (b_row_factors,
// decode_b_chunk, decode.cuh), in fewer instructions per K tile, since the consumers wait for them:
// - every shared-memory address is a register kept across K tiles plus the K tile's stage or bf16
//   tile (uniform) plus a constant, one LDS/STS operand with no address arithmetic; a thread's
//   second row, d + 128, sits a constant distance from its first in the stage, in the scale atoms
//   (the next SfAtom tile, same place) and in the bf16 tile (16 KiB: the same swizzle), so both
//   rows share those registers;
// - the K tile's BlockSelect is stepped once per tile (DecoderCodes) instead of made from the
//   64-bit tile index.

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

// A K tile's BlockSelect, as BlockSelect::of(tile_codes) gives it, stepped per K tile by one
// compare and select instead of 64-bit arithmetic: only the last K tile of K can end inside its
// blocks. `tiles` gives the selection for a work tile's K tiles, first to last.
template <class Config>
struct DecoderCodes {
  using Select = BlockSelect<Config>;
  static constexpr int kBlocks = Select::kBlocks;
  static constexpr uint32_t kFull = Select::kFull;
  static constexpr uint32_t kOdd = Select::kOdd;
  int64_t last_kt;  // the last K tile
  uint32_t last;    // 16-element blocks: its mask; 32-element: the bits it sets in its selector

  __device__ explicit DecoderCodes(int64_t nkb) : last_kt((nkb - 1) / kBlocks) {
    const int64_t in_k = nkb - last_kt * kBlocks;  // 1 .. kBlocks
    if constexpr (kBlocks == 4) {
      last = in_k >= 4 ? kFull : (1u << (8 * in_k)) - 1u;
    } else {
      last = in_k >= 2 ? 0u : Select::kSecondPastK;
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

// Row d + kRow * 128 into the bf16 tile. `tile`: the K tile's bf16 tile as a byte offset; `select`:
// DecoderCodes of the K tile.
template <class Config, int kRow>
__device__ __forceinline__ void decode_b_row(const DecoderAddresses& a, const DecoderRow<Config>& row, uint32_t tile,
                                             uint32_t select) {
  using Layout = DecoderLayout<Config>;
  PairFactor<Config::kFormatB> scale[4];
  b_row_factors<Config>(row.scale_word, select, scale);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    ptx::st_shared_u32x4(a.chunks[c] + tile + uint32_t(kRow * Layout::kSecondRowChunks),
                         decode_b_chunk<Config>(row.words, scale, c, c));
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
      ptx::mbar_arrive(ring.full + kEmpty);
      if (lane == 0) ptx::mbar_arrive(decoded);
    }
    ptx::named_barrier_sync(kStagingFreeBarrier, Config::kConsumerThreads + Config::kDecoderThreads);
  }
}

}  // namespace fp4_gemm::sm90
