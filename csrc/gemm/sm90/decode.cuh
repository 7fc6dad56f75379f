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

// The factors of two blocks of A (codes in bits 0-7 and 8-15; block 0 in the low half). NVFP4 A is
// decoded as bit patterns (value * 2^-126), which take s * 2^(126 - kValueExponentA); E0M3 takes s.
template <class Config>
__device__ __forceinline__ Bf16x2 a_block_factors(uint32_t codes) {
  constexpr OperandFormat kFormat = Config::kFormatA;
  if constexpr (kFormat == OperandFormat::Mxfp8 || kFormat == OperandFormat::Mxfp4) {
    return ue8m0x2_bf16x2(codes);
  } else {
    static_assert(kFormat != OperandFormat::Nvfp4 || Config::kValueExponentA == 7, "NVFP4 patterns times s * 2^119");
    return ue4m3x2_bf16x2<(kFormat == OperandFormat::Nvfp4 ? 126 - Config::kValueExponentA : 0)>(codes);
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

// Pair j (0..3) of an 8-element word of a 4-bit A, elements j and j + 4 (see above), times its
// block's factor (both halves, a_block_factors): NVFP4 as bit patterns, the others as values.
template <OperandFormat kFormat>
__device__ __forceinline__ uint32_t decode_nibble_pair(uint32_t word, int j, Bf16x2 factor) {
  Bf16x2 value;
  if constexpr (kFormat == OperandFormat::E0m3) {
    value = decode_e0m3_pair<__nv_bfloat16>(nibble_pair_stride4(word, j));
  } else if constexpr (kFormat == OperandFormat::Nvfp4) {
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
  // Byte `block` of each row's codes, top row's in bits 0-7 and the bottom row's in bits 8-15.
  const uint32_t block = uint32_t((16 * q) / block_size(kFormat));
  const uint32_t two = __byte_perm(codes(scale_word(scales, sf_row0 + row)),
                                   codes(scale_word(scales, sf_row0 + row + 8)), block | ((block + 4) << 4));
  const Bf16x2 factors = a_block_factors<Config>(two);
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
        pairs[r][pair] = decode_nibble_pair<kFormat>(pair < 4 ? bytes.x : bytes.y, pair % 4, factor[r]);
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
  const Bf16x2 factors[2] = {a_block_factors<Config>(row_codes), a_block_factors<Config>(row_codes >> 16)};
  const uint32_t byte_q = byte_nibbles_selector(uint32_t(q));
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
      const uint32_t n = byte_nibbles(words[pair], byte_q);  // byte q of word pair: nibbles 2q, 2q + 1
      if constexpr (kFormat == OperandFormat::E0m3) {
        value = decode_e0m3_pair<__nv_bfloat16>(n);
      } else if constexpr (kFormat == OperandFormat::Nvfp4) {  // the patterns: the factor carries the unbias
        value = e2m1_pair_patterns<__nv_bfloat16>(n);
      } else {
        value = decode_e2m1_pair<__nv_bfloat16>(n);
      }
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

// ---- B rows into the bf16 tile: the one B decoder --------------------------------------------
//
// The decoder warpgroup (decoder.cuh) and, where none runs, the consumers (convert_b_row) turn a
// packed B row of the K tile into its eight 16-byte chunks of the swizzled bf16 tile with these two
// steps: the row's four factors (b_row_factors), then each chunk (decode_b_chunk). Chunk c holds
// pair P = c of each q = 0..3 (see the file comment of kernel.cuh).
//
// The K tile's scale codes of a row are selected by one word, `select`: for 16-element blocks a
// mask of the row's scale word (TileCodes' mask: their shift is always 0); for 32-element blocks a
// byte_perm selector that also spreads the tile's two codes into the halves (c0 | c1 << 16): bytes
// 0, 1 (0x4140) or, in odd K tiles, 2, 3 (0x4342), and a zero byte (selector 5 or 7: a byte of the
// zero word) for a block past K.
template <class Config>
struct BlockSelect {
  static constexpr int kBlocks = Config::kBlockK / Config::kBlockSize;
  static_assert(kBlocks == 4 || kBlocks == 2, "16- or 32-element blocks");
  static constexpr uint32_t kFull = kBlocks == 4 ? ~0u : 0x4140u;
  static constexpr uint32_t kOdd = 0x0202u;        // kFull ^ kOdd: the odd K tiles' selector
  static constexpr uint32_t kSecondPastK = 0x0400u;  // ORed in: the second block lies past K

  // The selection TileCodes makes for B's rows.
  __device__ __forceinline__ static uint32_t of(const TileCodes& codes) {
    if constexpr (kBlocks == 4) {
      return codes.mask;
    } else {
      return (codes.shift != 0 ? kFull ^ kOdd : kFull) | (codes.mask == ~0u ? 0u : kSecondPastK);
    }
  }
};

// The factor of each q's block (q's 16 elements: block q for 16-element blocks, q / 2 for 32-element
// ones) from the row's scale word and the K tile's BlockSelect, taken from their place in the word
// (ue4m3x2_bf16x2 of a half-word, ue8m0x2_bf16x2_spread: no shifts to line them up).
template <class Config>
__device__ __forceinline__ void b_row_factors(uint32_t row_codes, uint32_t select, Bf16x2 (&scale)[4]) {
  constexpr OperandFormat kFormat = Config::kFormatB;
  if constexpr (block_size(kFormat) == 16) {
    static_assert(kFormat != OperandFormat::Nvfp4 || Config::kValueExponentB == 7, "NVFP4 patterns times s * 2^119");
    // NVFP4 bit patterns take s * 2^119; E0M3 patterns times 2^126 (decode_b_chunk) take s * 2^3.
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
}

// Chunk c of a B row (`words`: the row's packed K tile) in bf16, factors applied. `word_c` is c
// with a consumer's runtime part (sub, b_chunk_offsets) taken off: it picks the words, and must be a
// constant once unrolled so that they stay registers (c / 2 and c / 4 do not depend on sub < 2).
//   MXFP8: elements 16q + 2c + {0, 1} are half-word c % 2 of word 4q + c / 2, converted in place.
//   4-bit: pair c of q lives in word 2q + c / 4 (elements 16q + 8(c / 4) ..). E2M1: s.ee.m placed as
//   decode_nibble_pair places it. E0M3: s.mmm with m at the top of the mantissa, a subnormal
//   m * 2^-129; times 2^126 that is m * 2^-3, a normal bf16, and times the factor s * 2^3 it is
//   m * s (at most 3 + 4 significant bits): both products exact, so the value is decode_e0m3_pair's
//   times s, the sign of a zero included (every step is a product).
template <class Config>
__device__ __forceinline__ uint4 decode_b_chunk(const uint32_t* words, const Bf16x2 (&scale)[4], int c, int word_c) {
  constexpr OperandFormat kFormat = Config::kFormatB;
  constexpr uint32_t kUnbias = Pair<__nv_bfloat16>::kE2M1Unbias;  // 2^126 in both halves
  uint4 out;
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    Bf16x2 value;
    if constexpr (kFormat == OperandFormat::Mxfp8) {
      const uint32_t word = words[4 * q + word_c / 2];
      value = __float22bfloat162_rn(__half22float2(c % 2 ? e4m3x2_half2<1>(word) : e4m3x2_half2<0>(word)));
    } else {
      const uint32_t word = words[2 * q + word_c / 4];
      const uint32_t patterns = stride4_patterns<kFormat == OperandFormat::E0m3 ? 4 : 6>(word, c % 4);
      value = pair_from_bits<__nv_bfloat16>(patterns);
      if constexpr (kFormat != OperandFormat::Nvfp4) value = __hmul2(value, pair_from_bits<__nv_bfloat16>(kUnbias));
    }
    o[q] = pair_bits(__hmul2(value, scale[q]));
  }
  return out;
}

// The consumers' share of the packed B tile (no decoder warpgroup): row `row`, chunks
// c = i * kPerRow + sub, stored at `offsets` (b_chunk_offsets). Word indices stay compile-time
// constants once unrolled, so the row's words live in registers.
template <class Config, int kPerRow>
__device__ __forceinline__ void convert_b_row(const uint8_t* tile, const uint8_t* scales, int sf_row0,
                                              uint8_t* bf16_tile, int row, int sub, uint32_t select,
                                              const int (&offsets)[8 / kPerRow]) {
  static_assert(kPerRow == 1 || kPerRow == 2, "one or two threads a row (decode_b_chunk's word_c)");
  constexpr int kRowBytes = Config::kRowBytesB;
  uint32_t words[kRowBytes / 4];
  const uint8_t* src = tile + row * kRowBytes;
#pragma unroll
  for (int i = 0; i < kRowBytes / 16; ++i) {
    const uint4 v = *reinterpret_cast<const uint4*>(src + 16 * i);
    words[4 * i] = v.x, words[4 * i + 1] = v.y, words[4 * i + 2] = v.z, words[4 * i + 3] = v.w;
  }
  Bf16x2 scale[4];
  b_row_factors<Config>(scale_word(scales, sf_row0 + row), select, scale);
#pragma unroll
  for (int i = 0; i < 8 / kPerRow; ++i) {
    *reinterpret_cast<uint4*>(bf16_tile + offsets[i]) = decode_b_chunk<Config>(words, scale, i * kPerRow + sub, i * kPerRow);
  }
}

}  // namespace fp4_gemm::sm90
