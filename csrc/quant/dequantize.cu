// Block dequantization kernel: each lane takes one 8-element word of a row, so a warp reads its
// codes (4 bytes of nibbles or 8 E4M3 bytes a lane) and writes its outputs (16 or 32 bytes a lane)
// as contiguous stretches; each lane looks up its block's scale byte. Unaligned buffers fall back to
// byte-wise loads and element-wise stores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <type_traits>

#include "csrc/common/dequant.cuh"
#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/quant/dequantize.h"

namespace fp4_gemm {
namespace {

constexpr int kWord = 8;  // elements per lane

template <class Out>
struct DequantizeParams {
  const uint8_t* values;
  const uint8_t* scales;
  Out* out;
  int64_t rows, cols;
  int64_t nkb;
  bool vector_loads;   // a lane's code bytes can be read in one access
  bool vector_stores;  // a lane's outputs can be written in 16-byte accesses
};

template <class Out>
__device__ __forceinline__ Out from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ float from_float(float v) { return v; }

// Values of one word of codes times its block's scale, in Out. UE4M3-scaled recipes into a 16-bit
// type stay in paired 16-bit arithmetic (exact, see dequant.cuh); the rest decode to fp16 (exact)
// and multiply in float32.
template <class Traits, class Out>
__device__ __forceinline__ void decode_word(const uint32_t (&codes)[2], uint8_t scale_byte, Out (&y)[kWord]) {
  constexpr bool kPaired = (std::is_same_v<Traits, Nvfp4Recipe> || std::is_same_v<Traits, E0m3Recipe>) &&
                           !std::is_same_v<Out, float>;
  if constexpr (kPaired) {
    typename Pair<Out>::Type v[4];
    if constexpr (Traits::kElement == ElementCodec::E2M1) {
      dequant_e2m1x8<Out>(codes[0], v);
    } else {
      dequant_e0m3x8<Out>(codes[0], v);
    }
    scale_ue4m3<Out>(v, scale_byte);
#pragma unroll
    for (int p = 0; p < 4; ++p) reinterpret_cast<typename Pair<Out>::Type*>(y)[p] = v[p];
  } else {
    __half2 v[4];
    if constexpr (Traits::kElement == ElementCodec::E4M3) {
      dequant_e4m3x4<__half>(codes[0], reinterpret_cast<__half2(&)[2]>(v[0]));
      dequant_e4m3x4<__half>(codes[1], reinterpret_cast<__half2(&)[2]>(v[2]));
    } else if constexpr (Traits::kElement == ElementCodec::E2M1) {
      dequant_e2m1x8<__half>(codes[0], v);
    } else {
      dequant_e0m3x8<__half>(codes[0], v);
    }
    const float scale = Traits::decode_scale(scale_byte);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float2 f = __half22float2(v[p]);  // exact; a NaN scale makes the block NaN
      y[2 * p] = from_float<Out>(f.x * scale);
      y[2 * p + 1] = from_float<Out>(f.y * scale);
    }
  }
}

template <class Traits, class Out, ScaleLayout kLayout>
__global__ void __launch_bounds__(kMatrixThreads) dequantize_kernel(const DequantizeParams<Out> p) {
  griddep_wait();
  griddep_launch_dependents();
  constexpr int kLanes = Traits::kGroup / kWord;
  constexpr int kCodeBytes = Traits::kElement == ElementCodec::E4M3 ? 8 : 4;
  const int64_t word = matrix_col();
  if (word >= p.cols / kWord) return;
  const int64_t kb = word / kLanes;
  for (int64_t row = matrix_first_row(); row < p.rows; row += matrix_row_stride()) {
    const uint8_t* src = p.values + (row * p.cols / kWord + word) * kCodeBytes;
    uint32_t codes[2] = {0, 0};
    if (p.vector_loads) {
#pragma unroll
      for (int w = 0; w < kCodeBytes / 4; ++w) codes[w] = __ldg(reinterpret_cast<const uint32_t*>(src) + w);
    } else {
#pragma unroll
      for (int i = 0; i < kCodeBytes; ++i) codes[i / 4] |= uint32_t(__ldg(src + i)) << (8 * (i % 4));
    }
    alignas(16) Out y[kWord];
    decode_word<Traits>(codes, __ldg(p.scales + scale_index(kLayout, row, kb, p.nkb)), y);
    Out* dst = p.out + row * p.cols + word * kWord;
    if (p.vector_stores) {
#pragma unroll
      for (int v = 0; v < int(sizeof(y)) / 16; ++v) reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(y)[v];
    } else {
#pragma unroll
      for (int i = 0; i < kWord; ++i) dst[i] = y[i];
    }
  }
}

template <class Traits, class Out, ScaleLayout kLayout>
void launch(const DequantizeProblem& problem, cudaStream_t stream) {
  DequantizeParams<Out> p;
  p.values = static_cast<const uint8_t*>(problem.values);
  p.scales = problem.scales;
  p.out = static_cast<Out*>(problem.out);
  p.rows = problem.rows;
  p.cols = problem.cols;
  p.nkb = problem.cols / Traits::kGroup;
  p.vector_loads = is_aligned(problem.values, 4);  // rows of codes are whole words (cols % 16 == 0)
  p.vector_stores = is_aligned(problem.out, 16);   // rows of outputs are whole 16-byte multiples
  if (p.rows == 0 || p.cols == 0) return;
  const MatrixLaunch shape = matrix_launch(p.rows, p.cols / kWord);
  // The op has no pdl argument: launch without programmatic dependent launch.
  launch_kernel(dequantize_kernel<Traits, Out, kLayout>, shape.grid, shape.block, 0, stream, false, p);
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
