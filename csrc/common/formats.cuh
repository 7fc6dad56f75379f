// Element and block-scale codecs: the one C++ definition of every format (docs/FORMATS.md).
// The Python twin is torch-ext/fp4_gemm/reference.py; tests compare the two bit for bit.
//
//   E2M1  s.ee.m   0, 0.5, 1, 1.5, 2, 3, 4, 6 (+8 = negative)
//   E4M3  s.eeee.mmm  max 448, 0x7F/0xFF = NaN
//   E0M3  s.mmm    integers 0..7 (+8 = negative; -0 never produced)
//   UE8M0 2^(b-127), 0xFF = NaN          (MX block scale)
//   UE4M3 E4M3 with sign 0, 0x7F = NaN   (NVFP4 / E0M3 block scale)
//
// Rounding is to nearest, ties to the even code, saturating; the sign of a negative value that
// rounds to zero is kept (E2M1 code 8, E4M3 0x80). Everything here is IEEE float32 with no
// flush-to-zero: never build these with --use_fast_math.
#pragma once

#include <cuda_fp8.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "csrc/common/types.h"

namespace fp4_gemm {

__host__ __device__ __forceinline__ uint32_t float_bits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t bits;
  __builtin_memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

__host__ __device__ __forceinline__ float float_from_bits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float value;
  __builtin_memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

// 2^e as an exact float32 for e in [-127, 127] (2^-127 is subnormal).
__host__ __device__ __forceinline__ float exp2i(int e) {
  return float_from_bits(e >= -126 ? uint32_t(e + 127) << 23 : 1u << (e + 149));
}

__host__ __device__ __forceinline__ uint8_t sign_nibble(float x) { return (float_bits(x) >> 31) ? 8 : 0; }

// ---- float32 arithmetic in a fixed order ---------------------------------------------------------
// Where the contract fixes the rounding of every step (the MSE error sums), a product must not be
// fused with the next add into an FMA. nvcc never contracts the _rn intrinsics; host compilers may
// contract plain operators across statements (GCC does, on FMA targets), and cannot through a
// volatile, so the host product is rounded by storing it.

__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  const volatile float product = a * b;
  return product;
#endif
}

__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

__host__ __device__ __forceinline__ float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// ---- E2M1 -------------------------------------------------------------------------------------

// Round to nearest even on the float32 bits, branch-free (a hot loop in every FP4 quantizer):
// |x| >= 1 keeps one mantissa bit, and (exponent << 1 | mantissa) - 252 is the code; below 1 the
// code is rint(2 |x|), read off the low bits of 2 |x| + 2^23. Saturation clamps |x| to 6 first.
// Checked equal to the midpoint rule (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
// 3.5 -> 4, 5 -> 4) on every non-NaN float32.
__host__ __device__ __forceinline__ uint8_t e2m1_encode(float x) {
  const float a = fminf(fabsf(x), 6.0f);
  const uint32_t bits = float_bits(a);
  const uint32_t normal = ((bits + 0x1FFFFFu + ((bits >> 22) & 1u)) >> 22) - 252u;
  const uint32_t subnormal = float_bits(fmaf(a, 2.0f, 8388608.0f)) & 3u;
  return uint8_t((a >= 1.0f ? normal : subnormal) | ((float_bits(x) >> 28) & 8u));
}

__host__ __device__ __forceinline__ float e2m1_decode(uint8_t code) {
  const uint8_t m = code & 7;
  const float magnitude = m < 4 ? 0.5f * m : exp2i((m >> 1) - 1) * (1.0f + 0.5f * (m & 1));
  return (code & 8) ? -magnitude : magnitude;
}

// ---- E4M3 -------------------------------------------------------------------------------------

__host__ __device__ __forceinline__ uint8_t e4m3_encode(float x) {
  return uint8_t(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__host__ __device__ __forceinline__ float e4m3_decode(uint8_t b) {
  if ((b & 0x7F) == 0x7F) return NAN;
  const int e = (b >> 3) & 0xF;
  const int m = b & 7;
  const float magnitude = e == 0 ? m * exp2i(-9) : (8 + m) * exp2i(e - 10);
  return (b & 0x80) ? -magnitude : magnitude;
}

// ---- E0M3 -------------------------------------------------------------------------------------

// min(rint(|x|), 7): clamping first gives the same integer; adding 2^23 rounds to an integer
// (ties to even) and leaves it in the low mantissa bits.
__host__ __device__ __forceinline__ uint8_t e0m3_encode(float x) {
  const uint8_t magnitude = uint8_t(float_bits(fminf(fabsf(x), 7.0f) + 8388608.0f) & 7u);
  return magnitude == 0 ? 0 : magnitude | sign_nibble(x);
}

__host__ __device__ __forceinline__ float e0m3_decode(uint8_t code) {
  const float magnitude = float(code & 7);
  return (code & 8) ? -magnitude : magnitude;
}

// ---- block scales -----------------------------------------------------------------------------

__host__ __device__ __forceinline__ float ue8m0_decode(uint8_t b) { return b == 0xFF ? NAN : exp2i(int(b) - 127); }

__host__ __device__ __forceinline__ float ue4m3_decode(uint8_t b) { return e4m3_decode(b); }

// ---- block recipes ----------------------------------------------------------------------------
// One recipe per quantization mode: block size, element codec and scale rule, split so that one
// block can be quantized by one thread (quantize_block) or by several lanes that each hold part of
// it (the quantize kernel): `scale_code` is the round-to-nearest scale byte of a finite amax,
// `element_factor` the multiplier applied to elements before encoding, `code_mask` what survives of
// their codes, `decode_scale` a scale byte's value. Recipes with `kSearchesScale` pick the scale by least squared error instead.

enum class ElementCodec { E4M3, E2M1, E0M3 };

template <ElementCodec kCodec>
__host__ __device__ __forceinline__ uint8_t encode_element(float x) {
  if constexpr (kCodec == ElementCodec::E4M3) return e4m3_encode(x);
  if constexpr (kCodec == ElementCodec::E2M1) return e2m1_encode(x);
  if constexpr (kCodec == ElementCodec::E0M3) return e0m3_encode(x);
}

// MX (OCP microscaling) recipes: UE8M0 scale 2^s, s the smallest integer with amax <= qmax * 2^s,
// clamped to [-127, 127]. With qmax = qm * 2^qe (1 <= qm < 2) and amax = m * 2^e:
// s = e - qe + (m > qm), read off the float32 bits. Elements are codec(x * 2^-s).
template <int kGroupSize, ElementCodec kCodec, int kQmaxExponent, uint32_t kQmaxMantissaBits>
struct MxRecipe {
  static constexpr int kGroup = kGroupSize;
  static constexpr ElementCodec kElement = kCodec;
  static constexpr uint8_t kScaleNan = 0xFF;
  static constexpr bool kSearchesScale = false;

  __host__ __device__ static float decode_scale(uint8_t b) { return ue8m0_decode(b); }

  __host__ __device__ static uint8_t scale_code(float amax) {
    const uint32_t bits = float_bits(amax);
    const int biased = int(bits >> 23);
    if (biased == 0) return 0;  // zero or subnormal amax: any s below -127 clamps there
    const int s = biased - 127 - kQmaxExponent + int((bits & 0x7FFFFF) > kQmaxMantissaBits);
    return uint8_t((s < -127 ? -127 : (s > 127 ? 127 : s)) + 127);
  }

  __host__ __device__ static float element_factor(uint8_t scale) { return exp2i(127 - int(scale)); }

  __host__ __device__ static uint8_t code_mask(uint8_t) { return 0xFF; }
};

using Mxfp8Recipe = MxRecipe<32, ElementCodec::E4M3, 8, 0x600000>;  // qmax 448 = 1.75 * 2^8
using Mxfp4Recipe = MxRecipe<32, ElementCodec::E2M1, 2, 0x400000>;  // qmax 6 = 1.5 * 2^2

// UE4M3-scaled recipes (NVFP4: E2M1 elements, qmax 6; E0M3: integer elements, qmax 7):
// sf = rn_satfinite(amax / qmax); if sf == 0 every code is 0, else element i = codec(x_i * f) with
// f = 1 / sf (float32 division once per block). The package has no global scale (gs = 1).
template <ElementCodec kCodec, int kQmax>
struct Ue4m3Recipe {
  static constexpr int kGroup = 16;
  static constexpr ElementCodec kElement = kCodec;
  static constexpr uint8_t kScaleNan = 0x7F;
  static constexpr bool kSearchesScale = false;

  __host__ __device__ static float decode_scale(uint8_t b) { return ue4m3_decode(b); }

  __host__ __device__ static uint8_t scale_code(float amax) { return e4m3_encode(amax / float(kQmax)); }

  __host__ __device__ static float element_factor(uint8_t scale) {
    return scale == 0 ? 0.0f : 1.0f / ue4m3_decode(scale);
  }

  // A zero scale zeroes the block's codes (no -0 codes either).
  __host__ __device__ static uint8_t code_mask(uint8_t scale) { return scale == 0 ? 0 : 0xFF; }
};

using Nvfp4Recipe = Ue4m3Recipe<ElementCodec::E2M1, 6>;
using E0m3Recipe = Ue4m3Recipe<ElementCodec::E0M3, 7>;

// NVFP4 with a least-squares block scale (stored exactly like NVFP4). Candidates are the UE4M3
// codes c, c-1, c+1, c-2, c+2 around the RTN code c, tried in that order, skipping codes outside
// [1, 126] (0 zeroes the block, 127 is NaN). Each is scored by the float32 sum, in element order,
// of (x_i - v_i)^2 with v_i = e2m1(x_i / sf) * sf (exact); a candidate replaces the best only with
// a strictly smaller sum, so ties keep the earlier one, RTN first, and no block's error exceeds
// NVFP4's. c == 0 gives NVFP4's all-zero block.
struct Nvfp4MseRecipe : Nvfp4Recipe {
  static constexpr bool kSearchesScale = true;
  static constexpr int kLargestScale = 0x7E;  // 448

  // `error` plus the squared errors of x[0..n) at scale code sf, added one by one in order.
  template <int n>
  __host__ __device__ static float accumulate_error(const float* x, uint8_t sf, float error) {
    const float factor = element_factor(sf);
    const float scale = ue4m3_decode(sf);
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const float d = sub_rn(x[i], mul_rn(e2m1_decode(e2m1_encode(x[i] * factor)), scale));
      error = add_rn(error, mul_rn(d, d));
    }
    return error;
  }

  // The least-squares code, given error_of(code) = the whole block's error at that code. Every
  // candidate is scored, usable or not, so lanes sharing a block stay converged for error_of.
  template <class ErrorOf>
  __host__ __device__ static uint8_t choose_scale(uint8_t rtn, ErrorOf error_of) {
    constexpr int kOffsets[] = {-1, 1, -2, 2};
    uint8_t best = rtn == 0 ? 1 : rtn;
    float best_error = error_of(best);
#pragma unroll
    for (const int offset : kOffsets) {
      const int sf = rtn + offset;
      const bool usable = sf >= 1 && sf <= kLargestScale;
      const float error = error_of(uint8_t(usable ? sf : best));
      if (usable && error < best_error) {
        best = uint8_t(sf);
        best_error = error;
      }
    }
    return rtn == 0 ? 0 : best;
  }
};

// max |x| over n values as float32 bits: NaN > Inf > every finite value, so one integer max also
// tells whether a block holds a non-finite value (bits >= 0x7F800000).
template <int n>
__host__ __device__ __forceinline__ uint32_t amax_bits(const float* x) {
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < n; ++i) {
    const uint32_t magnitude = float_bits(x[i]) & 0x7FFFFFFFu;
    amax = magnitude > amax ? magnitude : amax;
  }
  return amax;
}

// Codes of x[0..n) at a block's scale byte.
template <class Traits, int n>
__host__ __device__ __forceinline__ void encode_elements(const float* x, uint8_t scale, uint8_t* codes) {
  const float factor = Traits::element_factor(scale);
  const uint8_t mask = Traits::code_mask(scale);
#pragma unroll
  for (int i = 0; i < n; ++i) codes[i] = encode_element<Traits::kElement>(x[i] * factor) & mask;
}

// Quantize one whole block in one thread: non-finite input gives the NaN scale and all-zero codes.
template <class Traits>
__host__ __device__ __forceinline__ uint8_t quantize_block(const float* x, uint8_t* codes) {
  constexpr int G = Traits::kGroup;
  const uint32_t amax = amax_bits<G>(x);
  if (amax >= 0x7F800000u) {
#pragma unroll
    for (int i = 0; i < G; ++i) codes[i] = 0;
    return Traits::kScaleNan;
  }
  uint8_t scale = Traits::scale_code(float_from_bits(amax));
  if constexpr (Traits::kSearchesScale) {
    scale = Traits::choose_scale(scale, [&](uint8_t sf) { return Traits::template accumulate_error<G>(x, sf, 0.0f); });
  }
  encode_elements<Traits, G>(x, scale, codes);
  return scale;
}

}  // namespace fp4_gemm
