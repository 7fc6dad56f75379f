// The Hopper engine's compile-time configuration (EngineConfig: tile, operands, warp roles, shared
// memory, registers), its kernel arguments (EngineParams), the CTA's shared memory (SharedStorage)
// and what every role shares: the scheduler type and the warp's arrive. kernel.cuh has the design.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "csrc/common/formats.cuh"
#include "csrc/common/ptx.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/grouping.cuh"
#include "csrc/gemm/operand_codec.cuh"
#include "csrc/gemm/problem.h"
#include "csrc/gemm/sm90/scheduler.cuh"

namespace fp4_gemm::sm90 {

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
  // Swapped roles (W4A16 at few rows, the sm90_swap_ab backend): A is the packed weight, decoded into
  // the register fragments, and B the bf16 activations, which TMA delivers; the tile computes out^T,
  // so the epilogue writes it transposed (store_tile_transposed).
  static constexpr bool kTransposedOut = !kBf16A && kB == OperandFormat::Bf16;
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
  static constexpr int kFixupOctets = kOctets >= kFixupChunks ? kOctets / kFixupChunks : 1;  // swapped tiles: unused
  static constexpr int kBlockK = 64;  // one 128-byte bf16 row of the swizzled B tile
  static constexpr int kConsumerThreads = 256;
  // Dense 256-wide tiles with a packed B (128 or 64 rows) have a decoder warpgroup (kDecodeWarps):
  // it decodes all of B into the rotating bf16 tiles, running ahead of the consumers (mbarriers
  // hand the tiles over and back), and the consumers decode only A into fragments and issue the
  // wgmmas: in the consumers' own instruction stream the decode and the wgmmas hardly overlapped
  // (docs/PERFORMANCE.md, kDecodeWarps).
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
  // A swapped tile is staged transposed, in 16-bit values: kBlockN rows of kTransposedStride.
  static constexpr int kTransposedStride = kBlockM + 8;
  static constexpr int kTransposedStagingBytes = kTransposedOut ? kBlockN * kTransposedStride * 2 : 0;
  static constexpr int kStagingBytes =
      kTransposedStagingBytes > 64 * kStagingStride * 4 ? kTransposedStagingBytes : 64 * kStagingStride * 4;
  static constexpr int kRegionBytes =
      round_up(kBf16Tiles * kBf16TileBytes > kStagingBytes ? kBf16Tiles * kBf16TileBytes : kStagingBytes, 1024);
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
  static constexpr int kThreadsPerRowB = kConsumerThreads / (kBlockN < 128 ? 128 : kBlockN);  // < 128: bf16 B, unused
  static constexpr int kChunksPerThread = 8 / kThreadsPerRowB;
  static_assert(!kDecodeWarps || 2 * kDecoderThreads == kBlockN, "two B rows a decode thread");
  static_assert(kBlockN == 128 || kBlockN == 256 || (kTransposedOut && (kBlockN == 16 || kBlockN == 32 || kBlockN == 64)),
                "tile widths 128 and 256 (16, 32, 64: activation rows of a swapped tile)");

  // A decoded operand value is its true value times 2^-kValueExponent: its codec's unbias
  // (operand_codec.cuh; NVFP4 2^-7), or none for B dequantized into bf16 ahead of the kernel. The
  // epilogue multiplies the accumulators by 2^(kValueExponentA + kValueExponentB), exactly.
  static constexpr int kValueExponentA = OperandCodec<kA>::kUnbiasExponent;
  static constexpr int kValueExponentB = kPackedB ? OperandCodec<kB>::kUnbiasExponent : 0;
  // The register-fragment K loop unrolled twice (two fragment buffers alternating, no moves), where
  // that is faster: not for MXFP8, whose larger loop body is slower unrolled, nor for E0M3 weights
  // (not measured; docs/PERFORMANCE.md, kAlternatingFragments).
  static constexpr bool kAlternatingFragments = kA != OperandFormat::Mxfp8 && kB != OperandFormat::E0m3;
  static_assert(!kBf16A || kB == OperandFormat::Bf16 || kB == OperandFormat::Nvfp4 || kB == OperandFormat::Mxfp4,
                "bf16 activations pair with 4-bit weights (the fragment order of a packed B) or bf16 weights");

  // The CTA's 384 x 168 registers, shifted to the consumers (setmaxnreg). A grouped producer walks
  // the groups and addresses up to five scale atoms per stage: it gets 16 more (at 40 it spilled in
  // its K loop); dense consumers keep 232 (fewer slowed the K loop: docs/PERFORMANCE.md).
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

// A sum of products of decoded operands as the sum of the true products: times
// 2^(kValueExponentA + kValueExponentB), exactly (a power of two).
template <class Config>
__device__ __forceinline__ float true_sum(float acc) {
  constexpr int kExponent = Config::kValueExponentA + Config::kValueExponentB;
  if constexpr (kExponent > 0) {
    return acc * exp2i(kExponent);
  } else {
    return acc;
  }
}

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
    uint8_t* base = raw + ((1024 - (ptx::smem_addr(raw) & 1023)) & 1023);
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

template <class Config>
using EngineScheduler = Scheduler<Config::kGrouping, Config::kBlockM, Config::kBlockN>;

// One arrive of this warp on `barrier` (a pointer or a shared-memory address), once every lane is
// done with what it guards.
template <class Barrier>
__device__ __forceinline__ void warp_arrive(Barrier barrier, int lane) {
  __syncwarp();
  if (lane == 0) ptx::mbar_arrive(barrier);
}

// A ring stage's `empty` barrier counts every lane of its readers (32 a warp): each lane's own
// release covers its own reads of the stage, with no warp barrier in between.
constexpr int kStageArrivalsPerWarp = 32;

}  // namespace fp4_gemm::sm90
