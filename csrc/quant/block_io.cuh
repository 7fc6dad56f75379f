// Moving blocks between memory and registers, shared by the quantizing kernels. A block of 16-bit
// inputs is held as 32-bit words of two elements (element 2i in the low half); what a quantizer
// needs besides the float32 values (max |x| and the sign bits of the packed codes) is read off those
// words, two elements per instruction. Stored blocks are words of E4M3 bytes or nibbles.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "csrc/common/formats.cuh"

namespace fp4_gemm {

// The two elements of a word as float32 (exact).
__device__ __forceinline__ float2 unpack_word(uint32_t word, __nv_bfloat16) {
  return {__uint_as_float(word << 16), __uint_as_float(word & 0xFFFF0000u)};
}
__device__ __forceinline__ float2 unpack_word(uint32_t word, __half) {
  return __half22float2(*reinterpret_cast<const __half2*>(&word));
}

template <int G, class T>
__device__ __forceinline__ void unpack_words(const uint32_t* words, float* x) {
#pragma unroll
  for (int i = 0; i < G / 2; ++i) {
    const float2 pair = unpack_word(words[i], T());
    x[2 * i] = pair.x;
    x[2 * i + 1] = pair.y;
  }
}

// n 4-byte lanes (words or floats) from src by 16-byte loads; src 16-byte aligned.
template <int n, class Lane>
__device__ __forceinline__ void load_lanes(const void* src, Lane* lanes) {
  static_assert(sizeof(Lane) == 4 && n % 4 == 0, "whole 16-byte loads of 4-byte lanes");
#pragma unroll
  for (int v = 0; v < n / 4; ++v) {
    const uint4 chunk = __ldg(static_cast<const uint4*>(src) + v);
    memcpy(lanes + 4 * v, &chunk, sizeof(chunk));
  }
}

// G elements from src as words: 16-byte loads when `vector` (src 16-byte aligned), else one by one.
template <int G, class T>
__device__ __forceinline__ void load_words(const T* src, bool vector, uint32_t* words) {
  if (vector) {
    load_lanes<G / 2>(src, words);
    return;
  }
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
  for (int i = 0; i < G / 2; ++i) words[i] = __ldg(halves + 2 * i) | uint32_t(__ldg(halves + 2 * i + 1)) << 16;
}

// G values from src as float32.
template <int G, class T>
__device__ __forceinline__ void load_halves(const T* src, bool vector, float* x) {
  uint32_t words[G / 2];
  load_words<G, T>(src, vector, words);
  unpack_words<G, T>(words, x);
}

// Two unsigned 16-bit maxima in one instruction (sm_90+).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// max |x| of G elements held as words, as float32 bits (amax_bits' convention: >= 0x7F800000 iff
// non-finite).
template <int G, class T>
__device__ __forceinline__ uint32_t amax_bits_of_words(const uint32_t* words) {
  uint32_t pair = 0;  // 16-bit magnitudes order like their values, NaN and Inf above all
#pragma unroll
  for (int i = 0; i < G / 2; ++i) pair = max_u16x2(pair, words[i] & 0x7FFF7FFFu);
  const uint32_t half = max(pair & 0xFFFFu, pair >> 16);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return half << 16;
  return __float_as_uint(__half2float(__ushort_as_half(uint16_t(half))));
}

// prmt with its selector's sign-replication bit (which __byte_perm does not pass through).
__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// nibble_signs of G elements held as words. A prmt selector nibble with bit 3 set fills a byte
// with the sign of the byte it picks: four words give bytes 0x00/0xFF for elements 0..7, which
// two more pick and one LOP3 places at bits 3 and 7 of each byte.
template <int G>
__device__ __forceinline__ void nibble_signs_of_words(const uint32_t* words, uint32_t* signs) {
#pragma unroll
  for (int w = 0; w < G / 8; ++w) {
    const uint32_t* four = words + 4 * w;
    const uint32_t e0123 = byte_perm(four[0], four[1], 0xFDB9);  // signs of the high bytes
    const uint32_t e4567 = byte_perm(four[2], four[3], 0xFDB9);
    const uint32_t even = byte_perm(e0123, e4567, 0x6420);  // elements 0, 2, 4, 6
    const uint32_t odd = byte_perm(e0123, e4567, 0x7531);   // elements 1, 3, 5, 7
    signs[w] = (even & 0x08080808u) | (odd & 0x80808080u);
  }
}

// Rows a quantizing thread walks in its block column (the kernels' row loop strides over the
// rest). The 4-bit recipes are short of issue slots, so a thread pays its setup once for four rows;
// MXFP8 is short of loads in flight, and keeps one row a thread (docs/PERFORMANCE.md).
template <class Traits>
constexpr int64_t kRowsPerThread = Traits::kElement == ElementCodec::E4M3 ? 1 : 4;

// A block's stored words at dst: whole 16-byte (or, for 8-byte blocks, 8-byte) stores when
// `vector`.
template <int kBytes>
__device__ __forceinline__ void store_words(uint8_t* dst, const uint32_t* words, bool vector) {
  if (vector) {
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int v = 0; v < kBytes / 16; ++v) {
        reinterpret_cast<uint4*>(dst)[v] = {words[4 * v], words[4 * v + 1], words[4 * v + 2], words[4 * v + 3]};
      }
    } else {
      static_assert(kBytes == 8, "an MX block is 16 or 32 bytes, a UE4M3-scaled block 8");
      *reinterpret_cast<uint2*>(dst) = {words[0], words[1]};
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kBytes; ++i) dst[i] = uint8_t(words[i / 4] >> (8 * (i % 4)));
}

}  // namespace fp4_gemm
