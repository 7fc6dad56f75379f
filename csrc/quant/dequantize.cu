// Block dequantization kernel: each lane takes one 8-element word of a row, so a warp reads its
// codes (4 bytes of nibbles or 8 E4M3 bytes a lane) and writes its outputs (16 or 32 bytes a lane)
// as contiguous stretches; each lane looks up its block's scale byte. A thread takes that word in
// kRowsPerThread consecutive rows and issues all their loads before the first decode: with one row
// a thread, a 4-byte load was all a thread had in flight, and the kernel ran at 0.79 of copy
// bandwidth. A pair of matrices (a GEMM's A and B, dequantize_pair) is one launch over the rows of
// both. Unaligned buffers fall back to byte-wise loads and element-wise stores.
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

constexpr int kWord = 8;          // elements per lane
constexpr int kRowsPerThread = 4;  // rows whose loads a thread has in flight at once

template <class Out>
struct DequantizeMatrix {
  const uint8_t* values;
  const uint8_t* scales;
  Out* out;
  int64_t rows;
};

template <class Out>
struct DequantizeParams {
  DequantizeMatrix<Out> first, second;  // second: a pair's (0 rows otherwise)
  int64_t first_groups;                 // the launch's row groups before the second matrix's
  int64_t groups;
  int64_t cols;
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

// One word of codes: the lane's 4 or 8 bytes at src.
template <class Traits>
__device__ __forceinline__ void load_word(const uint8_t* src, bool vector_loads, uint32_t (&codes)[2]) {
  constexpr int kCodeBytes = Traits::kElement == ElementCodec::E4M3 ? 8 : 4;
  codes[0] = codes[1] = 0;
  if (vector_loads) {
#pragma unroll
    for (int w = 0; w < kCodeBytes / 4; ++w) codes[w] = __ldg(reinterpret_cast<const uint32_t*>(src) + w);
  } else {
#pragma unroll
    for (int i = 0; i < kCodeBytes; ++i) codes[i / 4] |= uint32_t(__ldg(src + i)) << (8 * (i % 4));
  }
}

template <class Out>
__device__ __forceinline__ void store_word(Out* dst, bool vector_stores, const Out (&y)[kWord]) {
  if (vector_stores) {
#pragma unroll
    for (int v = 0; v < int(sizeof(y)) / 16; ++v) reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(y)[v];
  } else {
#pragma unroll
    for (int i = 0; i < kWord; ++i) dst[i] = y[i];
  }
}

// The launch's rows are groups of kRowsPerThread rows: the first matrix's, then the second's. A
// group's rows share one 32-row stretch of a swizzled scale tile (kRowsPerThread divides 32), so
// their scale bytes lie 16 bytes apart; the addresses are the group's first row's plus a step.
template <class Traits, class Out, ScaleLayout kLayout>
__global__ void __launch_bounds__(kMatrixThreads) dequantize_kernel(const DequantizeParams<Out> p) {
  static_assert(32 % kRowsPerThread == 0, "a group of rows inside one 32-row stretch of a scale tile");
  griddep_wait();
  griddep_launch_dependents();
  constexpr int kLanes = Traits::kGroup / kWord;
  constexpr int kCodeBytes = Traits::kElement == ElementCodec::E4M3 ? 8 : 4;
  const int64_t word = matrix_col();
  if (word >= p.cols / kWord) return;
  const int64_t kb = word / kLanes;
  const int64_t code_row_bytes = p.cols / kWord * kCodeBytes;
  const int64_t scale_row_step = kLayout == ScaleLayout::Swizzled ? 16 : p.nkb;
  for (int64_t group = matrix_first_row(); group < p.groups; group += matrix_row_stride()) {
    const bool second = group >= p.first_groups;
    const DequantizeMatrix<Out> m = second ? p.second : p.first;
    const int64_t row0 = (second ? group - p.first_groups : group) * kRowsPerThread;
    const uint8_t* codes0 = m.values + row0 * code_row_bytes + word * kCodeBytes;
    const uint8_t* scales0 = m.scales + scale_index(kLayout, row0, kb, p.nkb);
    uint32_t codes[kRowsPerThread][2];
    uint8_t scale_bytes[kRowsPerThread];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      // Rows past the last read the group's first row again (not stored): clamped, not
      // predicated, so that every load is issued ahead of the decodes.
      const int step = row0 + r < m.rows ? r : 0;
      load_word<Traits>(codes0 + step * code_row_bytes, p.vector_loads, codes[r]);
      scale_bytes[r] = __ldg(scales0 + step * scale_row_step);
    }
    Out* out0 = m.out + row0 * p.cols + word * kWord;
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      if (row0 + r >= m.rows) break;
      alignas(16) Out y[kWord];
      decode_word<Traits>(codes[r], scale_bytes[r], y);
      store_word(out0 + r * p.cols, p.vector_stores, y);
    }
  }
}

template <class Out>
DequantizeMatrix<Out> matrix_of(const DequantizeProblem* problem) {
  if (problem == nullptr) return {nullptr, nullptr, nullptr, 0};
  return {static_cast<const uint8_t*>(problem->values), problem->scales, static_cast<Out*>(problem->out),
          problem->rows};
}

// `first`, and `second` (null, or a matrix of first's recipe, layout, columns and output type).
template <class Traits, class Out, ScaleLayout kLayout>
void launch(const DequantizeProblem& first, const DequantizeProblem* second, cudaStream_t stream) {
  DequantizeParams<Out> p;
  p.first = matrix_of<Out>(&first);
  p.second = matrix_of<Out>(second);
  p.first_groups = ceil_div(p.first.rows, kRowsPerThread);
  p.groups = p.first_groups + ceil_div(p.second.rows, kRowsPerThread);
  p.cols = first.cols;
  p.nkb = first.cols / Traits::kGroup;
  // Rows of codes are whole words (cols % 16 == 0), rows of outputs whole 16-byte multiples.
  p.vector_loads = is_aligned(first.values, 4) && (second == nullptr || is_aligned(second->values, 4));
  p.vector_stores = is_aligned(first.out, 16) && (second == nullptr || is_aligned(second->out, 16));
  if (p.groups == 0 || p.cols == 0) return;
  const MatrixLaunch shape = matrix_launch(p.groups, p.cols / kWord);
  // The op has no pdl argument: launch without programmatic dependent launch.
  launch_kernel(dequantize_kernel<Traits, Out, kLayout>, shape.grid, shape.block, 0, stream, false, p);
}

template <class Traits, class Out>
void dispatch_layout(const DequantizeProblem& first, const DequantizeProblem* second, cudaStream_t stream) {
  first.layout == ScaleLayout::Swizzled ? launch<Traits, Out, ScaleLayout::Swizzled>(first, second, stream)
                                        : launch<Traits, Out, ScaleLayout::Plain>(first, second, stream);
}

template <class Traits>
void dispatch_types(const DequantizeProblem& first, const DequantizeProblem* second, cudaStream_t stream) {
  switch (first.out_type) {
    case FloatType::Bf16:
      return dispatch_layout<Traits, __nv_bfloat16>(first, second, stream);
    case FloatType::Fp16:
      return dispatch_layout<Traits, __half>(first, second, stream);
    case FloatType::Fp32:
      return dispatch_layout<Traits, float>(first, second, stream);
  }
  throw std::invalid_argument("fp4_gemm::dequantize: unknown output type");
}

void dispatch_format(const DequantizeProblem& first, const DequantizeProblem* second, cudaStream_t stream) {
  switch (first.format) {
    case OperandFormat::Mxfp8:
      return dispatch_types<Mxfp8Recipe>(first, second, stream);
    case OperandFormat::Mxfp4:
      return dispatch_types<Mxfp4Recipe>(first, second, stream);
    case OperandFormat::Nvfp4:
      return dispatch_types<Nvfp4Recipe>(first, second, stream);
    case OperandFormat::E0m3:
      return dispatch_types<E0m3Recipe>(first, second, stream);
    default:
      throw std::invalid_argument("fp4_gemm::dequantize: a bf16 format has no scales");
  }
}

}  // namespace

void dequantize(const DequantizeProblem& problem, cudaStream_t stream) { dispatch_format(problem, nullptr, stream); }

bool pairable(const DequantizeProblem& first, const DequantizeProblem& second) {
  return first.format == second.format && first.layout == second.layout &&
         first.cols == second.cols && first.out_type == second.out_type;
}

void dequantize_pair(const DequantizeProblem& first, const DequantizeProblem& second, cudaStream_t stream) {
  if (!pairable(first, second)) throw std::invalid_argument("fp4_gemm::dequantize_pair: the matrices are not pairable");
  dispatch_format(first, &second, stream);
}

}  // namespace fp4_gemm
