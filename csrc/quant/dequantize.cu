// Block dequantization kernel: one thread per stretch of 32 elements of a row (one MX block or two
// 16-blocks), so each thread reads 32 (E4M3) or 16 (nibbles) bytes of values with 16-byte loads and
// writes whole blocks of outputs with 16-byte stores; consecutive threads take consecutive
// stretches of a row. A stretch that is short (the last one of a row with an odd number of
// 16-blocks) or not 16-byte aligned (an offset buffer; every other packed row when that number is
// odd) reads bytes one by one; outputs not 16-byte aligned are stored one by one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

#include "csrc/common/dequant.cuh"
#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/quant/dequantize.h"

namespace fp4_gemm {
namespace {

constexpr int kThreadElements = 32;

template <class Out>
struct DequantizeParams {
  const uint8_t* values;
  const uint8_t* scales;
  Out* out;
  int64_t rows, cols;
  int64_t nkb;
  int64_t stretches_per_row;
};

template <class Out>
__device__ __forceinline__ Out from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ float from_float(float v) { return v; }

__device__ __forceinline__ bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// Values of one block's codes (E4M3 bytes, or packed nibbles) times its scale, in Out. UE4M3-scaled
// recipes into a 16-bit type stay in paired 16-bit arithmetic (exact, see dequant.cuh); the rest
// decode to fp16 (exact) and multiply in float32.
template <class Traits, class Out>
__device__ __forceinline__ void decode_block(const uint8_t* codes, uint8_t scale_byte, Out* y) {
  constexpr int G = Traits::kGroup;
  constexpr bool kPaired = (std::is_same_v<Traits, Nvfp4Recipe> || std::is_same_v<Traits, E0m3Recipe>) &&
                           !std::is_same_v<Out, float>;
  if constexpr (kPaired) {
#pragma unroll
    for (int w = 0; w < G / 8; ++w) {
      typename Pair<Out>::Type v[4];
      const uint32_t word = reinterpret_cast<const uint32_t*>(codes)[w];
      if constexpr (Traits::kElement == ElementCodec::E2M1) {
        dequant_e2m1x8<Out>(word, v);
      } else {
        dequant_e0m3x8<Out>(word, v);
      }
      scale_ue4m3<Out>(v, scale_byte);
#pragma unroll
      for (int p = 0; p < 4; ++p) reinterpret_cast<typename Pair<Out>::Type*>(y)[4 * w + p] = v[p];
    }
  } else {
    constexpr int kPerWord = Traits::kElement == ElementCodec::E4M3 ? 4 : 8;
    const float scale = Traits::decode_scale(scale_byte);
#pragma unroll
    for (int w = 0; w < G / kPerWord; ++w) {
      __half2 v[4];
      const uint32_t word = reinterpret_cast<const uint32_t*>(codes)[w];
      if constexpr (Traits::kElement == ElementCodec::E4M3) {
        dequant_e4m3x4<__half>(word, reinterpret_cast<__half2(&)[2]>(v));
      } else if constexpr (Traits::kElement == ElementCodec::E2M1) {
        dequant_e2m1x8<__half>(word, v);
      } else {
        dequant_e0m3x8<__half>(word, v);
      }
#pragma unroll
      for (int p = 0; p < kPerWord / 2; ++p) {
        const float2 f = __half22float2(v[p]);  // exact; NaN scale -> NaN block
        y[kPerWord * w + 2 * p] = from_float<Out>(f.x * scale);
        y[kPerWord * w + 2 * p + 1] = from_float<Out>(f.y * scale);
      }
    }
  }
}

template <class Traits, class Out, ScaleLayout kLayout>
__global__ void __launch_bounds__(kMatrixThreads) dequantize_kernel(const DequantizeParams<Out> p) {
  griddep_wait();
  griddep_launch_dependents();
  constexpr int G = Traits::kGroup;
  constexpr int kBlocks = kThreadElements / G;
  constexpr bool kByteCodes = Traits::kElement == ElementCodec::E4M3;  // else packed nibbles
  constexpr int kValueBytes = kByteCodes ? kThreadElements : kThreadElements / 2;
  constexpr int kBlockValueBytes = kValueBytes / kBlocks;
  constexpr int kBlockOutVectors = G * int(sizeof(Out)) / 16;
  static_assert(kThreadElements % G == 0 && kValueBytes % 16 == 0, "whole blocks, whole 16-byte loads");
  static_assert(G * sizeof(Out) % 16 == 0, "a block of outputs is whole 16-byte stores");

  const int64_t stretch = matrix_col();
  if (stretch >= p.stretches_per_row) return;
  const int64_t kb0 = stretch * kBlocks;
  const int blocks = p.nkb - kb0 < kBlocks ? int(p.nkb - kb0) : kBlocks;
  for (int64_t row = matrix_first_row(); row < p.rows; row += matrix_row_stride()) {
    const uint8_t* src = p.values + (row * p.nkb + kb0) * kBlockValueBytes;
    alignas(16) uint8_t bytes[kValueBytes];
    if (blocks == kBlocks && aligned16(src)) {
  #pragma unroll
      for (int v = 0; v < kValueBytes / 16; ++v) {
        reinterpret_cast<uint4*>(bytes)[v] = __ldg(reinterpret_cast<const uint4*>(src) + v);
      }
    } else {
  #pragma unroll
      for (int i = 0; i < kValueBytes; ++i) bytes[i] = i < blocks * kBlockValueBytes ? __ldg(src + i) : 0;
    }

    Out* dst = p.out + row * p.cols + kb0 * G;
    const bool vector_stores = aligned16(dst);  // blocks of outputs are whole 16-byte multiples
  #pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      if (b == blocks) break;
      alignas(16) Out y[G];
      decode_block<Traits>(bytes + b * kBlockValueBytes, __ldg(p.scales + scale_index(kLayout, row, kb0 + b, p.nkb)), y);
      if (vector_stores) {
  #pragma unroll
        for (int v = 0; v < kBlockOutVectors; ++v) {
          reinterpret_cast<uint4*>(dst + b * G)[v] = reinterpret_cast<const uint4*>(y)[v];
        }
      } else {
  #pragma unroll
        for (int i = 0; i < G; ++i) dst[b * G + i] = y[i];
      }
    }
  }
}

template <class Traits, class Out, ScaleLayout kLayout>
void launch(const DequantizeProblem& problem, cudaStream_t stream) {
  constexpr int G = Traits::kGroup;
  DequantizeParams<Out> p;
  p.values = static_cast<const uint8_t*>(problem.values);
  p.scales = problem.scales;
  p.out = static_cast<Out*>(problem.out);
  p.rows = problem.rows;
  p.cols = problem.cols;
  p.nkb = problem.cols / G;
  p.stretches_per_row = ceil_div(p.nkb, kThreadElements / G);

  if (p.rows == 0 || p.stretches_per_row == 0) return;
  const MatrixLaunch shape = matrix_launch(p.rows, p.stretches_per_row);
  launch_kernel(dequantize_kernel<Traits, Out, kLayout>, shape.grid, shape.block, 0, stream, problem.pdl, p);
}

template <class Traits, class Out>
void dispatch_layout(const DequantizeProblem& problem, cudaStream_t stream) {
  problem.layout == ScaleLayout::Swizzled ? launch<Traits, Out, ScaleLayout::Swizzled>(problem, stream)
                                          : launch<Traits, Out, ScaleLayout::Plain>(problem, stream);
}

template <class Traits>
void dispatch_types(const DequantizeProblem& problem, cudaStream_t stream) {
  switch (problem.out_type) {
    case FloatType::Bf16:
      return dispatch_layout<Traits, __nv_bfloat16>(problem, stream);
    case FloatType::Fp16:
      return dispatch_layout<Traits, __half>(problem, stream);
    case FloatType::Fp32:
      return dispatch_layout<Traits, float>(problem, stream);
  }
  throw std::invalid_argument("fp4_gemm::dequantize: unknown output type");
}

}  // namespace

void dequantize(const DequantizeProblem& problem, cudaStream_t stream) {
  switch (problem.recipe) {
    case Recipe::Mxfp8:
      return dispatch_types<Mxfp8Recipe>(problem, stream);
    case Recipe::Mxfp4:
      return dispatch_types<Mxfp4Recipe>(problem, stream);
    case Recipe::Nvfp4:
    case Recipe::Nvfp4Mse:  // same stored encoding; the scale choice does not matter here
      return dispatch_types<Nvfp4Recipe>(problem, stream);
    case Recipe::E0m3:
      return dispatch_types<E0m3Recipe>(problem, stream);
  }
  throw std::invalid_argument("fp4_gemm::dequantize: unknown recipe");
}

}  // namespace fp4_gemm
