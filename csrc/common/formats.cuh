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

// [0, 1]; NaN -> 0 (the device's .sat modifier).
__host__ __device__ __forceinline__ float saturate(float v) {
#ifdef __CUDA_ARCH__
  return __saturatef(v);
#else
  return v > 0.0f ? (v < 1.0f ? v : 1.0f) : 0.0f;
#endif
}

// Adding 2^23 rounds a float32 in [0, 2^23) to an integer, ties to even, and leaves the integer in
// the low mantissa bits: the bits are kRoundingBits + the integer.
constexpr float kRounding = 8388608.0f;
constexpr uint32_t kRoundingBits = 0x4B000000u;

// A magnitude code as three saturated pieces, each kRounding + a small integer. The encoders are
// exact FMUL/FFMA/FADD with saturation only, so they run on the FMA pipe: the quantizers are short
// of ALU issue slots (half the FMA pipe's throughput), not of memory bandwidth.
struct RoundingPieces {
  float low, mid, high;
  // The code: the pieces' integers added.
  __host__ __device__ uint32_t code() const { return code_bits() - 3 * kRoundingBits; }
  // The code plus 3 * kRoundingBits: a packer adds these and removes the bias once per word.
  __host__ __device__ uint32_t code_bits() const { return float_bits(low) + float_bits(mid) + float_bits(high); }
};

// E2M1 steps are 0.5 below 2, 1 up to 4 and 2 up to 6, so the magnitude code of |x| is
//   rint(2 min(|x|, 2)) + rint(clamp(|x|, 2, 4) - 2) + rint(clamp(|x|, 4, 6) / 2 - 2)
// (the integer rounding's ties to even are the even codes'; clamping at 6 saturates). Each piece
// is formed exactly (|x| / 2 - 1 and |x| / 2 - 2 are exact where they are not saturated).
// Checked equal to the midpoint rule (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
// 3.5 -> 4, 5 -> 4) on every non-NaN float32.
__host__ __device__ __forceinline__ RoundingPieces e2m1_pieces(float x) {
  const float a = fabsf(x);
  return {fmaf(saturate(a * 0.5f), 4.0f, kRounding), fmaf(saturate(fmaf(a, 0.5f, -1.0f)), 2.0f, kRounding),
          saturate(fmaf(a, 0.5f, -2.0f)) + kRounding};
}

__host__ __device__ __forceinline__ uint8_t e2m1_encode(float x) {
  return uint8_t(e2m1_pieces(x).code() | sign_nibble(x));
}

__host__ __device__ __forceinline__ float e2m1_decode(uint8_t code) {
  const uint8_t m = code & 7;
  const float magnitude = m < 4 ? 0.5f * m : exp2i((m >> 1) - 1) * (1.0f + 0.5f * (m & 1));
  return (code & 8) ? -magnitude : magnitude;
}

// e2m1_decode(e2m1_encode(x)) for non-NaN x, from the pieces: low / 2 + mid + 2 high, x's sign.
__host__ __device__ __forceinline__ float e2m1_round(float x) {
  const RoundingPieces p = e2m1_pieces(x);
  return copysignf(fmaf(p.high - kRounding, 2.0f, fmaf(p.low - kRounding, 0.5f, p.mid - kRounding)), x);
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

// min(rint(|x|), 7) as rint(min(|x|, 4)) + rint(clamp(|x|, 4, 6) - 4) + rint(clamp(|x|, 6, 7) - 6),
// like e2m1_pieces (checked equal to the clamp-and-round rule on every non-NaN float32).
__host__ __device__ __forceinline__ RoundingPieces e0m3_pieces(float x) {
  const float a = fabsf(x);
  return {fmaf(saturate(a * 0.25f), 4.0f, kRounding), fmaf(saturate(fmaf(a, 0.5f, -2.0f)), 2.0f, kRounding),
          saturate(a - 6.0f) + kRounding};
}

__host__ __device__ __forceinline__ uint8_t e0m3_encode(float x) {
  const uint32_t magnitude = e0m3_pieces(x).code();
  return magnitude == 0 ? 0 : uint8_t(magnitude | sign_nibble(x));
}

__host__ __device__ __forceinline__ float e0m3_decode(uint8_t code) {
  const float magnitude = float(code & 7);
  return (code & 8) ? -magnitude : magnitude;
}

// An E0M3 integer v is the sum of two E2M1 values with its sign: 2 floor(v / 2) (0, 2, 4 or 6: E2M1
// codes 0, 4, 6, 7) and v mod 2 (0 or 1: codes 0, 2). With q = floor(v / 2) = (q1 q0) in binary the
// first code is (q1 | q0, q1, q1 & q0). Both act on 16 codes at once, one per nibble.
constexpr uint64_t kLowBitOfNibbles = 0x1111111111111111ull;

__host__ __device__ __forceinline__ uint64_t e0m3_even_part_e2m1x16(uint64_t codes) {
  const uint64_t signs = codes & (kLowBitOfNibbles << 3);
  const uint64_t q0 = (codes >> 1) & kLowBitOfNibbles, q1 = (codes >> 2) & kLowBitOfNibbles;
  return signs | ((q1 | q0) << 2) | (q1 << 1) | (q1 & q0);
}

__host__ __device__ __forceinline__ uint64_t e0m3_odd_part_e2m1x16(uint64_t codes) {
  return (codes & (kLowBitOfNibbles << 3)) | ((codes & kLowBitOfNibbles) << 1);
}

// ---- block scales -----------------------------------------------------------------------------

__host__ __device__ __forceinline__ float ue8m0_decode(uint8_t b) { return b == 0xFF ? NAN : exp2i(int(b) - 127); }

// e4m3_decode's value; on the device by the hardware conversion (every E4M3 value is an fp16).
__host__ __device__ __forceinline__ float ue4m3_decode(uint8_t b) {
#ifdef __CUDA_ARCH__
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
#else
  return e4m3_decode(b);
#endif
}

// ---- block recipes ----------------------------------------------------------------------------
// One recipe per quantization mode: block size, element codec and scale rule. `scale_code` is the
// round-to-nearest scale byte of a finite amax, `element_factor` the multiplier applied to elements
// before encoding, `zeroes_codes` whether a scale byte zeroes every code, `decode_scale` a scale
// byte's value. Recipes with `kSearchesScale` pick the scale by least squared error instead.

enum class ElementCodec { E4M3, E2M1, E0M3 };

// Bytes a block of G codes takes in memory: E4M3 bytes, or nibbles (element 2i in the low nibble).
template <ElementCodec kCodec, int G>
constexpr int kStoredBytes = kCodec == ElementCodec::E4M3 ? G : G / 2;

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

  __host__ __device__ static bool zeroes_codes(uint8_t) { return false; }
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

  // amax / qmax by one multiply and one remainder correction (Markstein): the correctly rounded
  // float32 quotient wherever it is at least 2^-125, which covers every quotient that rounds to a
  // nonzero E4M3 (checked against the IEEE division on every finite float32, qmax 6 and 7).
  __host__ __device__ static uint8_t scale_code(float amax) {
    constexpr float kInverse = 1.0f / float(kQmax);
    const float q = amax * kInverse;
    return e4m3_encode(fmaf(fmaf(-q, float(kQmax), amax), kInverse, q));
  }

  __host__ __device__ static float element_factor(uint8_t scale) {
    return scale == 0 ? 0.0f : 1.0f / ue4m3_decode(scale);
  }

  // A zero scale zeroes the block's codes (no -0 codes either).
  __host__ __device__ static bool zeroes_codes(uint8_t scale) { return scale == 0; }
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

  // The block's squared error at scale code sf, added one element at a time in order.
  template <int n>
  __host__ __device__ static float block_error(const float* x, uint8_t sf) {
    const float factor = element_factor(sf);
    const float scale = ue4m3_decode(sf);
    float error = 0.0f;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const float d = sub_rn(x[i], mul_rn(e2m1_round(x[i] * factor), scale));
      error = add_rn(error, mul_rn(d, d));
    }
    return error;
  }

  template <int n>
  __host__ __device__ static uint8_t choose_scale(const float* x, uint8_t rtn) {
    if (rtn == 0) return 0;
    constexpr int kOffsets[] = {-1, 1, -2, 2};
    uint8_t best = rtn;
    float best_error = block_error<n>(x, best);
#pragma unroll
    for (const int offset : kOffsets) {
      const int sf = rtn + offset;
      if (sf < 1 || sf > kLargestScale) continue;
      const float error = block_error<n>(x, uint8_t(sf));
      if (error < best_error) {
        best = uint8_t(sf);
        best_error = error;
      }
    }
    return best;
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

// ---- packing a block's codes into stored words ------------------------------------------------
// A stored word holds four E4M3 bytes or eight nibbles (element 8w + j in nibble j of word w).
// The nibble packers take the block's sign bits per word (bit 4j + 3 set for a negative element j)
// from the caller, who can read them off its inputs' bits more cheaply than per element.

// Sign bits of x[0..n) per stored word.
template <int n>
__host__ __device__ __forceinline__ void nibble_signs(const float* x, uint32_t* signs) {
#pragma unroll
  for (int w = 0; w < n / 8; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) word |= (float_bits(x[8 * w + j]) >> 31) << (4 * j + 3);
    signs[w] = word;
  }
}

// Codes of x[0..n) (already multiplied by the block's factor), packed: the pieces of each element
// are added in at its nibble, and their bias taken off once per word (all modulo 2^32; no carries,
// as codes are below 8).
template <ElementCodec kCodec, int n>
__host__ __device__ __forceinline__ void pack_codes(const float* x, const uint32_t* signs, uint32_t* stored) {
  if constexpr (kCodec == ElementCodec::E4M3) {
#pragma unroll
    for (int w = 0; w < n / 4; ++w) {
      const float* v = x + 4 * w;
      const uint32_t low = __nv_cvt_float2_to_fp8x2(float2{v[0], v[1]}, __NV_SATFINITE, __NV_E4M3);
      const uint32_t high = __nv_cvt_float2_to_fp8x2(float2{v[2], v[3]}, __NV_SATFINITE, __NV_E4M3);
      stored[w] = low | high << 16;  // e4m3_encode of each, two at a time
    }
  } else {
    constexpr uint32_t kBias = 3 * kRoundingBits * 0x11111111u;
#pragma unroll
    for (int w = 0; w < n / 8; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float v = x[8 * w + j];
        word += (kCodec == ElementCodec::E2M1 ? e2m1_pieces(v) : e0m3_pieces(v)).code_bits() << (4 * j);
      }
      const uint32_t codes = word - kBias;
      if constexpr (kCodec == ElementCodec::E2M1) {
        stored[w] = codes | signs[w];
      } else {  // E0M3 keeps the sign of nonzero codes only
        const uint32_t nonzero = (codes | codes >> 1 | codes >> 2) & 0x11111111u;
        stored[w] = codes | (signs[w] & nonzero << 3);
      }
    }
  }
}

// Quantize one block of G values into its stored words: amax is max |x| as float32 bits (from
// amax_bits, or read off 16-bit inputs), signs the sign bits per stored word (nibble codecs only).
// Non-finite input gives the NaN scale and all-zero codes.
template <class Traits>
__host__ __device__ __forceinline__ uint8_t quantize_block(const float* x, uint32_t amax, const uint32_t* signs,
                                                           uint32_t* stored) {
  constexpr int G = Traits::kGroup;
  constexpr int kWords = kStoredBytes<Traits::kElement, G> / 4;
  if (amax >= 0x7F800000u) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) stored[w] = 0;
    return Traits::kScaleNan;
  }
  uint8_t scale = Traits::scale_code(float_from_bits(amax));
  if constexpr (Traits::kSearchesScale) scale = Traits::template choose_scale<G>(x, scale);
  const float factor = Traits::element_factor(scale);
  float scaled[G];
#pragma unroll
  for (int i = 0; i < G; ++i) scaled[i] = x[i] * factor;
  pack_codes<Traits::kElement, G>(scaled, signs, stored);
  if (Traits::zeroes_codes(scale)) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) stored[w] = 0;
  }
  return scale;
}

}  // namespace fp4_gemm
