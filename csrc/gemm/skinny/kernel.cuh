// The skinny GEMM kernel (M <= 16): out = epilogue(A @ B^T) for a handful of activation rows A
// against a weight B streamed once from memory (docs/API.md, "Decode and speculative-verify
// kernels").
//
// Shape of the work. The MMA runs with A and B swapped: 16 weight rows form the mma's M side and
// 8 activation rows (tokens) its N side, so M <= 8 needs one mma per 16 x 16 weight piece and
// M <= 16 two. A *slab* is 64 stored bytes of a row (128 4-bit or 64 8-bit elements); a *unit* is
// 32 weight rows (two mma tiles) x one slab. A block owns `kRowTiles` tiles of 16 rows and the slabs
// of one K split; its units (slab-major) are divided evenly among its warps. Each warp streams its
// units through a `stages`-deep cp.async ring in shared memory, keeps the activation fragments of
// the current slab in registers (decoded once per slab, used by every unit of it), and accumulates
// one float32 fragment per tile.
//
// Inside a unit, lane (g, t) copies chunk t (16 bytes) of rows g, g + 8, g + 16, g + 24; reading
// back, lane t takes word t of each chunk j, so that every mma step draws its 16 k-slots from one
// chunk (one MX block or half of one). Chunk positions in a row are XOR-swizzled by (row / 2) % 4,
// which makes both the 16-byte copies and the 4-byte reads bank-conflict free.
//
// Reduction, in a fixed order: the warps' fragments are summed in shared memory in warp order; with
// one K split that sum gets the epilogue and is stored; with S splits each block writes its sum to a
// float32 scratch and bumps a per-row-group counter (zeroed before the launch), and the block that
// arrives last sums the S partials in split order, applies the epilogue and stores. Results are
// therefore bitwise equal run to run and under CUDA-graph replay.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/common/types.h"
#include "csrc/gemm/problem.h"
#include "csrc/gemm/skinny/operands.cuh"
#include "csrc/gemm/skinny/primitives.cuh"

namespace fp4_gemm::skinny {

constexpr int kTileRows = 16;      // weight rows of one mma
constexpr int kTileTokens = 8;     // activation rows of one mma
constexpr int kMaxTokens = 16;     // the tier: M <= 16 (two token tiles)
constexpr int kUnitTiles = 2;
constexpr int kUnitRows = kUnitTiles * kTileRows;
constexpr int kChunkBytes = 16;    // one lane's copy: a quarter of a slab row
constexpr int kSlabChunks = 4;     // one chunk per lane of a quad
constexpr int kChunkWords = kChunkBytes / 4;
constexpr int kSlabBytes = kSlabChunks * kChunkBytes;
constexpr int kScaleWords = 2;     // scale-code words per row and slab (NVFP4, E0M3: 8 blocks)
constexpr int kSlotDataBytes = kUnitRows * kSlabBytes;
constexpr int kSlotBytes = kSlotDataBytes + kUnitRows * kScaleWords * 4;
constexpr int kBlockFragments = 8;  // row tiles x token tiles per block: 32 accumulators per lane
constexpr int kReductionBytes = kBlockFragments * kTileRows * kTileTokens * 4;  // one warp's fragments
constexpr int kMaxWarps = 8;
constexpr int kMaxStages = 8;

struct SkinnyArgs {
  const uint8_t* a;    // [m, row_bytes]
  const uint8_t* sfa;  // SfAtom scales of the m rows
  const uint8_t* b;    // [n, row_bytes], row-major or the streaming layout
  const uint8_t* sfb;  // SfAtom scales of the n rows
  int m;
  int n;
  int64_t row_bytes;     // stored bytes of one row (A and B alike)
  int64_t chunks;        // 16-byte chunks per row
  int64_t slabs;         // ceil(chunks / 4)
  int64_t scale_blocks;  // K / block size
  int64_t scale_k_tiles;
  // B's layout as strides: chunk c of row n lies at (n / 8) * eighth_stride + (c / 4) * slab_stride
  // + chunk_lane_offset(n % 8, c % 4).
  int64_t eighth_stride;
  int64_t slab_stride;
  int splits;
  int stages;
  int region_bytes;  // shared memory of one warp: its ring, later its reduction fragments
  // epilogue (problem.h): out = act(alpha_scale * alpha[0] * acc + bias + residual)
  const float* alpha;
  float alpha_scale;
  const void* bias;
  FloatType bias_type;
  const void* residual;
  Activation activation;
  void* out;
  OutFormat out_format;
  // split-K scratch (splits > 1): one counter per row group (0 at launch), partials [S, m, n]
  int32_t* counters;
  float* partials;
};

__device__ __forceinline__ float load_float(const void* p, FloatType type, int64_t i) {
  switch (type) {
    case FloatType::Bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case FloatType::Fp16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// alpha * acc + bias + residual, then the activation, in float32 (docs/FORMATS.md, "GEMM result").
__device__ __forceinline__ float epilogue(const SkinnyArgs& args, float acc, float alpha, int row, int n) {
  float y = acc * alpha;
  if (args.bias != nullptr) y += load_float(args.bias, args.bias_type, n);
  const FloatType out_type = args.out_format == OutFormat::Bf16 ? FloatType::Bf16 : FloatType::Fp16;
  if (args.residual != nullptr) y += load_float(args.residual, out_type, int64_t(row) * args.n + n);
  if (args.activation == Activation::Gelu) {
    y = 0.5f * y * erfcf(-y * 0.70710678118654752f);  // the erf GELU through erfc, as the reference
  } else if (args.activation == Activation::Relu2) {
    const float r = y > 0.0f || y != y ? y : 0.0f;  // NaN stays NaN
    y = r * r;
  }
  return y;
}

__device__ __forceinline__ void store_output(const SkinnyArgs& args, int row, int n, float y) {
  const int64_t i = int64_t(row) * args.n + n;
  if (args.out_format == OutFormat::Bf16) {
    static_cast<__nv_bfloat16*>(args.out)[i] = __float2bfloat16_rn(y);
  } else {
    static_cast<__half*>(args.out)[i] = __float2half_rn(y);
  }
}

// The part of a chunk's byte offset that depends on its row within an eighth (r = n % 8) and its
// position within a slab (c = chunk % 4). Row-major: eighth_stride = 8 * row_bytes, slab_stride = 64.
// Streaming layout (tiles of 8 rows x 32 bytes, K-tile fastest; reference.interleave_rows):
// eighth_stride = (K / 64) * 256, slab_stride = 512 (two tiles).
template <bool kInterleaved>
__device__ __forceinline__ int64_t chunk_lane_offset(const SkinnyArgs& args, int r, int c) {
  if constexpr (kInterleaved) {
    return (c >> 1) * 256 + r * 32 + (c & 1) * kChunkBytes;
  } else {
    return r * args.row_bytes + c * kChunkBytes;
  }
}

template <OperandFormat kA, OperandFormat kB, int kTokenTiles, bool kInterleaved>
struct SkinnyKernel {
  using WordA = OperandWord<kA>;
  using WordB = OperandWord<kB>;
  static_assert(WordA::kPairs == WordB::kPairs && WordA::kScaleFolded == WordB::kScaleFolded,
                "A and B must share element width and scale kind");
  static constexpr int kPairs = WordB::kPairs;
  static constexpr int kSteps = WordB::kSteps;
  static constexpr bool kFolded = WordB::kScaleFolded;
  static constexpr int kRowTiles = kBlockFragments / kTokenTiles;
  static constexpr int kSlabUnits = kRowTiles / kUnitTiles;
  static constexpr int kBlockRows = kRowTiles * kTileRows;
  static constexpr int kTokens = kTokenTiles * kTileTokens;
  static constexpr int kSlabElements = kSlabBytes * 8 / element_bits(kB);
  static constexpr int kSlabBlocks = kSlabElements / block_size(kB);  // 8 (NVFP4, E0M3), 4 (MXFP4), 2 (MXFP8)
  static constexpr int kChunksPerMxBlock = kSlabChunks / (kFolded ? kSlabChunks : kSlabBlocks);
  static constexpr int kActivationScaleWords = 2;  // folded: token g's two words; MX: tokens 2t, 2t+1

  // The activation operand of one slab, as this lane feeds it to the mma: token tile tt's column g
  // (token tt * 8 + g), word t of each chunk j. MX: the float32 block scales of the two tokens whose
  // accumulators this lane holds (tt * 8 + 2t + e).
  struct ActivationSlab {
    uint32_t pairs[kTokenTiles][kSlabChunks][kPairs];
    float factor[kTokenTiles][2][kFolded ? 1 : kSlabBlocks];
  };

  // The stored bytes behind an ActivationSlab, loaded one slab ahead.
  struct RawActivation {
    uint32_t words[kTokenTiles][kSlabChunks];
    uint32_t scales[kTokenTiles][kActivationScaleWords];
  };

  // First scale block of the slab's scale-code word q (words are 4-block aligned in SfAtom).
  __device__ __forceinline__ static int64_t scale_word_block(int64_t slab, int q) {
    return kFolded ? slab * kSlabBlocks + 4 * q : (slab * kSlabBlocks) & ~int64_t{3};
  }

  __device__ __forceinline__ static uint32_t load_word(const uint8_t* p) {
    return __ldg(reinterpret_cast<const uint32_t*>(p));
  }

  __device__ __forceinline__ static void load_activation(const SkinnyArgs& args, int64_t slab, int g, int t,
                                                         RawActivation& raw) {
#pragma unroll
    for (int tt = 0; tt < kTokenTiles; ++tt) {
      const int token = tt * kTileTokens + g;
#pragma unroll
      for (int j = 0; j < kSlabChunks; ++j) {
        const int64_t c = slab * kSlabChunks + j;
        const bool valid = token < args.m && c < args.chunks;
        raw.words[tt][j] = valid ? load_word(args.a + token * args.row_bytes + c * kChunkBytes + 4 * t) : 0u;
      }
#pragma unroll
      for (int q = 0; q < kActivationScaleWords; ++q) {
        const int row = kFolded ? token : tt * kTileTokens + 2 * t + q;
        const int64_t block = scale_word_block(slab, kFolded ? q : 0);
        const bool valid = row < args.m && block < args.scale_blocks;
        raw.scales[tt][q] = valid ? load_word(args.sfa + sf_offset(row, block, args.scale_k_tiles)) : 0u;
      }
    }
  }

  __device__ __forceinline__ static void decode_activation(const SkinnyArgs& args, int64_t slab, int t,
                                                           const RawActivation& raw, ActivationSlab& act) {
#pragma unroll
    for (int tt = 0; tt < kTokenTiles; ++tt) {
      __half2 scale[kSlabChunks];
      if constexpr (kFolded) {
        // word t of chunk j lies in block 2j + t / 2 of the slab: byte 2 (j % 2) + t / 2 of word j / 2
#pragma unroll
        for (int q = 0; q < kScaleWords; ++q) {
          const uint32_t codes = valid_scale_codes(raw.scales[tt][q], scale_word_block(slab, q), args.scale_blocks);
          __half2 two[2];
          ue4m3_scale_pairs(codes, t >> 1, 2 + (t >> 1), two);
          scale[2 * q] = two[0];
          scale[2 * q + 1] = two[1];
        }
      } else {
        const int first = static_cast<int>((slab * kSlabBlocks) & 3);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t codes = valid_scale_codes(raw.scales[tt][e], scale_word_block(slab, 0), args.scale_blocks);
#pragma unroll
          for (int b = 0; b < kSlabBlocks; ++b) act.factor[tt][e][b] = ue8m0_decode(uint8_t(codes >> (8 * (first + b))));
        }
      }
#pragma unroll
      for (int j = 0; j < kSlabChunks; ++j) {
        WordA::decode(raw.words[tt][j], act.pairs[tt][j]);
        if constexpr (kFolded) fold_scale(act.pairs[tt][j], scale[j]);
      }
    }
  }

  // Where this lane's share of the next unit's copy comes from, advanced unit by unit. A lane copies
  // chunk t of rows g + 8h (h < 4) and the scale-code words (row g + 8 (t % 2) + 16e, word t / 2)
  // for e < 2. Rows at or beyond N, chunks beyond K and scale words beyond K are zero-filled.
  // sf_offset is additive in its row and block parts, so the block part is kept per slab.
  struct CopyCursor {
    const uint8_t* slab_data;  // this lane's chunk of row g of the slab's first unit
    const uint8_t* data;       // ... of the current unit
    int64_t slab;
    int unit;                  // within the slab
    int row;                   // first row of the current unit
    bool chunk_valid;          // this lane's chunk lies within K
    bool scale_valid;          // this lane's scale words hold blocks within K
    int64_t scale_k_offset;    // sf_offset(0, first block of this lane's scale words)

    __device__ __forceinline__ void enter_slab(const SkinnyArgs& args, int64_t s, int t) {
      slab = s;
      chunk_valid = s * kSlabChunks + t < args.chunks;
      const int64_t block = scale_word_block(s, t >> 1);
      scale_valid = (kFolded || t < 2) && block < args.scale_blocks;
      scale_k_offset = sf_offset(0, uint32_t(block), args.scale_k_tiles);
    }
  };

  __device__ __forceinline__ static void copy_unit(const SkinnyArgs& args, const CopyCursor& cursor, uint8_t* slot,
                                                   int g, int t) {
    const int swizzled = (t ^ ((g >> 1) & 3)) * kChunkBytes;
#pragma unroll
    for (int h = 0; h < kUnitRows / 8; ++h) {
      const bool valid = cursor.chunk_valid && cursor.row + g + 8 * h < args.n;
      copy_async_16(slot + (g + 8 * h) * kSlabBytes + swizzled, valid ? cursor.data + h * args.eighth_stride : args.b,
                    valid);
    }
#pragma unroll
    for (int e = 0; e < kUnitRows / 16; ++e) {
      const int r = g + 8 * (t & 1) + 16 * e;
      const int n = cursor.row + r;
      const bool valid = cursor.scale_valid && n < args.n;
      const uint8_t* src =
          valid ? args.sfb + sf_offset(uint32_t(n), 0, args.scale_k_tiles) + cursor.scale_k_offset : args.sfb;
      copy_async_4(slot + kSlotDataBytes + (r * kScaleWords + (t >> 1)) * 4, src, valid);
    }
  }

  // One unit: for its two tiles, acc[tile][tt] += B(16 rows, slab) x act(tt)^T. `scale_masks`: the
  // slab's valid_scale_codes masks of its two scale words (K padding zeroed); `mx_first`: the byte of
  // an MX scale word that holds the slab's first block (2 for MXFP8's odd slabs, else 0).
  __device__ __forceinline__ static void compute_unit(const uint8_t* slot, const uint32_t (&scale_masks)[2],
                                                      int mx_first, int g, int t, const ActivationSlab& act,
                                                      float (&acc)[kUnitTiles][kTokenTiles][4]) {
    const uint32_t* data = reinterpret_cast<const uint32_t*>(slot);
    const uint2* scale_codes = reinterpret_cast<const uint2*>(slot + kSlotDataBytes);
    const int swizzle = (g >> 1) & 3;
#pragma unroll
    for (int ut = 0; ut < kUnitTiles; ++ut) {
      const int rows[2] = {ut * kTileRows + g, ut * kTileRows + g + 8};
      __half2 scale[2][kSlabChunks];               // folded: the block scale of word t of chunk j, per row
      float factor[2][kFolded ? 1 : kSlabBlocks];  // MX: 2^e per row and block
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint2 codes = scale_codes[rows[half]];
        if constexpr (kFolded) {
          const uint32_t words[kScaleWords] = {codes.x & scale_masks[0], codes.y & scale_masks[1]};
#pragma unroll
          for (int q = 0; q < kScaleWords; ++q) {
            __half2 two[2];
            ue4m3_scale_pairs(words[q], t >> 1, 2 + (t >> 1), two);
            scale[half][2 * q] = two[0];
            scale[half][2 * q + 1] = two[1];
          }
        } else {
          const uint32_t word = codes.x & scale_masks[0];
#pragma unroll
          for (int b = 0; b < kSlabBlocks; ++b) factor[half][b] = ue8m0_decode(uint8_t(word >> (8 * (mx_first + b))));
        }
      }

      float part[kTokenTiles][4] = {};  // MX: one block's sum before its scales
#pragma unroll
      for (int j = 0; j < kSlabChunks; ++j) {
        uint32_t w[2][kPairs];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          WordB::decode(data[rows[half] * (kSlabBytes / 4) + (j ^ swizzle) * kChunkWords + t], w[half]);
          if constexpr (kFolded) fold_scale(w[half], scale[half][j]);
        }
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          const uint32_t a_frag[4] = {w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1]};
#pragma unroll
          for (int tt = 0; tt < kTokenTiles; ++tt) {
            const uint32_t b_frag[2] = {act.pairs[tt][j][2 * s], act.pairs[tt][j][2 * s + 1]};
            mma_16x8x16(kFolded ? acc[ut][tt] : part[tt], a_frag, b_frag);
          }
        }
        if constexpr (!kFolded) {
          if ((j + 1) % kChunksPerMxBlock == 0) {
            // acc += (partial * 2^e_token) * 2^e_row: both factors are powers of two (exact while in range)
            const int b = j / kChunksPerMxBlock;
#pragma unroll
            for (int tt = 0; tt < kTokenTiles; ++tt) {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                acc[ut][tt][i] = fmaf(part[tt][i] * act.factor[tt][i & 1][b], factor[i >> 1][b], acc[ut][tt][i]);
                part[tt][i] = 0.0f;
              }
            }
          }
        }
      }
    }
  }

  // The block's sum for (row r of the row group, token), from the warps' fragments in warp order.
  __device__ __forceinline__ static float block_sum(const uint8_t* smem, int region_bytes, int warps, int r, int token) {
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) {
      const float v = reinterpret_cast<const float*>(smem + w * region_bytes)[r * kTokens + token];
      sum = w == 0 ? v : sum + v;
    }
    return sum;
  }

  __device__ static void run(const SkinnyArgs& args) {
    griddep_wait();
    griddep_launch_dependents();
    extern __shared__ __align__(16) uint8_t smem[];
    const int warps = blockDim.x / 32;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4;
    const int t = lane % 4;
    uint8_t* ring = smem + warp * args.region_bytes;
    const int block_row = int(blockIdx.x) * kBlockRows;
    const int split = blockIdx.y;
    const int64_t slab_begin = split * args.slabs / args.splits;
    const int64_t slab_end = (split + 1) * args.slabs / args.splits;
    const int units = int(slab_end - slab_begin) * kSlabUnits;
    const int unit_begin = int(int64_t(warp) * units / warps);
    const int unit_end = int(int64_t(warp + 1) * units / warps);
    const int stages = args.stages;

    // The copy cursor starts at this warp's first unit; units go to ring slots in turn.
    const uint8_t* lane_data =
        args.b + int64_t(block_row / 8) * args.eighth_stride + chunk_lane_offset<kInterleaved>(args, g, t);
    const int64_t unit_stride = (kUnitRows / 8) * args.eighth_stride;
    CopyCursor cursor;
    cursor.enter_slab(args, slab_begin + unit_begin / kSlabUnits, t);
    cursor.unit = unit_begin % kSlabUnits;
    cursor.row = block_row + cursor.unit * kUnitRows;
    cursor.slab_data = lane_data + cursor.slab * args.slab_stride;
    cursor.data = cursor.slab_data + cursor.unit * unit_stride;
    int copies_left = unit_end - unit_begin;
    int copy_slot = 0;
    const auto issue = [&]() {
      if (copies_left > 0) {
        copy_unit(args, cursor, ring + copy_slot * kSlotBytes, g, t);
        --copies_left;
        copy_slot = copy_slot + 1 == stages ? 0 : copy_slot + 1;
        if (++cursor.unit < kSlabUnits) {
          cursor.data += unit_stride;
          cursor.row += kUnitRows;
        } else {
          cursor.enter_slab(args, cursor.slab + 1, t);
          cursor.unit = 0;
          cursor.row = block_row;
          cursor.slab_data += args.slab_stride;
          cursor.data = cursor.slab_data;
        }
      }
      copy_async_commit();  // empty groups keep the group count of every iteration the same
    };

    float acc[kSlabUnits][kUnitTiles][kTokenTiles][4] = {};
    if (unit_end > unit_begin) {
      RawActivation raw;
      ActivationSlab act;
      const int64_t first_slab = slab_begin + unit_begin / kSlabUnits;
      const int64_t last_slab = slab_begin + (unit_end - 1) / kSlabUnits;
      load_activation(args, first_slab, g, t, raw);
      for (int i = 0; i < stages - 1; ++i) issue();
      int read_slot = 0;
      for (int64_t slab = first_slab; slab <= last_slab; ++slab) {
        decode_activation(args, slab, t, raw, act);
        if (slab < last_slab) load_activation(args, slab + 1, g, t, raw);
        const uint32_t scale_masks[2] = {valid_scale_codes(~0u, scale_word_block(slab, 0), args.scale_blocks),
                                         valid_scale_codes(~0u, scale_word_block(slab, 1), args.scale_blocks)};
        const int mx_first = int((slab * kSlabBlocks) & 3);
#pragma unroll
        for (int u = 0; u < kSlabUnits; ++u) {
          const int unit = int(slab - slab_begin) * kSlabUnits + u;
          if (unit >= unit_begin && unit < unit_end) {  // warp-uniform
            issue();
            copy_async_wait(stages - 1);
            __syncwarp();  // every lane's copies of this unit have landed
            compute_unit(ring + read_slot * kSlotBytes, scale_masks, mx_first, g, t, act, acc[u]);
            __syncwarp();  // every lane is done with the slot before it is refilled
            read_slot = read_slot + 1 == stages ? 0 : read_slot + 1;
          }
        }
      }
    }
    copy_async_wait(0);
    __syncwarp();

    // This warp's fragments -> its own region (the ring is drained), then the block sum.
    float* red = reinterpret_cast<float*>(ring);
#pragma unroll
    for (int u = 0; u < kSlabUnits; ++u) {
#pragma unroll
      for (int ut = 0; ut < kUnitTiles; ++ut) {
#pragma unroll
        for (int tt = 0; tt < kTokenTiles; ++tt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = (u * kUnitTiles + ut) * kTileRows + g + 8 * (e >> 1);
            red[r * kTokens + tt * kTileTokens + 2 * t + (e & 1)] = acc[u][ut][tt][e];
          }
        }
      }
    }
    __syncthreads();

    const float alpha = args.alpha_scale * (args.alpha != nullptr ? *args.alpha : 1.0f);
    const int outputs = kBlockRows * args.m;
    if (args.splits == 1) {
      for (int o = threadIdx.x; o < outputs; o += blockDim.x) {
        const int token = o / kBlockRows;
        const int r = o % kBlockRows;
        const int n = block_row + r;
        if (n < args.n) {
          const float sum = block_sum(smem, args.region_bytes, warps, r, token);
          store_output(args, token, n, epilogue(args, sum, alpha, token, n));
        }
      }
      return;
    }

    for (int o = threadIdx.x; o < outputs; o += blockDim.x) {
      const int token = o / kBlockRows;
      const int r = o % kBlockRows;
      const int n = block_row + r;
      if (n < args.n) {
        args.partials[(int64_t(split) * args.m + token) * args.n + n] = block_sum(smem, args.region_bytes, warps, r, token);
      }
    }
    // The last of the row group's S blocks (in arrival order) reduces all S partials in split order.
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&args.counters[blockIdx.x], 1) == args.splits - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int o = threadIdx.x; o < outputs; o += blockDim.x) {
      const int token = o / kBlockRows;
      const int r = o % kBlockRows;
      const int n = block_row + r;
      if (n < args.n) {
        float sum = __ldcg(&args.partials[int64_t(token) * args.n + n]);
        for (int s = 1; s < args.splits; ++s) sum += __ldcg(&args.partials[(int64_t(s) * args.m + token) * args.n + n]);
        store_output(args, token, n, epilogue(args, sum, alpha, token, n));
      }
    }
  }
};

template <OperandFormat kA, OperandFormat kB, int kTokenTiles, bool kInterleaved>
__global__ void __launch_bounds__(kMaxWarps * 32) skinny_gemm_kernel(SkinnyArgs args) {
  SkinnyKernel<kA, kB, kTokenTiles, kInterleaved>::run(args);
}

}  // namespace fp4_gemm::skinny
