// The engine's main loop: the producer (one thread streaming A, B and their scale tiles through the
// ring of stages with TMA) and the consumers (decode A, and B where no decoder warpgroup runs; issue
// the wgmmas; then the fix-up and the epilogue store of each work tile).
#pragma once

#include <cstdint>
#include <utility>

#include "csrc/common/launch.cuh"
#include "csrc/common/ptx.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/sm90/config.cuh"
#include "csrc/gemm/sm90/decode.cuh"
#include "csrc/gemm/sm90/epilogue_store.cuh"
#include "csrc/gemm/sm90/stream_k_fixup.cuh"
#include "csrc/gemm/sm90/wgmma.cuh"

namespace fp4_gemm::sm90 {

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
      ptx::mbar_wait(&smem.empty[s], ring.phase ^ 1);
      ptx::mbar_arrive_expect_tx(&smem.full[s], bytes);
      ptx::tma_load_2d(smem.a(s), map_a, &smem.full[s], int32_t(kt * Config::kRowBytesA), int32_t(t.m0));
      const int32_t b_column = int32_t(kt * (Config::kPackedB ? Config::kRowBytesB : Config::kBlockK * 2));
      ptx::tma_load_2d(smem.b(s), map_b, &smem.full[s], b_column, int32_t(b_row));
      const int64_t atom = kt / kTilesPerAtom;
      for (int r = 0; !Config::kBf16A && r < sa.tiles; ++r) {
        ptx::bulk_load(smem.sfa(s) + r * kSfTileBytes, p.sfa + ((sa.first_tile + r) * p.sf_k_atoms + atom) * kSfTileBytes,
                  kSfTileBytes, &smem.full[s]);
      }
      for (int r = 0; Config::kPackedB && r < sb.tiles; ++r) {
        ptx::bulk_load(smem.sfb(s) + r * kSfTileBytes, p.sfb + ((sb.first_tile + r) * p.sf_k_atoms + atom) * kSfTileBytes,
                  kSfTileBytes, &smem.full[s]);
      }
    }
  }
}

// Decode warps: the consumers are done with the epilogue staging (and the decoded buffers under
// it), the decoders may go on to the next tile.
template <class Config>
__device__ __forceinline__ void free_staging() {
  if constexpr (Config::kDecodeWarps) {
    ptx::named_barrier_arrive(kStagingFreeBarrier, Config::kConsumerThreads + Config::kDecoderThreads);
  }
}

// After a warp decoded its share of a stage: frees the stage. One proxy fence, before the arrive,
// orders both sides of the generic/async boundary: the bf16 tiles' stores before the wgmmas that
// read them (the caller then hands the tiles over), and this stage's shared loads (still in flight
// at the arrive, their registers used after it) before the producer's next TMA write into the
// stage, which the arrive's release alone does not.
template <class Config>
__device__ __forceinline__ void free_decoded_stage(const SharedStorage<Config>& smem, int stage) {
  ptx::fence_async_shared();
  ptx::mbar_arrive(&smem.empty[stage]);
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
    ptx::mbar_wait(&smem.full[s], r.phase);
    const TileCodes codes = tile_codes<Config>(kt, nkb);
    if constexpr (Config::kPackedB) {
      if constexpr (Config::kDecodeWarps) {  // B is the decoders'; its tile comes by mbarrier
        load_a_fragments<Config>(smem.a(s), smem.sfa(s), sf_a, warp_row, lane, codes, f);
        free_decoded_stage<Config>(smem, s);
      } else {
        pin_registers(b_offsets);  // kept, not recomputed per K tile
        convert_b_row<Config, Config::kThreadsPerRowB>(smem.b(s), smem.sfb(s), sf_b, smem.bf16_tile(r.bf16_tile),
                                                        b_row, b_sub, BlockSelect<Config>::of(codes), b_offsets);
        load_a_fragments<Config>(smem.a(s), smem.sfa(s), sf_a, warp_row, lane, codes, f);
        free_decoded_stage<Config>(smem, s);
        ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);  // the whole bf16 tile is written
      }
    } else {
      load_a_fragments<Config>(smem.a(s), smem.sfa(s), sf_a, warp_row, lane, codes, f);
    }
  };
  const auto b_tile = [&](const RingPosition<Config>& r) -> const uint8_t* {
    return (Config::kPackedB ? smem.bf16_tile(r.bf16_tile) : smem.b(r.stage)) + b_columns;
  };
  // Frees a stage once this warp's wgmmas reading it retired (stages read by wgmma).
  const auto release = [&](int stage) { ptx::mbar_arrive(&smem.empty[stage]); };

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
        ptx::mbar_wait(&smem.full[s], ring.phase);
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
        if constexpr (Config::kDecodeWarps) ptx::mbar_wait(&smem.decoded[ring.bf16_tile], ring.bf16_phase);
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

}  // namespace fp4_gemm::sm90
