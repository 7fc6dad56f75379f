// Float32 functions whose every rounding the contract fixes (docs/FORMATS.md, "SwiGLU +
// quantization"), so kernels and reference.exp_float32 / reference.swiglu_float32 agree bit for bit:
//
//   exp(x):   c = clamp(x, -87, 88)   (NaN in gives the same NaN out)
//             n = rint(c * 1.44269504)                       ties to even
//             r = (c - n * 0.693145751953125) - n * 1.428606765330187e-06
//             p = ((((((1/720) r + 1/120) r + 1/24) r + 1/6) r + 1/2) r + 1) r + 1
//             exp = p * 2^n                                  2^n from the exponent bits, n in [-126, 127]
//   swiglu(gate, up) = up * (gate / (1 + exp(-gate)))
//
// Each product, sum and quotient is rounded on its own: mul_rn / add_rn / sub_rn / div_rn are the
// __f*_rn intrinsics on the device (never contracted into an FMA), IEEE operators on the host (where
// they exist so that a host program can check these functions against the reference). Constants
// are the float32 values of reference.py's (the Taylor coefficients are double quotients rounded
// to float32, as torch.tensor(1 / 720, dtype=float32) rounds them). Never build with fast math.
#pragma once

#include <cmath>

#include "csrc/common/formats.cuh"

namespace fp4_gemm {

__host__ __device__ __forceinline__ float div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

constexpr float kExpMin = -87.0f;  // keeps 2^n a normal float32 and p * 2^n finite
constexpr float kExpMax = 88.0f;
constexpr float kExpLog2e = 1.44269504f;
constexpr float kExpLn2Hi = 0.693145751953125f;  // 15 significant bits: n * kExpLn2Hi is exact (|n| <= 127)
constexpr float kExpLn2Lo = 1.428606765330187e-06f;

__host__ __device__ __forceinline__ float exp_float32(float x) {
  if (isnan(x)) return x;  // the reference's clamp keeps NaN, and it returns x itself
  const float clamped = fminf(fmaxf(x, kExpMin), kExpMax);
  // rint by adding 1.5 * 2^23 (ties to even; |c * log2e| < 2^22): the sum's low bits are n, so 2^n
  // is read off them too, with no float-to-integer conversion.
  constexpr float kRint = 12582912.0f;
  const float rounded = add_rn(mul_rn(clamped, kExpLog2e), kRint);
  const float n = sub_rn(rounded, kRint);
  const float r = sub_rn(sub_rn(clamped, mul_rn(n, kExpLn2Hi)), mul_rn(n, kExpLn2Lo));
  // Taylor coefficients, highest degree first (Horner's rule).
  constexpr float kTaylor[] = {float(1.0 / 720), float(1.0 / 120), float(1.0 / 24), float(1.0 / 6), 0.5f, 1.0f, 1.0f};
  float p = kTaylor[0];
#pragma unroll
  for (int i = 1; i < 7; ++i) p = add_rn(mul_rn(p, r), kTaylor[i]);
  return mul_rn(p, float_from_bits((float_bits(rounded) - float_bits(kRint) + 127) << 23));  // n in [-126, 127]
}

__host__ __device__ __forceinline__ float swiglu_float32(float gate, float up) {
  return mul_rn(up, div_rn(gate, add_rn(1.0f, exp_float32(-gate))));
}

}  // namespace fp4_gemm
