// The Hopper GEMM engine: block-scaled A [M, K] x B [N, K]^T with exact in-kernel dequantization
// to bf16 and wgmma with float32 accumulation.
//
// One CTA computes a 128 x kBlockN tile with three warpgroups:
//   warpgroup 0  producer: one thread streams packed A, packed B and both scale tiles through a
//                ring of kStages shared-memory stages with TMA (mbarrier "full"/"empty" pairs);
//   warpgroups 1, 2  consumers, 64 rows of A each. Per 64-wide K tile they
//                - dequantize their A rows straight into wgmma register fragments,
//                - together dequantize the B tile into a bf16 tile in the 128-byte swizzle
//                  (three buffers rotate, so one barrier per K tile keeps them safe),
//                - issue four m64 x kBlockN x k16 wgmmas (A from registers, B from shared memory)
//                  and prepare the next K tile while those run.
//
// K order inside a tile. wgmma's register fragment gives thread q (= lane % 4) the K slots
// 16s + 2q + {0, 1, 8, 9} of k-step s. Summation order is free, so slot j holds element
// pi(j) = 16q + 4s + 2h + b (h = slot bit 3, b = slot bit 0) of the tile, for A and B alike: each
// thread's A elements over the tile are then 16 consecutive elements, one 8-byte (FP4) or 16-byte
// (FP8) load sharing a single block scale, and a B row's 16-byte swizzle chunk c gathers the
// bytes c, 8 + c, 16 + c, 24 + c of its packed row (FP4).
//
// Exactness: every element times its block scale is exact in bf16 (docs/FORMATS.md), so the
// result differs from the float64 reference only by float32 accumulation order.
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

namespace fp4_gemm::sm90 {

using Bf16x2 = __nv_bfloat162;

template <OperandFormat kA, OperandFormat kB, int kBlockN_>
struct EngineConfig {
  static constexpr OperandFormat kFormatA = kA;
  static constexpr OperandFormat kFormatB = kB;
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockK = 64;  // one 128-byte bf16 row of the swizzled B tile
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;

  static constexpr int kRowBytesA = kBlockK * element_bits(kA) / 8;
  static constexpr int kRowBytesB = kBlockK * element_bits(kB) / 8;
  static constexpr int kTileBytesA = kBlockM * kRowBytesA;
  static constexpr int kTileBytesB = kBlockN * kRowBytesB;
  static constexpr int kScaleBytesA = kSfTileBytes;  // the SfAtom column holding this K tile
  static constexpr int kScaleBytesB = kSfTileBytes * kBlockN / kSfTileRows;
  static constexpr int kStageBytes = kTileBytesA + kTileBytesB + kScaleBytesA + kScaleBytesB;
  static constexpr int kBf16TileBytes = kBlockN * kBlockK * 2;
  static constexpr int kBf16Tiles = 3;
  static constexpr int kMaxSmem = 227 * 1024;
  static constexpr int kBarrierBytes = 256;
  static constexpr int kStages =
      (kMaxSmem - kBf16Tiles * kBf16TileBytes - kBarrierBytes - 1024) / kStageBytes > 8
          ? 8
          : (kMaxSmem - kBf16Tiles * kBf16TileBytes - kBarrierBytes - 1024) / kStageBytes;
  static_assert(kStages >= 2, "the ring needs two stages");
  // + 1024: the dynamic shared memory base is only 16-byte aligned; the tiles need 1024.
  static constexpr int kSmemBytes = kBf16Tiles * kBf16TileBytes + kStages * kStageBytes + kBarrierBytes + 1024;

  // B rows per consumer thread and 16-byte bf16 chunks (of 8 per row) each thread converts.
  static constexpr int kThreadsPerRowB = kConsumerThreads / kBlockN;
  static constexpr int kChunksPerThread = 8 / kThreadsPerRowB;
  static_assert(kBlockN == 128 || kBlockN == 256, "tile widths 128 and 256");

  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
};

// Kernel arguments besides the two tensor maps (plain values: captured by CUDA graphs as is).
struct EngineParams {
  int64_t m, n, k;
  const uint8_t* sfa;
  const uint8_t* sfb;
  int64_t k_tiles;       // ceil(K / 64)
  int64_t sf_k_atoms;    // SfAtom columns per 128-row tile: ceil(nkb / 4)
  int64_t nkb;           // scale blocks per row
  int64_t sf_row_tiles_b;  // 128-row tiles of B's scale buffer
  GemmEpilogue epilogue;
};

// ---- operand decoding ---------------------------------------------------------------------------

// A block scale as a bf16 pair; blocks past the end of K (padding) read as 0, so whatever their
// bytes hold, the zero elements there stay zero.
template <OperandFormat kFormat>
__device__ __forceinline__ Bf16x2 scale_pair(uint8_t code, bool in_k) {
  if (!in_k) return __float2bfloat162_rn(0.0f);
  if constexpr (kFormat == OperandFormat::Mxfp8 || kFormat == OperandFormat::Mxfp4) {
    // 2^(code - 127) in bf16: the code is the exponent field; 0 is the subnormal 2^-127, 0xFF NaN.
    const uint16_t bits = code == 0 ? 0x0040 : code == 0xFF ? 0x7FC0 : uint16_t(code) << 7;
    return pair_from_bits<__nv_bfloat16>(uint32_t(bits) | (uint32_t(bits) << 16));
  } else {
    return __float2bfloat162_rn(ue4m3_decode(code));  // 4 significant bits: exact
  }
}

// Eight consecutive elements of a 4-bit operand (nibbles of `codes`) as four bf16 pairs.
template <OperandFormat kFormat>
__device__ __forceinline__ void decode_nibbles(uint32_t codes, Bf16x2 (&out)[4]) {
  if constexpr (kFormat == OperandFormat::E0m3) {
    dequant_e0m3x8<__nv_bfloat16>(codes, out);
  } else {
    dequant_e2m1x8<__nv_bfloat16>(codes, out);
  }
}

__device__ __forceinline__ uint32_t bf16x2_bits(Bf16x2 v) { return *reinterpret_cast<uint32_t*>(&v); }

// This thread's 16 A elements of one row of the K tile (elements 16q .. 16q + 15), scaled, as the
// eight bf16 pairs the fragment takes in order.
template <class Config>
__device__ __forceinline__ void load_a_row(const uint8_t* tile, const uint8_t* scales, int row, int q, int64_t kt,
                                           int64_t nkb, uint32_t (&pairs)[8]) {
  constexpr OperandFormat kFormat = Config::kFormatA;
  constexpr int kGroup = block_size(kFormat);
  const int64_t block = kt * (Config::kBlockK / kGroup) + (16 * q) / kGroup;
  const int sf_col = int(block % kSfTileCols);
  const Bf16x2 scale = scale_pair<kFormat>(scales[sf_offset(row, sf_col, 1)], block < nkb);
  Bf16x2 values[8];
  if constexpr (kFormat == OperandFormat::Mxfp8) {
    const uint4 bytes = *reinterpret_cast<const uint4*>(tile + row * Config::kRowBytesA + 16 * q);
    const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      Bf16x2 two[2];
      dequant_e4m3x4<__nv_bfloat16>(words[w], two);
      values[2 * w] = two[0];
      values[2 * w + 1] = two[1];
    }
  } else {
    const uint2 bytes = *reinterpret_cast<const uint2*>(tile + row * Config::kRowBytesA + 8 * q);
    Bf16x2 lo[4], hi[4];
    decode_nibbles<kFormat>(bytes.x, lo);
    decode_nibbles<kFormat>(bytes.y, hi);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      values[p] = lo[p];
      values[4 + p] = hi[p];
    }
  }
#pragma unroll
  for (int p = 0; p < 8; ++p) pairs[p] = bf16x2_bits(__hmul2(values[p], scale));
}

// The A fragments of one K tile: k-step s takes pairs 2s (columns 2q, 2q + 1) and 2s + 1
// (columns 2q + 8, 2q + 9) of rows g and g + 8.
template <class Config>
__device__ __forceinline__ void load_a_fragments(const uint8_t* tile, const uint8_t* scales, int warp_row, int lane,
                                                 int64_t kt, int64_t nkb, uint32_t (&frag)[4][4]) {
  const int q = lane % 4;
  const int row0 = warp_row + lane / 4;
  uint32_t top[8], bottom[8];
  load_a_row<Config>(tile, scales, row0, q, kt, nkb, top);
  load_a_row<Config>(tile, scales, row0 + 8, q, kt, nkb, bottom);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    frag[s][0] = top[2 * s];
    frag[s][1] = bottom[2 * s];
    frag[s][2] = top[2 * s + 1];
    frag[s][3] = bottom[2 * s + 1];
  }
}

// Converts this thread's share of the packed B tile into the swizzled bf16 tile: row `row`,
// chunks [first_chunk, first_chunk + kChunksPerThread). Chunk c of a row holds elements
// 16q + 4(c / 2) + 2(c % 2) + b for q = 0..3, b = 0..1, in that order (see the file comment).
template <class Config>
__device__ __forceinline__ void convert_b_row(const uint8_t* tile, const uint8_t* scales, uint8_t* bf16_tile, int row,
                                              int first_chunk, int64_t kt, int64_t nkb) {
  constexpr OperandFormat kFormat = Config::kFormatB;
  constexpr int kGroup = block_size(kFormat);
  constexpr int kWords = Config::kRowBytesB / 4;
  // Rotating the order of the 16-byte loads spreads a quarter-warp's rows over all banks.
  uint32_t words[kWords];
  const uint8_t* src = tile + row * Config::kRowBytesB;
  constexpr int kLoads = kWords / 4;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int part = (i + (kLoads == 2 ? (row >> 2) : (row >> 1))) % kLoads;
    const uint4 v = *reinterpret_cast<const uint4*>(src + 16 * part);
    words[4 * part] = v.x;
    words[4 * part + 1] = v.y;
    words[4 * part + 2] = v.z;
    words[4 * part + 3] = v.w;
  }
  // Scales of the row's blocks in this tile: q for 16-element blocks, q / 2 for 32-element ones.
  constexpr int kBlocks = Config::kBlockK / kGroup;
  Bf16x2 scale[kBlocks];
#pragma unroll
  for (int i = 0; i < kBlocks; ++i) {
    const int64_t block = kt * kBlocks + i;
    scale[i] = scale_pair<kFormat>(scales[sf_offset(row % kSfTileRows, block % kSfTileCols, 1) +
                                          (row / kSfTileRows) * kSfTileBytes],
                                   block < nkb);
  }
  uint8_t* dst_row = bf16_tile + (row / 8) * 1024 + (row % 8) * 128;
#pragma unroll
  for (int i = 0; i < Config::kChunksPerThread; ++i) {
    const int c = first_chunk + i;
    const int s = c / 2, h = c % 2;
    Bf16x2 v[4];
    if constexpr (kFormat == OperandFormat::Mxfp8) {
      // Element 16q + 4s + 2h + b is byte 2h + b of word 4q + s.
      const uint32_t select = h ? 0x7632 : 0x5410;
      Bf16x2 lo[2], hi[2];
      dequant_e4m3x4<__nv_bfloat16>(__byte_perm(words[s], words[4 + s], select), lo);
      dequant_e4m3x4<__nv_bfloat16>(__byte_perm(words[8 + s], words[12 + s], select), hi);
      v[0] = lo[0], v[1] = lo[1], v[2] = hi[0], v[3] = hi[1];
    } else {
      // Elements 16q + 4s + 2h + {0, 1} are byte 8q + c: byte c % 4 of word 2q + c / 4.
      const int byte = c % 4, word = c / 4;
      const uint32_t lo = __byte_perm(words[word], words[2 + word], byte | ((4 + byte) << 4));
      const uint32_t hi = __byte_perm(words[4 + word], words[6 + word], byte | ((4 + byte) << 4));
      decode_nibbles<kFormat>(__byte_perm(lo, hi, 0x5410), v);
    }
    uint4 out;
    uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int q = 0; q < 4; ++q) o[q] = bf16x2_bits(__hmul2(v[q], scale[(16 * q) / kGroup]));
    *reinterpret_cast<uint4*>(dst_row + ((c ^ (row % 8)) * 16)) = out;
  }
}

// ---- wgmma ----------------------------------------------------------------------------------------

template <int kBlockN>
struct Wgmma;
template <>
struct Wgmma<128> {
  using Op = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};
template <>
struct Wgmma<256> {
  using Op = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>;
};

template <int kBlockN, size_t... I>
__device__ __forceinline__ void wgmma_rs(const uint32_t (&a)[4], uint64_t desc_b, float (&acc)[kBlockN / 2],
                                         std::index_sequence<I...>) {
  Wgmma<kBlockN>::Op::fma(a[0], a[1], a[2], a[3], desc_b, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}

// Four k16 steps over one 64-wide K tile; the descriptor advances 32 bytes (16 elements) per step.
template <class Config>
__device__ __forceinline__ void issue_tile(const uint32_t (&frag)[4][4], const uint8_t* bf16_tile,
                                           float (&acc)[Config::kBlockN / 2]) {
  const uint64_t desc = sw128_descriptor(bf16_tile);
  pin_registers(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    wgmma_rs<Config::kBlockN>(frag[s], desc + uint64_t(2 * s), acc, std::make_index_sequence<Config::kBlockN / 2>{});
  }
  wgmma_commit();
  pin_registers(acc);
}

// ---- the kernel -----------------------------------------------------------------------------------

template <class Config>
struct SharedStorage {
  uint8_t* bf16_tiles;  // kBf16Tiles x kBf16TileBytes, 1024-byte aligned
  uint8_t* stages;      // kStages x kStageBytes: A, B, SFA, SFB
  uint64_t* full;
  uint64_t* empty;

  __device__ explicit SharedStorage(uint8_t* raw) {
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    bf16_tiles = base;
    stages = base + Config::kBf16Tiles * Config::kBf16TileBytes;
    full = reinterpret_cast<uint64_t*>(stages + Config::kStages * Config::kStageBytes);
    empty = full + Config::kStages;
  }
  __device__ uint8_t* a(int s) const { return stages + s * Config::kStageBytes; }
  __device__ uint8_t* b(int s) const { return a(s) + Config::kTileBytesA; }
  __device__ uint8_t* sfa(int s) const { return b(s) + Config::kTileBytesB; }
  __device__ uint8_t* sfb(int s) const { return sfa(s) + Config::kScaleBytesA; }
  __device__ uint8_t* bf16_tile(int64_t kt) const { return bf16_tiles + (kt % Config::kBf16Tiles) * Config::kBf16TileBytes; }
};

template <class Config>
__device__ __forceinline__ void produce(const SharedStorage<Config>& smem, const CUtensorMap* map_a,
                                        const CUtensorMap* map_b, const EngineParams& p, int64_t m0, int64_t n0) {
  // The scale column of K tile kt: 16-element blocks fill one SfAtom column per tile, 32-element
  // blocks one per two tiles.
  constexpr int kTilesPerAtom = kSfTileCols * block_size(Config::kFormatA) / Config::kBlockK;
  static_assert(block_size(Config::kFormatA) == block_size(Config::kFormatB), "one scale block size");
  const int64_t row_tile_a = m0 / kSfTileRows;
  const int64_t row_tile_b = n0 / kSfTileRows;
  const int64_t rows_left = p.sf_row_tiles_b - row_tile_b;
  const int b_row_tiles = int(rows_left < Config::kBlockN / kSfTileRows ? rows_left : Config::kBlockN / kSfTileRows);
  const uint32_t bytes = Config::kTileBytesA + Config::kTileBytesB + Config::kScaleBytesA + b_row_tiles * kSfTileBytes;
  for (int64_t kt = 0; kt < p.k_tiles; ++kt) {
    const int s = int(kt % Config::kStages);
    mbar_wait(&smem.empty[s], uint32_t((kt / Config::kStages) & 1) ^ 1);
    mbar_arrive_expect_tx(&smem.full[s], bytes);
    tma_load_2d(smem.a(s), map_a, &smem.full[s], int32_t(kt * Config::kRowBytesA), int32_t(m0));
    tma_load_2d(smem.b(s), map_b, &smem.full[s], int32_t(kt * Config::kRowBytesB), int32_t(n0));
    const int64_t atom = kt / kTilesPerAtom;
    bulk_load(smem.sfa(s), p.sfa + (row_tile_a * p.sf_k_atoms + atom) * kSfTileBytes, kSfTileBytes, &smem.full[s]);
    for (int r = 0; r < b_row_tiles; ++r) {
      bulk_load(smem.sfb(s) + r * kSfTileBytes, p.sfb + ((row_tile_b + r) * p.sf_k_atoms + atom) * kSfTileBytes,
                kSfTileBytes, &smem.full[s]);
    }
  }
}

template <class Config>
__device__ __forceinline__ void store_tile(const EngineParams& p, const float (&acc)[Config::kBlockN / 2], int64_t m0,
                                           int64_t n0, int warp_row, int lane) {
  const GemmEpilogue& e = p.epilogue;
  const float alpha = epilogue_alpha(e, 0);
#pragma unroll
  for (int i = 0; i < Config::kBlockN / 2; i += 2) {
    const int64_t m = m0 + warp_row + lane / 4 + 8 * ((i % 4) / 2);
    const int64_t n = n0 + 8 * (i / 4) + 2 * (lane % 4);
    if (m >= p.m || n >= p.n) continue;
    const float y0 = epilogue_value(e, acc[i], alpha, m, n, p.n, 0);
    const float y1 = n + 1 < p.n ? epilogue_value(e, acc[i + 1], alpha, m, n + 1, p.n, 0) : 0.0f;
    store_pair(e, m, n, p.n, y0, y1);
  }
}

template <class Config>
__device__ __forceinline__ void consume(const SharedStorage<Config>& smem, const EngineParams& p, int64_t m0,
                                        int64_t n0) {
  const int consumer = int(threadIdx.x) - 128;  // 0..255
  const int warp_row = (consumer / 32) * 16;    // the warp's 16 rows: warpgroup 1 rows 0..63, 2 rows 64..127
  const int lane = consumer % 32;
  const int b_row = consumer / Config::kThreadsPerRowB;
  const int b_first_chunk = (consumer % Config::kThreadsPerRowB) * Config::kChunksPerThread;

  float acc[Config::kBlockN / 2];
#pragma unroll
  for (int i = 0; i < Config::kBlockN / 2; ++i) acc[i] = 0.0f;
  uint32_t frag[2][4][4];

  // Waits for K tile kt, decodes it (A into registers, B into its bf16 tile), frees its stage,
  // and meets the other consumer warpgroup so the whole bf16 tile is written before any wgmma.
  const auto stage_in = [&](int64_t kt, uint32_t(&f)[4][4]) {
    const int s = int(kt % Config::kStages);
    mbar_wait(&smem.full[s], uint32_t((kt / Config::kStages) & 1));
    convert_b_row<Config>(smem.b(s), smem.sfb(s), smem.bf16_tile(kt), b_row, b_first_chunk, kt, p.nkb);
    load_a_fragments<Config>(smem.a(s), smem.sfa(s), warp_row, lane, kt, p.nkb, f);
    __syncwarp();
    if (lane == 0) mbar_arrive(&smem.empty[s]);
    fence_async_shared();
    named_barrier_sync(1, Config::kConsumerThreads);
  };

  // wgmma(kt) runs while tile kt + 1 is decoded; waiting with one group pending then retires
  // wgmma(kt - 1), which frees its fragment registers, and (at the next barrier, for both
  // warpgroups) the bf16 tile that kt + 2 overwrites.
  if (p.k_tiles > 0) {
    stage_in(0, frag[0]);
    issue_tile<Config>(frag[0], smem.bf16_tile(0), acc);
  }
  for (int64_t kt = 1; kt < p.k_tiles; kt += 2) {
    stage_in(kt, frag[1]);
    issue_tile<Config>(frag[1], smem.bf16_tile(kt), acc);
    wgmma_wait<1>();
    pin_registers(frag[0][0]), pin_registers(frag[0][1]), pin_registers(frag[0][2]), pin_registers(frag[0][3]);
    if (kt + 1 < p.k_tiles) {
      stage_in(kt + 1, frag[0]);
      issue_tile<Config>(frag[0], smem.bf16_tile(kt + 1), acc);
      wgmma_wait<1>();
      pin_registers(frag[1][0]), pin_registers(frag[1][1]), pin_registers(frag[1][2]), pin_registers(frag[1][3]);
    }
  }
  wgmma_wait<0>();
  pin_registers(acc);
  store_tile<Config>(p, acc, m0, n0, warp_row, lane);
}

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    engine_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                  const EngineParams p) {
  extern __shared__ uint8_t smem_raw[];
  const SharedStorage<Config> smem(smem_raw);
  const int64_t m0 = int64_t(blockIdx.x) * Config::kBlockM;
  const int64_t n0 = int64_t(blockIdx.y) * Config::kBlockN;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_a);
    prefetch_tensor_map(&map_b);
    for (int s = 0; s < Config::kStages; ++s) {
      mbar_init(&smem.full[s], 1);
      mbar_init(&smem.empty[s], Config::kConsumerThreads / 32);
    }
    mbar_init_fence();
  }
  __syncthreads();
  griddep_wait();
  griddep_launch_dependents();

  if (threadIdx.x < 128) {
    lower_registers<Config::kProducerRegisters>();
    if (threadIdx.x == 0) produce<Config>(smem, &map_a, &map_b, p, m0, n0);
  } else {
    raise_registers<Config::kConsumerRegisters>();
    consume<Config>(smem, p, m0, n0);
  }
}

}  // namespace fp4_gemm::sm90
