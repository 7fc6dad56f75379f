// The consumers' operand decoding: block scale codes into bf16 factors, packed A rows into wgmma
// register fragments, packed B rows into the swizzled bf16 tile (convert_b_row, where no decoder
// warpgroup runs). The K order these follow is in kernel.cuh's header.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "csrc/common/dequant.cuh"
#include "csrc/common/formats.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/operand_codec.cuh"
#include "csrc/gemm/sm90/config.cuh"

namespace fp4_gemm::sm90 {

// ---- operand decoding ---------------------------------------------------------------------------
//
// Every operand decodes through its format's OperandCodec (operand_codec.cuh) one pair at a time,
// each pair times its block's Factor (factor_pair: two blocks per conversion): 4-bit formats pair
// elements j and j + 4 of a word (stride4_pair) or a byte's two (pair), 8-bit formats a half-word's
// two (half_pair, word_pairs). The decoded value is the true one times 2^-kUnbiasExponent (NVFP4:
// 2^-7), which the epilogue multiplies back (config.cuh, true_sum): the float32 products of two NVFP4
// operands are the true ones times 2^-14, all multiples of 2^-34 and never subnormal, so they
// accumulate as the true values do. Exactness of each decode: docs/FORMATS.md, operand_codec.cuh.
//
// E0M3 alone keeps the engine's own sequences (the codec's fused multiply-add measured slower here:
// docs/PERFORMANCE.md, rejected ideas): A as values, (128 + m) - 128 = m and the sign
// (decode_e0m3_pair), times s; B as the bit pattern m * 2^-129 (decode_b_chunk) times 2^126 times
// s * 2^3. Both factors are UE4M3 conversions (ue4m3x2_bf16x2); every product is exact.

// The factor a pair of format F takes: its codec's Factor of one block (E0M3: s, or s * 2^3 for B).
template <OperandFormat F>
struct PairFactorOf {
  using Type = typename OperandCodec<F>::Factor;
};
template <>
struct PairFactorOf<OperandFormat::E0m3> {
  using Type = Bf16x2;
};
template <OperandFormat F>
using PairFactor = typename PairFactorOf<F>::Type;

// The factors of two blocks of A whose codes are bytes 0 and 1 of `codes`.
template <OperandFormat kFormat>
__device__ __forceinline__ void a_factor_pair(uint32_t codes, PairFactor<kFormat> (&f)[2]) {
  if constexpr (kFormat == OperandFormat::E0m3) {
    const Bf16x2 two = ue4m3x2_bf16x2<0>(codes);
    f[0] = __low2bfloat162(two);
    f[1] = __high2bfloat162(two);
  } else {
    OperandCodec<kFormat>::factor_pair(codes, f);
  }
}

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

// The four scale bytes of `row` (0..383) in one K column of consecutive 128-row SfAtom tiles.
__device__ __forceinline__ uint32_t scale_word(const uint8_t* scales, int row) {
  return *reinterpret_cast<const uint32_t*>(scales + (row / kSfTileRows) * kSfTileBytes +
                                            sf_offset(row % kSfTileRows, 0, 1));
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
  PairFactor<kFormat> factor[2];
  a_factor_pair<kFormat>(two, factor);
  uint32_t* pairs[2] = {top, bottom};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint8_t* src = tile + (row + 8 * r) * Config::kRowBytesA;
    if constexpr (OperandCodec<kFormat>::kElementBits == 8) {
      const uint4 bytes = *reinterpret_cast<const uint4*>(src + 16 * q);
      const uint32_t words[4] = {bytes.x, bytes.y, bytes.z, bytes.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t two[2];
        OperandCodec<kFormat>::word_pairs(words[w], factor[r], two);
        pairs[r][2 * w] = two[0];
        pairs[r][2 * w + 1] = two[1];
      }
    } else {
      const uint2 bytes = *reinterpret_cast<const uint2*>(src + 8 * q);
#pragma unroll
      for (int pair = 0; pair < 8; ++pair) {
        const uint32_t word = pair < 4 ? bytes.x : bytes.y;
        if constexpr (kFormat == OperandFormat::E0m3) {
          const Bf16x2 value = decode_e0m3_pair<__nv_bfloat16>(nibble_pair_stride4(word, pair % 4));
          pairs[r][pair] = pair_bits(__hmul2(value, factor[r]));
        } else {
          pairs[r][pair] = OperandCodec<kFormat>::stride4_pair(word, pair % 4, factor[r]);
        }
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
  PairFactor<kFormat> first[2], second[2];
  a_factor_pair<kFormat>(row_codes, first);
  if constexpr (kGroup == 16) a_factor_pair<kFormat>(row_codes >> 16, second);
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
    const PairFactor<kFormat>& factor = block < 2 ? first[block] : second[block - 2];
    if constexpr (OperandCodec<kFormat>::kElementBits == 8) {
      // bytes 8 * pair + 2q, + 1: half-word q % 2 of word 2 * pair + q / 2
      const uint32_t word = q < 2 ? words[2 * pair] : words[2 * pair + 1];  // static indices: registers
      uint32_t two[2];
      OperandCodec<kFormat>::word_pairs(word >> (16 * (q % 2)), factor, two);
      pairs[pair] = two[0];
    } else {  // byte q of word pair: nibbles 2q, 2q + 1
      const uint32_t n = byte_nibbles(words[pair], byte_q);
      if constexpr (kFormat == OperandFormat::E0m3) {
        pairs[pair] = pair_bits(__hmul2(decode_e0m3_pair<__nv_bfloat16>(n), factor));
      } else {
        pairs[pair] = OperandCodec<kFormat>::pair(n, factor);
      }
    }
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
// (16-element blocks: factor_pair of each half-word; 32-element: the selector spreads the tile's two
// codes into the halves, which factor_pair_spread reads without shifts).
template <class Config>
__device__ __forceinline__ void b_row_factors(uint32_t row_codes, uint32_t select,
                                              PairFactor<Config::kFormatB> (&scale)[4]) {
  constexpr OperandFormat kFormat = Config::kFormatB;
  if constexpr (block_size(kFormat) == 16) {
    const uint32_t codes = row_codes & select;
    PairFactor<kFormat> first[2], second[2];
    if constexpr (kFormat == OperandFormat::E0m3) {  // s * 2^3 (see "operand decoding")
      const Bf16x2 two[2] = {ue4m3x2_bf16x2<3, 0>(codes), ue4m3x2_bf16x2<3, 1>(codes)};
      first[0] = __low2bfloat162(two[0]), first[1] = __high2bfloat162(two[0]);
      second[0] = __low2bfloat162(two[1]), second[1] = __high2bfloat162(two[1]);
    } else {
      OperandCodec<kFormat>::template factor_pair<0>(codes, first);
      OperandCodec<kFormat>::template factor_pair<1>(codes, second);
    }
    scale[0] = first[0], scale[1] = first[1], scale[2] = second[0], scale[3] = second[1];
  } else {
    PairFactor<kFormat> two[2];
    OperandCodec<kFormat>::factor_pair_spread(__byte_perm(row_codes, 0u, select), two);
#pragma unroll
    for (int q = 0; q < 4; ++q) scale[q] = two[q / 2];
  }
}

// Chunk c of a B row (`words`: the row's packed K tile) in bf16, factors applied. `word_c` is c
// with a consumer's runtime part (sub, b_chunk_offsets) taken off: it picks the words, and must be a
// constant once unrolled so that they stay registers (c / 2 and c / 4 do not depend on sub < 2).
//   8-bit: elements 16q + 2c + {0, 1} are half-word c % 2 of word 4q + c / 2 (half_pair).
//   4-bit: pair c of q lives in word 2q + c / 4 (elements 16q + 8(c / 4) ..), its elements c % 4 and
//   c % 4 + 4: the codec's stride4_pair (E0M3: s.mmm placed by stride4_patterns with mmm at the top
//   of the mantissa, a subnormal m * 2^-129; times 2^126 and s * 2^3 that is m * s, exactly).
template <class Config>
__device__ __forceinline__ uint4 decode_b_chunk(const uint32_t* words, const PairFactor<Config::kFormatB> (&scale)[4],
                                                int c, int word_c) {
  constexpr OperandFormat kFormat = Config::kFormatB;
  uint4 out;
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    if constexpr (OperandCodec<kFormat>::kElementBits == 8) {
      o[q] = OperandCodec<kFormat>::half_pair(words[4 * q + word_c / 2], c % 2, scale[q]);
    } else if constexpr (kFormat == OperandFormat::E0m3) {  // s.mmm: mmm at the top of the mantissa
      const Bf16x2 pattern = pair_from_bits<__nv_bfloat16>(stride4_patterns<4>(words[2 * q + word_c / 4], c % 4));
      const Bf16x2 value = __hmul2(pattern, pair_from_bits<__nv_bfloat16>(Pair<__nv_bfloat16>::kE2M1Unbias));
      o[q] = pair_bits(__hmul2(value, scale[q]));
    } else {
      o[q] = OperandCodec<kFormat>::stride4_pair(words[2 * q + word_c / 4], c % 4, scale[q]);
    }
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
  PairFactor<Config::kFormatB> scale[4];
  b_row_factors<Config>(scale_word(scales, sf_row0 + row), select, scale);
#pragma unroll
  for (int i = 0; i < 8 / kPerRow; ++i) {
    *reinterpret_cast<uint4*>(bf16_tile + offsets[i]) = decode_b_chunk<Config>(words, scale, i * kPerRow + sub, i * kPerRow);
  }
}

}  // namespace fp4_gemm::sm90
