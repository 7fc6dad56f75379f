// The GEMM epilogue every backend applies to a float32 accumulator (docs/FORMATS.md, "GEMM result"):
// y = alpha_scale * alpha * acc + bias[n] + residual[m, n], then the activation, then the output
// type. Float32 throughout; GELU is the exact erf form, written with erfc like the reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "csrc/common/dequant.cuh"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

__device__ __forceinline__ float load_as_float(const void* base, FloatType type, int64_t i) {
  switch (type) {
    case FloatType::Bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case FloatType::Fp16:
      return __half2float(static_cast<const __half*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ FloatType out_float_type(const GemmEpilogue& e) {
  if (e.out_format == OutFormat::Fp32) return FloatType::Fp32;
  return e.out_format == OutFormat::Fp16 ? FloatType::Fp16 : FloatType::Bf16;
}

// alpha_scale times the device alpha of `group` (read once per thread, no host round trip).
__device__ __forceinline__ float epilogue_alpha(const GemmEpilogue& e, int64_t group) {
  if (e.alpha == nullptr) return e.alpha_scale;
  return e.alpha_scale * e.alpha[e.alpha_count > 1 ? group : 0];
}

__device__ __forceinline__ float activate(Activation act, float y) {
  switch (act) {
    case Activation::Gelu:
      return 0.5f * y * erfcf(-y * 0.70710678118654752f);
    case Activation::Relu2: {
      // relu(y)^2 with NaN kept, as the reference's torch.relu: NaN fails the comparison (fmaxf(NaN, 0)
      // would give 0); -0 and -inf give 0.
      const float r = y <= 0.0f ? 0.0f : y;
      return r * r;
    }
    default:
      return y;
  }
}

// bias[n] of row `group` if the bias is per group (e.bias set).
__device__ __forceinline__ float bias_at(const GemmEpilogue& e, int64_t n, int64_t width, int64_t group) {
  return load_as_float(e.bias, e.bias_type, (e.bias_per_group ? group * width : 0) + n);
}

// The epilogue's sum of one element (row m, column n of an N-wide output) before the activation,
// with the bias already read (bias_at; unused without one): alpha * acc + bias + residual[m, n].
__device__ __forceinline__ float epilogue_sum_with_bias(const GemmEpilogue& e, float acc, float alpha, float bias,
                                                        int64_t m, int64_t n, int64_t width) {
  float y = acc * alpha;
  if (e.bias != nullptr) y += bias;
  if (e.residual != nullptr) y += load_as_float(e.residual, out_float_type(e), m * width + n);
  return y;
}

__device__ __forceinline__ float epilogue_sum(const GemmEpilogue& e, float acc, float alpha, int64_t m, int64_t n,
                                              int64_t width, int64_t group) {
  const float bias = e.bias != nullptr ? bias_at(e, n, width, group) : 0.0f;
  return epilogue_sum_with_bias(e, acc, alpha, bias, m, n, width);
}

// Epilogue of one element of a float output: the activation of epilogue_sum.
__device__ __forceinline__ float epilogue_value(const GemmEpilogue& e, float acc, float alpha, int64_t m, int64_t n,
                                                int64_t width, int64_t group) {
  return activate(e.activation, epilogue_sum(e, acc, alpha, m, n, width, group));
}

__host__ __device__ __forceinline__ bool nvfp4_output(const GemmEpilogue& e) {
  return e.out_format == OutFormat::Nvfp4 || e.out_format == OutFormat::Nvfp4FromFp16;
}

// What an NVFP4 output encodes at one column, from epilogue_sum's y (NVFP4 outputs have no
// residual): act(y0), or under GeGLU gelu(y0) * y1 with y0, y1 the product's columns 2j and 2j + 1,
// rounded to fp16 first where the output says so (`_fp16` outputs, as the reference's .half()).
__device__ __forceinline__ float nvfp4_output_value(const GemmEpilogue& e, float y0, float y1) {
  const float x = e.activation == Activation::Geglu ? activate(Activation::Gelu, y0) * y1 : activate(e.activation, y0);
  return e.out_format == OutFormat::Nvfp4FromFp16 ? __half2float(__float2half_rn(x)) : x;
}

// Stores two adjacent outputs (n, n + 1, n even), as one store when both exist and the address
// allows it (out aligned to two elements).
__device__ __forceinline__ void store_pair(const GemmEpilogue& e, int64_t m, int64_t n, int64_t width, float y0,
                                           float y1) {
  const int64_t i = m * width + n;
  const bool both = n + 1 < width;
  if (e.out_format == OutFormat::Fp32) {
    auto* out = static_cast<float*>(e.out);
    if (both && (width % 2 == 0)) {
      *reinterpret_cast<float2*>(out + i) = make_float2(y0, y1);
      return;
    }
    out[i] = y0;
    if (both) out[i + 1] = y1;
  } else if (e.out_format == OutFormat::Fp16) {
    auto* out = static_cast<__half*>(e.out);
    if (both && (width % 2 == 0)) {
      *reinterpret_cast<__half2*>(out + i) = __floats2half2_rn(y0, y1);
      return;
    }
    out[i] = __float2half_rn(y0);
    if (both) out[i + 1] = __float2half_rn(y1);
  } else {
    auto* out = static_cast<__nv_bfloat16*>(e.out);
    if (both && (width % 2 == 0)) {
      *reinterpret_cast<__nv_bfloat162*>(out + i) = __floats2bfloat162_rn(y0, y1);
      return;
    }
    out[i] = __float2bfloat16_rn(y0);
    if (both) out[i + 1] = __float2bfloat16_rn(y1);
  }
}

// One 8- or 16-byte global store as written (ptr aligned to it). Vector assignments through
// reinterpret_cast came out as scalar stores once inlined into the engine's epilogue.
__device__ __forceinline__ void store_b32x2(void* ptr, uint32_t x, uint32_t y) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(ptr), "r"(x), "r"(y) : "memory");
}

__device__ __forceinline__ void store_b32x4(void* ptr, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

// Two floats rounded to a 16-bit pair (__half or __nv_bfloat16), as bits.
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float x, float y) {
  if constexpr (std::is_same_v<T, __half>) return pair_bits(__floats2half2_rn(x, y));
  return pair_bits(__floats2bfloat162_rn(x, y));
}

// Whether a row of 16-bit outputs may be written eight elements (16 bytes) per store.
__device__ __forceinline__ bool octet_stores(const GemmEpilogue& e, int64_t width) {
  return e.out_format != OutFormat::Fp32 && width % 8 == 0 && reinterpret_cast<uintptr_t>(e.out) % 16 == 0;
}

// Whether store_quad may write four outputs as one store: rows of a multiple of four elements and
// an output aligned to four (uniform per launch; the engine's check of e.out covers pairs only).
__device__ __forceinline__ bool quad_stores(const GemmEpilogue& e, int64_t width) {
  const uintptr_t bytes = e.out_format == OutFormat::Fp32 ? 16 : 8;
  return width % 4 == 0 && reinterpret_cast<uintptr_t>(e.out) % bytes == 0;
}

// Stores four adjacent outputs of row m (columns n .. n + 3, n % 4 == 0; those at or past width are
// not written): one store where `quad` (quad_stores), else as pairs.
__device__ __forceinline__ void store_quad(const GemmEpilogue& e, int64_t m, int64_t n, int64_t width, bool quad,
                                           const float (&y)[4]) {
  if (!quad) {
    store_pair(e, m, n, width, y[0], y[1]);
    if (n + 2 < width) store_pair(e, m, n + 2, width, y[2], y[3]);
    return;
  }
  const int64_t i = m * width + n;
  if (e.out_format == OutFormat::Fp32) {
    store_b32x4(static_cast<float*>(e.out) + i, __float_as_uint(y[0]), __float_as_uint(y[1]), __float_as_uint(y[2]),
                __float_as_uint(y[3]));
  } else if (e.out_format == OutFormat::Fp16) {
    store_b32x2(static_cast<__half*>(e.out) + i, pack_pair<__half>(y[0], y[1]), pack_pair<__half>(y[2], y[3]));
  } else {
    store_b32x2(static_cast<__nv_bfloat16*>(e.out) + i, pack_pair<__nv_bfloat16>(y[0], y[1]),
                pack_pair<__nv_bfloat16>(y[2], y[3]));
  }
}

}  // namespace fp4_gemm
