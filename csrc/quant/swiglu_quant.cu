// Fused SwiGLU + quantization kernel: one thread per (row, block) of the swizzled scale grid,
// padding rows and columns included, like the quantize kernel.
//
// A thread first reads its group's count (a cached 4-byte load shared by the whole group) and
// leaves at once when its row is not owned: such rows cost no reads and are never written. Owned
// blocks read g gate and g up values (16-byte loads; consecutive threads take consecutive blocks
// of a row, so a warp reads one contiguous stretch of gate and one of up), evaluate
// swiglu_float32 (math.cuh) per element and quantize the block with the recipe's quantize_block.
// Padding columns of owned rows and padding rows of the grid get scale 0.
#include <cuda_bf16.h>

#include <stdexcept>

#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/common/math.cuh"
#include "csrc/quant/block_io.cuh"
#include "csrc/quant/swiglu_quant.h"

namespace fp4_gemm {
namespace {

struct SwigluQuantParams {
  const __nv_bfloat16* input;
  const int32_t* counts;
  int64_t rows, hidden, rows_per_group;
  int64_t nkb;
  ScaleGrid grid;
  uint8_t* values;
  uint8_t* scales;
  bool vector_loads;   // input is 16-byte aligned (rows and blocks then are too)
  bool vector_stores;  // values are aligned to a whole stored block (up to 16 bytes)
};

template <class Traits>
__global__ void __launch_bounds__(kMatrixThreads) swiglu_quant_kernel(const SwigluQuantParams p) {
  griddep_wait();
  griddep_launch_dependents();
  constexpr int G = Traits::kGroup;
  constexpr int kBlockBytes = kStoredBytes<Traits::kElement, G>;

  const int64_t kb = matrix_col();
  if (kb >= p.grid.cols) return;
  for (int64_t row = matrix_first_row(); row < p.grid.rows; row += matrix_row_stride()) {
    uint8_t scale = 0;  // padding rows, and padding columns of owned rows
    if (row < p.rows) {
      const int64_t group = row / p.rows_per_group;
      // Owned iff row - group * M < clamp(count, 0, M); as row - group * M is in [0, M), comparing
      // with the raw count is the same test (a negative count owns nothing, one above M everything).
      if (row - group * p.rows_per_group >= int64_t(__ldg(p.counts + group))) continue;
      if (kb < p.nkb) {
        const __nv_bfloat16* gate = p.input + row * 2 * p.hidden + kb * G;
        float y[G], up[G];
        load_halves<G>(gate, p.vector_loads, y);
        load_halves<G>(gate + p.hidden, p.vector_loads, up);
#pragma unroll
        for (int i = 0; i < G; ++i) y[i] = swiglu_float32(y[i], up[i]);
        uint32_t signs[G / 8], stored[kBlockBytes / 4];
        if constexpr (Traits::kElement != ElementCodec::E4M3) nibble_signs<G>(y, signs);
        scale = quantize_block<Traits>(y, amax_bits<G>(y), signs, stored);
        store_words<kBlockBytes>(p.values + row * p.nkb * kBlockBytes + kb * kBlockBytes, stored, p.vector_stores);
      }
    }
    p.scales[scale_index(ScaleLayout::Swizzled, row, kb, p.nkb)] = scale;
  }
}

template <class Traits>
void launch(const SwigluQuantProblem& problem, cudaStream_t stream) {
  constexpr int G = Traits::kGroup;
  constexpr int kBlockBytes = kStoredBytes<Traits::kElement, G>;
  SwigluQuantParams p;
  p.input = static_cast<const __nv_bfloat16*>(problem.input);
  p.counts = problem.counts;
  p.rows = problem.rows;
  p.hidden = problem.hidden;
  p.nkb = problem.hidden / G;
  p.grid = scale_grid(ScaleLayout::Swizzled, problem.rows, p.nkb);
  p.values = static_cast<uint8_t*>(problem.values);
  p.scales = problem.scales;
  p.vector_loads = is_aligned(problem.input, 16);
  p.vector_stores = is_aligned(problem.values, kBlockBytes < 16 ? kBlockBytes : 16);

  if (p.grid.rows == 0 || p.grid.cols == 0) return;
  p.rows_per_group = problem.rows / problem.groups;  // > 0 here: rows > 0 is a multiple of groups
  const MatrixLaunch shape = matrix_launch(ceil_div(p.grid.rows, kRowsPerThread<Traits>), p.grid.cols);
  // The op has no pdl argument: launch without programmatic dependent launch.
  launch_kernel(swiglu_quant_kernel<Traits>, shape.grid, shape.block, 0, stream, false, p);
}

}  // namespace

void swiglu_quant(const SwigluQuantProblem& problem, cudaStream_t stream) {
  switch (problem.format) {
    case OperandFormat::Mxfp8:
      return launch<Mxfp8Recipe>(problem, stream);
    case OperandFormat::Nvfp4:
      return launch<Nvfp4Recipe>(problem, stream);
    default:
      throw std::invalid_argument("fp4_gemm::swiglu_quant: the format must be mxfp8 or nvfp4");
  }
}

}  // namespace fp4_gemm
