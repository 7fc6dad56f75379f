// The engine's epilogue store: a CTA's accumulators through shared memory to the output, with the
// epilogue (csrc/gemm/epilogue.cuh) applied per element.
#pragma once

#include <cstdint>

#include "csrc/common/ptx.cuh"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/sm90/config.cuh"

namespace fp4_gemm::sm90 {

// The epilogue. Accumulators go through shared memory (the bf16 tiles are free once both
// warpgroups retired their last wgmma; the ring is not, the producer may be filling it with the
// next tile), so that the global stores are wide and coalesced: stores from the fragment layout, or
// column pairs walked through the staging, pay bounds checks and 64-bit addressing per pair, which
// short stream-K pieces cannot hide. Only the tile's rows that its group owns are written (rows
// below m_end; contiguous groups: rows with the group's id).
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
  constexpr bool kColumnHalves = Config::kBlockM == 64;
  auto* staging = reinterpret_cast<T*>(smem.staging());
  const int warpgroup = consumer / 128, lane = consumer % 32;
  const int row0 = (kColumnHalves ? 0 : 64 * warpgroup) + ((consumer % 128) / 32) * 16 + lane / 4;
  const int col0 = (kColumnHalves ? warpgroup * Config::kWarpgroupN : 0) + 2 * (lane % 4);
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; i += 2) {
    const float x = true_sum<Config>(acc[i]), y = true_sum<Config>(acc[i + 1]);
    const int row = row0 + 8 * ((i % 4) / 2), col = col0 + 8 * (i / 4);
    *reinterpret_cast<uint32_t*>(staging + row * kStride + col) = pack_pair<T>(x * alpha, y * alpha);
  }
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
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
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
}

// Swapped roles (EngineConfig::kTransposedOut): the tile is out^T, rows = weight rows (out's
// columns), columns = activation rows (out's rows). Plain scaling into a 16-bit output whose rows
// (p.m elements: the weight's rows) are a multiple of eight: the tile lands transposed in the
// staging, then each thread copies 16-byte pieces of an output row (8 weight rows) out.
template <class Config, class T>
__device__ __forceinline__ void store_tile_transposed(const SharedStorage<Config>& smem, const EngineParams& p,
                                                      const float (&acc)[Config::kAccumulators], const WorkTile& t,
                                                      int consumer, float alpha) {
  static_assert(Config::kBlockM == 128, "a swapped tile has 128 weight rows");
  constexpr int kStride = Config::kTransposedStride;  // T elements per staged output row
  static_assert(Config::kTransposedStagingBytes <= Config::kRegionBytes, "the staging holds the tile");
  constexpr int kOctetsPerRow = Config::kBlockM / 8;
  constexpr int kRowsPerPass = Config::kConsumerThreads / kOctetsPerRow;
  auto* staging = reinterpret_cast<T*>(smem.staging());
  const int warpgroup = consumer / 128, lane = consumer % 32;
  const int row0 = 64 * warpgroup + ((consumer % 128) / 32) * 16 + lane / 4;  // weight row in the tile
  const int col0 = 2 * (lane % 4);                                            // activation row in the tile
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; i += 2) {
    const int row = row0 + 8 * ((i % 4) / 2), col = col0 + 8 * (i / 4);
    const float x = true_sum<Config>(acc[i]), y = true_sum<Config>(acc[i + 1]);
    const uint32_t two = pack_pair<T>(x * alpha, y * alpha);
    reinterpret_cast<uint16_t*>(staging)[col * kStride + row] = uint16_t(two & 0xFFFFu);
    reinterpret_cast<uint16_t*>(staging)[(col + 1) * kStride + row] = uint16_t(two >> 16);
  }
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
  const int piece = 8 * (consumer % kOctetsPerRow);  // 8 weight rows: 16 bytes of an output row
  const int64_t column = t.m0 + piece;             // out's column
  const int64_t out_rows = p.n - t.n0 < Config::kBlockN ? p.n - t.n0 : Config::kBlockN;
  if (column < p.m) {
    T* out = static_cast<T*>(p.epilogue.out) + column;
#pragma unroll 4
    for (int r = consumer / kOctetsPerRow; r < out_rows; r += kRowsPerPass) {
      const uint4 v = *reinterpret_cast<const uint4*>(staging + r * kStride + piece);
      store_b32x4(out + (t.n0 + r) * p.m, v.x, v.y, v.z, v.w);
    }
  }
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
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
  if constexpr (Config::kTransposedOut) {  // sm90_swap_ab serves plain 16-bit outputs only
    if (e.out_format == OutFormat::Fp16) return store_tile_transposed<Config, __half>(smem, p, acc, t, consumer, alpha);
    return store_tile_transposed<Config, __nv_bfloat16>(smem, p, acc, t, consumer, alpha);
  }
  const int64_t m_end = t.m_end < p.m ? t.m_end : p.m;
  // Plain scaling (the common case) skips the per-element bias, residual and activation tests.
  const bool plain = e.bias == nullptr && e.residual == nullptr && e.activation == Activation::None;
  if (plain && octet_stores(e, p.n)) {
    if (e.out_format == OutFormat::Fp16) return store_tile_16bit<Config, __half>(smem, p, acc, t, consumer, alpha);
    return store_tile_16bit<Config, __nv_bfloat16>(smem, p, acc, t, consumer, alpha);
  }
  constexpr int kQuadsPerRow = Config::kBlockN / 4;
  constexpr int kRowsPerPass = Config::kConsumerThreads / kQuadsPerRow;
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
        y[j] = true_sum<Config>(y[j]);
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
    ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
    if (kColumnHalves || warpgroup == half) {
#pragma unroll
      for (int i = 0; i < Config::kAccumulators; i += 2) {
        const int row = warp_row + lane / 4 + 8 * ((i % 4) / 2);
        const int col = col0 + 8 * (i / 4) + 2 * (lane % 4);
        *reinterpret_cast<float2*>(staging + row * Config::kStagingStride + col) = make_float2(acc[i], acc[i + 1]);
      }
    }
    ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
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
  ptx::named_barrier_sync(kConsumerBarrier, Config::kConsumerThreads);
}

}  // namespace fp4_gemm::sm90
