// How a GEMM kernel turns stored operand words into bf16 mma operands (docs/FORMATS.md).
//
// Every codec reads a 16-byte chunk of a row as four 32-bit words and decodes a word into bf16
// pairs with its block scale already multiplied in, exactly: E2M1 x UE4M3, E0M3 x UE4M3, E2M1 x
// 2^k and E4M3 x 2^k all have at most 8 significant bits, which bf16 holds, and bf16 has float32's
// exponent range. A decoded value is the true value times 2^-kUnbiasExponent; the kernel's
// epilogue multiplies that back (a power of two, so exactly).
//
// Element order. A 4-bit word decodes into the pairs (j, j + 4), j = 0..3 (nibble_pair_stride4's
// pairing: one mask per pair), an 8-bit word into the pairs (0, 2), (1, 3). The mma contracts its
// 16 k-slots in any order as long as both operands put the same element in the same slot, so the
// other operand is decoded by the same codec or gathered into this order.
//
// Per word, a decode is the bit placement of the shared codec (dequant.cuh) and one packed multiply
// by the block's factor. MX factors above what one bf16 factor carries (2^k for k > 1 with MXFP4,
// k > 7 with MXFP8) take a second multiply, decode<true>: a kernel takes that path only for the
// tiles that need it (real MX weights never do).
//
// Two granularities, one decode each:
//   decode<kRest>(word, factors, w, pairs)  a word of a 16-byte chunk (the M <= 16 kernels);
//   stride4_pair(word, j, factor), pair(n, factor)  one pair of a 4-bit format, elements j and j + 4
//       of a word or the nibbles at bits 0-3 and 16-19 (nibble_pair_stride4, byte_nibbles);
//       half_pair(word, half, factor) one pair of an 8-bit format, elements 2 half and 2 half + 1
//       (word_pairs: both): the Hopper engine, whose threads hold single pairs of several words,
//       each pair exact for every scale code (MX: the value times the block's 2^k, see MxCodec).
//       E0M3's stride4_pair serves its chunk decode only: the engine keeps its own E0M3 sequences.
// factor_pair<kHalf>(codes) makes the Factor of each of two blocks whose codes are the bytes of
// half-word kHalf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "csrc/common/dequant.cuh"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

using Bf16x2 = __nv_bfloat162;

// The bf16 2^(exponent field - 127) of a UE8M0-style factor, in both halves.
__device__ __forceinline__ Bf16x2 power_of_two_pair(uint32_t field) { return pair_from_bits<__nv_bfloat16>((field << 7) * 0x10001u); }

template <OperandFormat F>
struct OperandCodec;

// E2M1 values with UE4M3 scales per 16. The factor s * 2^119 (at most 448 * 2^119 < 2^128) turns
// the E2M1 bit pattern (value * 2^-126) into value * s * 2^-7 with one multiply.
template <>
struct OperandCodec<OperandFormat::Nvfp4> {
  static constexpr int kElementBits = 4;
  static constexpr int kBlock = 16;
  static constexpr int kUnbiasExponent = 7;
  using Factor = Bf16x2;  // one block's s * 2^119, in both halves
  struct Factors {
    Bf16x2 f;  // blocks 0 and 1 of the chunk
  };
  // codes: the scale codes of the chunk's blocks in bits 0-7 and 8-15.
  __device__ __forceinline__ static Factors factors(uint32_t codes) {
    return {ue4m3x2_bf16x2<119>(codes)};
  }
  template <int kHalf = 0>
  __device__ __forceinline__ static void factor_pair(uint32_t codes, Factor (&f)[2]) {
    const Bf16x2 two = ue4m3x2_bf16x2<119, kHalf>(codes);
    f[0] = __low2bfloat162(two);
    f[1] = __high2bfloat162(two);
  }
  __device__ __forceinline__ static uint32_t stride4_pair(uint32_t word, int j, const Factor& f) {
    return pair_bits(__hmul2(e2m1_stride4_patterns<__nv_bfloat16>(word, j), f));
  }
  __device__ __forceinline__ static uint32_t pair(uint32_t n, const Factor& f) {
    return pair_bits(__hmul2(e2m1_pair_patterns<__nv_bfloat16>(n), f));
  }
  static constexpr bool kHasRest = false;
  // Word w of the chunk (elements 8w .. 8w + 7; block w / 2).
  template <bool kRest = false>
  __device__ __forceinline__ static void decode(uint32_t word, const Factors& f, int w, uint32_t (&pairs)[4]) {
    const Factor factor = w < 2 ? __low2bfloat162(f.f) : __high2bfloat162(f.f);
#pragma unroll
    for (int j = 0; j < 4; ++j) pairs[j] = stride4_pair(word, j, factor);
  }
};

// E0M3 values with UE4M3 scales per 16, true values: (128 + m) * s - 128 * s = m * s in one fused
// multiply-add (one rounding of an exact value), then the sign bit.
template <>
struct OperandCodec<OperandFormat::E0m3> {
  static constexpr int kElementBits = 4;
  static constexpr int kBlock = 16;
  static constexpr int kUnbiasExponent = 0;
  struct Factor {
    Bf16x2 s;       // s, in both halves
    Bf16x2 offset;  // -128 s, in both halves
  };
  struct Factors {
    Bf16x2 s;       // s of blocks 0 and 1
    Bf16x2 offset;  // -128 s of blocks 0 and 1
  };
  __device__ __forceinline__ static Factors factors(uint32_t codes) {
    const float2 s = __half22float2(e4m3x2_half2(codes));
    return {__floats2bfloat162_rn(s.x, s.y), __floats2bfloat162_rn(-128.0f * s.x, -128.0f * s.y)};
  }
  __device__ __forceinline__ static uint32_t stride4_pair(uint32_t word, int j, const Factor& f) {
    const Bf16x2 biased =
        pair_from_bits<__nv_bfloat16>(((word >> (4 * j)) & 0x00070007u) | Pair<__nv_bfloat16>::kIntegerBase);
    const uint32_t sign = (j == 3 ? word : word << (12 - 4 * j)) & 0x80008000u;
    return pair_bits(__hfma2(biased, f.s, f.offset)) ^ sign;
  }
  static constexpr bool kHasRest = false;
  template <bool kRest = false>
  __device__ __forceinline__ static void decode(uint32_t word, const Factors& f, int w, uint32_t (&pairs)[4]) {
    const Factor factor = {w < 2 ? __low2bfloat162(f.s) : __high2bfloat162(f.s),
                           w < 2 ? __low2bfloat162(f.offset) : __high2bfloat162(f.offset)};
#pragma unroll
    for (int j = 0; j < 4; ++j) pairs[j] = stride4_pair(word, j, factor);
  }
};

// One UE8M0 block per chunk (MXFP4) or per two chunks (MXFP8): the factor 2^(k + kBias) is capped
// at 2^(kCap + kBias) <= 2^127, and a larger k multiplies by the rest, 2^(k - kCap), once more.
template <int kBias, int kCap>
struct PowerOfTwoFactors {
  Bf16x2 f;
  Bf16x2 rest;
  bool twice;

  __device__ __forceinline__ static PowerOfTwoFactors from(uint32_t codes) {
    const uint32_t code = codes & 0xFFu;
    const uint32_t capped = code + kBias < 254u ? code + kBias : 254u;
    PowerOfTwoFactors f;
    f.f = code == 0xFFu ? pair_from_bits<__nv_bfloat16>(0x7FC07FC0u) : power_of_two_pair(capped);  // 0xFF: NaN
    f.twice = code != 0xFFu && int(code) - 127 > kCap;
    f.rest = power_of_two_pair(f.twice ? code - kCap : 127u);
    return f;
  }

  template <bool kRest, int kPairs>
  __device__ __forceinline__ void apply(const Bf16x2 (&patterns)[kPairs], uint32_t (&pairs)[kPairs]) const {
    Bf16x2 v[kPairs];
#pragma unroll
    for (int j = 0; j < kPairs; ++j) v[j] = __hmul2(patterns[j], f);
    if constexpr (kRest) {
      if (twice) {
#pragma unroll
        for (int j = 0; j < kPairs; ++j) v[j] = __hmul2(v[j], rest);
      }
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) pairs[j] = pair_bits(v[j]);
  }
};

// What the MX codecs share: UE8M0 scales per 32 elements, true values. A chunk's decode takes the
// capped factor and, where needed, the rest (Factors); a single pair takes its values (the pattern
// times the unbias) times the block's 2^k in bf16 (Factor), two multiplies that are exact for every
// code: 2^-127 (code 0, a bf16 subnormal) .. 2^127, NaN for code 255.
template <int kBits, int kBias, int kCap>
struct MxCodec {
  static constexpr int kElementBits = kBits;
  static constexpr int kBlock = 32;
  static constexpr int kUnbiasExponent = 0;
  static constexpr bool kHasRest = true;
  using Factors = PowerOfTwoFactors<kBias, kCap>;  // one block
  using Factor = Bf16x2;                           // one block's 2^k, in both halves
  __device__ __forceinline__ static Factors factors(uint32_t codes) { return Factors::from(codes); }
  template <int kHalf = 0>
  __device__ __forceinline__ static void factor_pair(uint32_t codes, Factor (&f)[2]) {
    factor_pair_spread(__byte_perm(codes, 0u, kHalf ? 0x4342 : 0x4140), f);
  }
  // The same from codes at bits 0-7 and 16-23 (a byte permute's spread, which can also pick them).
  __device__ __forceinline__ static void factor_pair_spread(uint32_t spread, Factor (&f)[2]) {
    const Bf16x2 two = ue8m0x2_bf16x2_spread(spread);
    f[0] = __low2bfloat162(two);
    f[1] = __high2bfloat162(two);
  }
};

// E2M1 values with UE8M0 scales per 32: pattern (value * 2^-126) * 2^(k + 126).
template <>
struct OperandCodec<OperandFormat::Mxfp4> : MxCodec<4, 126, 1> {
  __device__ __forceinline__ static uint32_t stride4_pair(uint32_t word, int j, const Factor& f) {
    return pair_bits(__hmul2(decode_e2m1_stride4<__nv_bfloat16>(word, j), f));
  }
  __device__ __forceinline__ static uint32_t pair(uint32_t n, const Factor& f) {
    return pair_bits(__hmul2(decode_e2m1_pair<__nv_bfloat16>(n), f));
  }
  template <bool kRest = false>
  __device__ __forceinline__ static void decode(uint32_t word, const Factors& f, int, uint32_t (&pairs)[4]) {
    Bf16x2 patterns[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) patterns[j] = e2m1_stride4_patterns<__nv_bfloat16>(word, j);
    f.template apply<kRest>(patterns, pairs);
  }
};

// E4M3 values with UE8M0 scales per 32. The E4M3 bits placed into bf16's fields are the value times
// 2^-120 (subnormals included); the NaN codes 0x7F / 0xFF are the only ones whose magnitude bits
// are all ones, and become bf16 NaN.
template <>
struct OperandCodec<OperandFormat::Mxfp8> : MxCodec<8, 120, 7> {
  // Elements 2 half, 2 half + 1 of a word (its half-word `half`, converted in place by the hardware:
  // exact, 0x7F / 0xFF NaN) times the block's 2^k: consecutive pairs, for the Hopper engine.
  __device__ __forceinline__ static uint32_t half_pair(uint32_t word, int half, const Factor& f) {
    const Bf16x2 value = __float22bfloat162_rn(__half22float2(half ? e4m3x2_half2<1>(word) : e4m3x2_half2<0>(word)));
    return pair_bits(__hmul2(value, f));
  }
  // Both of a word's pairs (half_pair of each half), both converted before either is scaled.
  __device__ __forceinline__ static void word_pairs(uint32_t word, const Factor& f, uint32_t (&pairs)[2]) {
    Bf16x2 values[2];
    dequant_e4m3x4<__nv_bfloat16>(word, values);
    pairs[0] = pair_bits(__hmul2(values[0], f));
    pairs[1] = pair_bits(__hmul2(values[1], f));
  }
  template <bool kRest = false>
  __device__ __forceinline__ static void decode(uint32_t word, const Factors& f, int, uint32_t (&pairs)[2]) {
    const uint32_t placed[2] = {((word << 8) & 0x80008000u) | ((word << 4) & 0x07F007F0u),
                                (word & 0x80008000u) | ((word >> 4) & 0x07F007F0u)};
    const Bf16x2 nan_pattern = pair_from_bits<__nv_bfloat16>(0x07F007F0u);
    Bf16x2 patterns[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t nan = __heq2_mask(__habs2(pair_from_bits<__nv_bfloat16>(placed[j])), nan_pattern);
      patterns[j] = pair_from_bits<__nv_bfloat16>(placed[j] | (nan & 0x7FC07FC0u));
    }
    f.template apply<kRest>(patterns, pairs);
  }
};

constexpr int kChunkWords = 4;  // 32-bit words of a 16-byte chunk

// bf16 operands carry their values as they are: a kernel gathers them into the other operand's
// element order (the skinny tier's Bf16Gather).
template <>
struct OperandCodec<OperandFormat::Bf16> {
  static constexpr int kElementBits = 16;
  static constexpr int kUnbiasExponent = 0;
};

// How many bf16 pairs a word of format F decodes into, and the chunk's geometry.
template <OperandFormat F>
struct WordShape {
  static constexpr int kElements = 32 / OperandCodec<F>::kElementBits;  // per 32-bit word
  static constexpr int kPairs = kElements / 2;
  static constexpr int kChunkElements = 4 * kElements;                  // per 16-byte chunk
};

}  // namespace fp4_gemm
