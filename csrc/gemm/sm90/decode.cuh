// The consumers' operand decoding: block scale codes into bf16 factors, packed A rows into wgmma
// register fragments, packed B rows into the swizzled bf16 tile (convert_b_row, where no decoder
// warpgroup runs). The K order these follow is in kernel.cuh's header.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "csrc/common/dequant.cuh"
#include "csrc/common/formats.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/sm90/config.cuh"

namespace fp4_gemm::sm90 {

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

}  // namespace fp4_gemm::sm90
