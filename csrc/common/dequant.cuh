// Exact operand dequantization to 16-bit floats, eight elements at a time: what the GEMM mainloops
// and the dequantize kernel share (docs/FORMATS.md; reference: reference.dequantize).
//
// Every E2M1, E0M3 and E4M3 value is exact in fp16 and bf16, and so is its product with a UE4M3
// scale (at most 2 + 4 significant bits, magnitudes 2^-10 .. 2688), so NVFP4 and E0M3 operands
// dequantize exactly in 16-bit arithmetic: decode by placing the code bits into a half/bfloat16
// pattern, then one paired multiply by the block scale. UE8M0 scales (2^-127 .. 2^127) leave the
// fp16 range: MX operands are decoded here and multiplied by their scale in float32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "csrc/common/formats.cuh"

namespace fp4_gemm {

template <class T>
struct Pair;
template <>
struct Pair<__half> {
  using Type = __half2;
  // Code bits placed at the bottom of the exponent field: value * 2^-14 (fp16) for E2M1.
  static constexpr int kExponentShift = 10;
  static constexpr uint32_t kE2M1Unbias = 0x74007400u;  // 2^14, 2^14
  static constexpr uint32_t kIntegerBase = 0x64006400u;  // 1024, 1024: 1024 + m is exact
};
template <>
struct Pair<__nv_bfloat16> {
  using Type = __nv_bfloat162;
  static constexpr int kExponentShift = 7;
  static constexpr uint32_t kE2M1Unbias = 0x7E807E80u;  // 2^126, 2^126
  static constexpr uint32_t kIntegerBase = 0x43004300u;  // 128, 128: 128 + m is exact
};

template <class T>
__device__ __forceinline__ typename Pair<T>::Type pair_from_bits(uint32_t bits) {
  return *reinterpret_cast<const typename Pair<T>::Type*>(&bits);
}

// The bits of a 16-bit pair (__half2 or __nv_bfloat162).
template <class P>
__device__ __forceinline__ uint32_t pair_bits(P pair) {
  static_assert(sizeof(P) == 4, "a pair of 16-bit values");
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Two 4-bit codes of a word as the sign and magnitude bit fields of a pair (bits 0-3 and 16-19).
// Nibbles k and k + 1 (consecutive elements):
__device__ __forceinline__ uint32_t nibble_pair(uint32_t codes, int k) {
  const uint32_t two = codes >> (4 * k);
  return (two & 0xFu) | ((two & 0xF0u) << 12);
}
// Nibbles j and j + 4 (elements four apart): one shift and one mask, the cheapest pairing; the GEMM
// mainloops order K so that these are the pairs a fragment takes.
__device__ __forceinline__ uint32_t nibble_pair_stride4(uint32_t codes, int j) {
  return (codes >> (4 * j)) & 0x000F000Fu;
}
// The two nibbles of byte b (elements 2b and 2b + 1), as nibble_pair gives them, for a byte chosen at
// run time: one byte permute of the codes and of their copy shifted a nibble down, one mask.
// `selector` is byte_nibbles_selector(b), made once.
__host__ __device__ constexpr uint32_t byte_nibbles_selector(uint32_t b) { return b | ((b + 4) << 8); }
__device__ __forceinline__ uint32_t byte_nibbles(uint32_t codes, uint32_t selector) {
  return __byte_perm(codes, codes >> 4, selector) & 0x000F000Fu;
}

// Nibbles j and j + 4 of `codes` (the nibble_pair_stride4 pairing) -> two 16-bit patterns: the
// nibble's bit 3 (the sign) at bit 15, its bits 0-2 at kMagnitude .. kMagnitude + 2, the rest 0.
// The bit placement is one integer multiply: the masked nibbles times 2^a + 2^b land as two copies
// that do not overlap (so no carries), the sign bit in place in one and the magnitude in the other,
// and one mask keeps both. Cheaper than shifting: the multiply runs on the FMA pipe, which the GEMM
// mainloops leave idler than the integer pipe. Nibbles 2 and 3 are shifted down a byte first: a
// 64-bit multiply whose high word is the magnitude copy saves that shift but slowed the Hopper
// engine's 4-bit decoders (docs/PERFORMANCE.md, rejected ideas).
template <int kMagnitude>
__device__ __forceinline__ uint32_t stride4_patterns(uint32_t codes, int j) {
  // kMagnitude + 2 < 12: the magnitude copy stays below the sign copy (in fp16's 9 it would not).
  static_assert(kMagnitude >= 4 && kMagnitude <= 8, "the two copies must not overlap");
  constexpr uint32_t kKeep = 0x80008000u | (0x00070007u << kMagnitude);
  const uint32_t word = j < 2 ? codes : codes >> 8;  // nibbles j, j + 4 now at bits 4(j % 2)
  const int low = 4 * (j % 2);
  const uint32_t n = word & (0x000F000Fu << low);
  return (n * ((1u << (12 - low)) + (1u << (kMagnitude - low)))) & kKeep;
}

// The E2M1 bit patterns of decode_e2m1_pair, before its unbias multiply (value * 2^(1 - bias);
// subnormal patterns for 0 and 0.5), of stride4_patterns' pairing.
template <class T>
__device__ __forceinline__ typename Pair<T>::Type e2m1_stride4_patterns(uint32_t codes, int j) {
  static_assert(std::is_same_v<T, __nv_bfloat16>, "the multiply placement is exact for bf16 only");
  return pair_from_bits<T>(stride4_patterns<Pair<T>::kExponentShift - 1>(codes, j));
}

// The same patterns of a pair as nibble_pair and byte_nibbles give it (nibbles at bits 0-3 and
// 16-19, nothing else set), by the same multiply placement: copies of n at 2^12 and 2^6 do not
// overlap, one mask keeps the sign bits of the one and the magnitudes of the other.
template <class T>
__device__ __forceinline__ typename Pair<T>::Type e2m1_pair_patterns(uint32_t n) {
  static_assert(std::is_same_v<T, __nv_bfloat16>, "the multiply placement is exact for bf16 only");
  constexpr int kMagnitude = Pair<T>::kExponentShift - 1;
  constexpr uint32_t kKeep = 0x80008000u | (0x00070007u << kMagnitude);
  return pair_from_bits<T>((n * ((1u << 12) + (1u << kMagnitude))) & kKeep);
}

template <class T>
__device__ __forceinline__ typename Pair<T>::Type decode_e2m1_stride4(uint32_t codes, int j) {
  return __hmul2(e2m1_stride4_patterns<T>(codes, j), pair_from_bits<T>(Pair<T>::kE2M1Unbias));
}

// One pair of E2M1 codes (as nibble_pair and byte_nibbles give them) -> values: the 16-bit pattern
// s | ee (bottom of the exponent) | m (top mantissa bit) times 2^(bias - 1), subnormal (ee = 0)
// included. bf16 places the bits by e2m1_pair_patterns' multiply; fp16, whose copies would overlap
// there, by shifts.
template <class T>
__device__ __forceinline__ typename Pair<T>::Type decode_e2m1_pair(uint32_t n) {
  const auto unbias = pair_from_bits<T>(Pair<T>::kE2M1Unbias);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __hmul2(e2m1_pair_patterns<T>(n), unbias);
  } else {
    constexpr int kShift = Pair<T>::kExponentShift - 1;
    return __hmul2(pair_from_bits<T>(((n & 0x00080008u) << 12) | ((n & 0x00070007u) << kShift)), unbias);
  }
}

// One pair of E0M3 codes -> values: (base + m) - base is exactly m, then the sign bit.
template <class T>
__device__ __forceinline__ typename Pair<T>::Type decode_e0m3_pair(uint32_t n) {
  const auto base = pair_from_bits<T>(Pair<T>::kIntegerBase);
  const auto magnitude = __hsub2(pair_from_bits<T>(Pair<T>::kIntegerBase | (n & 0x00070007u)), base);
  const uint32_t sign = (n & 0x00080008u) << 12;
  return pair_from_bits<T>(*reinterpret_cast<const uint32_t*>(&magnitude) | sign);
}

// Eight E2M1 codes (element i in nibble i) -> their values as four pairs, in element order.
template <class T>
__device__ __forceinline__ void dequant_e2m1x8(uint32_t codes, typename Pair<T>::Type (&out)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) out[p] = decode_e2m1_pair<T>(nibble_pair(codes, 2 * p));
}

// Eight E0M3 codes -> values, in element order.
template <class T>
__device__ __forceinline__ void dequant_e0m3x8(uint32_t codes, typename Pair<T>::Type (&out)[4]) {
#pragma unroll
  for (int p = 0; p < 4; ++p) out[p] = decode_e0m3_pair<T>(nibble_pair(codes, 2 * p));
}

// The E4M3 pair in half-word kHalf of `word` -> f16x2, exactly (E4M3 fits fp16; 0x7F is NaN). The
// conversion reads the half-word in place: no shift, no mask.
template <int kHalf = 0>
__device__ __forceinline__ __half2 e4m3x2_half2(uint32_t word) {
  static_assert(kHalf == 0 || kHalf == 1, "a word has two half-words");
  uint32_t h;
  if constexpr (kHalf == 0) {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(h) : "r"(word));
  } else {
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(h) : "r"(word));
  }
  return *reinterpret_cast<const __half2*>(&h);
}

// Four E4M3 bytes -> values as two pairs.
template <class T>
__device__ __forceinline__ void dequant_e4m3x4(uint32_t bytes, typename Pair<T>::Type (&out)[2]) {
  const __half2 h[2] = {e4m3x2_half2<0>(bytes), e4m3x2_half2<1>(bytes)};
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    if constexpr (std::is_same_v<T, __half>) {
      out[p] = h[p];
    } else {
      out[p] = __float22bfloat162_rn(__half22float2(h[p]));
    }
  }
}

// Block factors as bf16 pairs, exactly and without branches (what the GEMM mainloops multiply by),
// two blocks at a time.
// UE4M3 (read with its sign bit, as the reference does) times 2^kExponent, the codes in bytes 0 and
// 1 of half-word kHalf: the hardware conversion to fp16 is exact (subnormal codes included; 0x7F
// gives NaN), and so is s in bf16 (4 significant bits, 2^-9 .. 448); kExponent <= 119 keeps
// 448 * 2^kExponent a finite bf16, so the bf16 power-of-two multiply is exact too.
template <int kExponent, int kHalf = 0>
__device__ __forceinline__ __nv_bfloat162 ue4m3x2_bf16x2(uint32_t codes) {
  static_assert(kExponent >= 0 && kExponent <= 119, "448 * 2^kExponent must stay a finite bf16");
  const __nv_bfloat162 s = __float22bfloat162_rn(__half22float2(e4m3x2_half2<kHalf>(codes)));
  if constexpr (kExponent == 0) return s;
  constexpr uint32_t kPower = uint32_t(kExponent + 127) << 7;
  return __hmul2(s, pair_from_bits<__nv_bfloat16>(kPower | (kPower << 16)));
}

// UE8M0 codes c0 | c1 << 16 -> 2^(c - 127) in the low and the high half: c << 7 is the bf16
// exponent field; the maximum with 2^-127 turns code 0 (+0) into the subnormal 2^-127 and leaves
// every other code (at least 2^-126, or +inf for 255); for code 255 alone c + 1 reaches bit 8,
// which ORs in the 0x40 of the NaN 0x7FC0.
__device__ __forceinline__ __nv_bfloat162 ue8m0x2_bf16x2_spread(uint32_t spread) {
  const __nv_bfloat162 fields =
      __hmax2(pair_from_bits<__nv_bfloat16>(spread << 7), pair_from_bits<__nv_bfloat16>(0x00400040u));
  return pair_from_bits<__nv_bfloat16>(pair_bits(fields) | (((spread + 0x00010001u) >> 2) & 0x00400040u));
}

// Values times a UE4M3 block scale: exact, so the 16-bit multiply is the contract's rounding.
template <class T>
__device__ __forceinline__ void scale_ue4m3(typename Pair<T>::Type (&values)[4], uint8_t scale) {
  const float s = ue4m3_decode(scale);
  typename Pair<T>::Type pair;
  if constexpr (std::is_same_v<T, __half>) {
    pair = __float2half2_rn(s);
  } else {
    pair = __float2bfloat162_rn(s);
  }
#pragma unroll
  for (int p = 0; p < 4; ++p) values[p] = __hmul2(values[p], pair);
}

}  // namespace fp4_gemm
