// Stream-K's fix-up (scheduler.cuh, Dense): contributors publish their partial tiles and raise a
// flag; the owner waits and adds them in CTA order (gather_partials), or, for a 64-row tile many CTAs
// end in, the tile's sharers each add and store a chunk of it (spread_fixup).
#pragma once

#include <cstdint>

#include "csrc/common/ptx.cuh"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/sm90/config.cuh"

namespace fp4_gemm::sm90 {

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
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
  if (consumer == 0) ptx::flag_release(p.flags + slot);
}

// Stream-K: waits until the partials of slot `lead` and of CTAs first..last are published, one
// consumer thread a flag, so that a CTA waits for the slowest of them once instead of for each in
// turn.
template <class Config>
__device__ __forceinline__ void await_partials(const EngineParams& p, int64_t lead, int64_t first, int64_t last,
                                               int consumer) {
  const int64_t count = last - first + 2;
  for (int64_t i = consumer; i < count; i += Config::kConsumerThreads) {
    ptx::flag_acquire(p.flags + (i == 0 ? lead : first + i - 1));
  }
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
}

// Stream-K, a split tile its owner finishes alone (a 128-row tile, or a 64-row one that fewer than
// kSpreadFixupSharers CTAs end in; spread_fixup is for the others): the owner adds the partials of
// CTAs first..last, in that order (the sum does not depend on which contributor finished first).
// Their flags are awaited all at once (await_partials).
// kGatherPairs: the 64-row tile of NVFP4 or MXFP4 loads two partials at a time (its 64 accumulators
// leave the registers for them): one L2 round trip for both. It pays most where a tile has many
// pieces; MXFP8 and W4A16 gain nothing from it, and the 128-row tile has no registers for it
// (docs/PERFORMANCE.md, kGatherPairs).
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
// over them (spread_fixup); fewer leave it to the owner (gather_partials): with few sharers the
// spread's extra flags cost more than the reads it spreads (docs/PERFORMANCE.md, kSpreadFixupSharers).
constexpr int kSpreadFixupSharers = 12;

// Stream-K, a split tile shared by kSpreadFixupSharers or more CTAs that end in it (its owner and
// the contributors whose work ends there; the owner then publishes its partial too): CTA owner + c,
// for c < kFixupChunks, waits for all the tile's partials, adds chunk c of them (an eighth of the
// tile) in the owner's gather's order (the owner's first, then in CTA order: bitwise the same sums)
// and stores it through the epilogue from the fragment layout, with store_tile's operations per
// element. One SM reading every partial is bound by its share of L2 bandwidth; spread, each of
// kFixupChunks SMs reads a chunk. The chunk is a runtime index into the partials only, so the code
// is one copy: a copy per chunk, adding into the accumulators, slowed the kernels' other shapes.
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
    const float x = true_sum<Config>(v.x), y = true_sum<Config>(v.y);
    store_pair(e, m, n, p.n, epilogue_value(e, x, alpha, m, n, p.n, t.group),
               epilogue_value(e, y, alpha, m, n + 1, p.n, t.group));
  }
}

}  // namespace fp4_gemm::sm90
