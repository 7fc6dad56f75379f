// Block quantization kernel: one thread per block of g elements, every recipe and layout.
//
// Threads walk the whole scale grid of the output (padding rows and columns of a swizzled buffer
// included), so every scale byte is written: real blocks get their scale, padding gets 0. Reads
// outside the input (a padded output) see zeros. Consecutive threads take consecutive blocks of a
// row, so a warp reads one contiguous stretch of the row with 16-byte loads. Each block is read as
// 32-bit words of two elements, from which amax and the code signs come two at a time
// (block_io.cuh); the codes are then encoded on the FMA pipe (formats.cuh). One block a thread:
// two loaded the L2 harder than they saved (docs/PERFORMANCE.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/quant/block_io.cuh"
#include "csrc/quant/quantize.h"

namespace fp4_gemm {
namespace {

template <class T>
struct QuantizeParams {
  const T* input;
  int64_t in_rows, in_cols;
  int64_t out_rows, out_cols;
  uint8_t* values;
  uint8_t* scales;
  int64_t nkb;
  ScaleGrid grid;
  bool vector_loads;   // input rows are 16-byte aligned
  bool vector_stores;  // value rows are aligned to a whole block
};

// The block at (row, col0) as words; zeros outside the input (a padded output).
template <int G, class T>
__device__ __forceinline__ void load_block(const QuantizeParams<T>& p, int64_t row, int64_t col0, uint32_t* words) {
  const T* src = p.input + row * p.in_cols + col0;
  if (row < p.in_rows && col0 + G <= p.in_cols) {
    load_words<G>(src, p.vector_loads, words);
    return;
  }
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(src);
#pragma unroll
  for (int i = 0; i < G; ++i) {
    const uint32_t bits = row < p.in_rows && col0 + i < p.in_cols ? halves[i] : 0;
    words[i / 2] = i % 2 ? words[i / 2] | bits << 16 : bits;
  }
}

template <class Traits, class T, ScaleLayout kLayout>
__global__ void __launch_bounds__(kMatrixThreads) quantize_kernel(const QuantizeParams<T> p) {
  griddep_wait();
  griddep_launch_dependents();
  constexpr int G = Traits::kGroup;
  constexpr int kBlockBytes = kStoredBytes<Traits::kElement, G>;

  const int64_t kb = matrix_col();
  if (kb >= p.grid.cols) return;
  const int64_t row_bytes = p.out_cols / G * kBlockBytes;
  for (int64_t row = matrix_first_row(); row < p.grid.rows; row += matrix_row_stride()) {
    uint8_t scale = 0;
    if (row < p.out_rows && kb < p.nkb) {
      constexpr bool kNibbles = Traits::kElement != ElementCodec::E4M3;
      uint32_t words[G / 2], signs[G / 8], stored[kBlockBytes / 4];
      float x[G];
      load_block<G>(p, row, kb * G, words);
      unpack_words<G, T>(words, x);
      if constexpr (kNibbles) nibble_signs_of_words<G>(words, signs);
      scale = quantize_block<Traits>(x, amax_bits_of_words<G, T>(words), signs, stored);
      store_words<kBlockBytes>(p.values + row * row_bytes + kb * kBlockBytes, stored, p.vector_stores);
    }
    p.scales[scale_index(kLayout, row, kb, p.nkb)] = scale;
  }
}

template <class Traits, class T, ScaleLayout kLayout>
void launch(const QuantizeProblem& problem, cudaStream_t stream) {
  constexpr int G = Traits::kGroup;
  constexpr int kBlockBytes = kStoredBytes<Traits::kElement, G>;
  QuantizeParams<T> p;
  p.input = static_cast<const T*>(problem.input);
  p.in_rows = problem.in_rows;
  p.in_cols = problem.in_cols;
  p.out_rows = problem.out_rows;
  p.out_cols = problem.out_cols;
  p.values = static_cast<uint8_t*>(problem.values);
  p.scales = problem.scales;
  p.nkb = problem.out_cols / G;
  p.grid = scale_grid(kLayout, problem.out_rows, p.nkb);
  p.vector_loads = is_aligned(problem.input, 16) && (problem.in_cols * sizeof(T)) % 16 == 0;
  p.vector_stores = reinterpret_cast<uintptr_t>(problem.values) % (kBlockBytes < 16 ? kBlockBytes : 16) == 0;

  if (p.grid.rows == 0 || p.grid.cols == 0) return;
  const MatrixLaunch shape = matrix_launch(ceil_div(p.grid.rows, kRowsPerThread<Traits>), p.grid.cols);
  launch_kernel(quantize_kernel<Traits, T, kLayout>, shape.grid, shape.block, 0, stream, problem.pdl, p);
}

template <class Traits>
void dispatch_types(const QuantizeProblem& problem, cudaStream_t stream) {
  const bool swizzled = problem.layout == ScaleLayout::Swizzled;
  if (problem.input_type == FloatType::Fp32) throw std::invalid_argument("fp4_gemm::quantize: the input is bf16 or fp16");
  if (problem.input_type == FloatType::Bf16) {
    swizzled ? launch<Traits, __nv_bfloat16, ScaleLayout::Swizzled>(problem, stream)
             : launch<Traits, __nv_bfloat16, ScaleLayout::Plain>(problem, stream);
  } else {
    swizzled ? launch<Traits, __half, ScaleLayout::Swizzled>(problem, stream)
             : launch<Traits, __half, ScaleLayout::Plain>(problem, stream);
  }
}

}  // namespace

void quantize(const QuantizeProblem& problem, cudaStream_t stream) {
  if (problem.least_squares_scale) {
    if (problem.format != OperandFormat::Nvfp4) {
      throw std::invalid_argument("fp4_gemm::quantize: the least-squares scale choice is NVFP4's");
    }
    return dispatch_types<Nvfp4MseRecipe>(problem, stream);
  }
  switch (problem.format) {
    case OperandFormat::Mxfp8:
      return dispatch_types<Mxfp8Recipe>(problem, stream);
    case OperandFormat::Mxfp4:
      return dispatch_types<Mxfp4Recipe>(problem, stream);
    case OperandFormat::Nvfp4:
      return dispatch_types<Nvfp4Recipe>(problem, stream);
    case OperandFormat::E0m3:
      return dispatch_types<E0m3Recipe>(problem, stream);
    default:
      throw std::invalid_argument("fp4_gemm::quantize: a bf16 format has no quantizer");
  }
}

}  // namespace fp4_gemm
