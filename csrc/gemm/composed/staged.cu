// NVFP4 outputs (and GeGLU) that no kernel writes itself, through a stage (docs/FORMATS.md, "GEMM
// result"; reference: reference.gemm_into).
//
// The staged backend has the backend that serves the same problem with a float32 output, and no
// bias or activation, write alpha * A @ B^T into a stage in the scratch. One more kernel finishes
// and encodes the stage: per 16-column block of the result it applies the rest of the shared
// epilogue's operations (epilogue.cuh: + bias, then the activation, or GeGLU's gelu(y[:, 2j]) *
// y[:, 2j + 1]; epilogue.cuh's epilogue_sum and nvfp4_output_value), rounds to fp16 where the
// contract says so (`_fp16` outputs), and encodes the block (nvfp4_output.cuh, bit-exact with
// reference.quantize_blocks) into out and out_scales, every scale byte of the padded grid included.
// So the float32 values encoded are those a fused epilogue would have, and the encoding is the
// reference's: two launches per call, the inner GEMM's and this one.
//
// Served: NVFP4 outputs without a residual where every row is owned (dense and batched problems:
// the whole matrix is encoded), N_out a multiple of 16, when some backend serves the float32
// problem for the same compute capability. It registers after every other backend, so a kernel that
// writes NVFP4 itself runs first (the register-streaming skinny kernel, on decode-sized problems).
#include <stdexcept>

#include "csrc/common/launch.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/dispatch.h"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/nvfp4_output.cuh"
#include "csrc/quant/block_io.cuh"

namespace fp4_gemm {
namespace {

bool geglu(const GemmProblem& p) { return p.epilogue.activation == Activation::Geglu; }

// The float32 stage [M, N].
int64_t stage_bytes(const GemmProblem& p) { return scratch_part_bytes(p.m * p.n * 4); }

// The problem the inner backend computes: alpha * A @ B^T in float32, its out and scratch in `p`'s
// scratch (once allocated).
GemmProblem inner_problem(const GemmProblem& p) {
  GemmProblem inner = p;
  GemmEpilogue& e = inner.epilogue;
  e.out_format = OutFormat::Fp32;
  e.activation = Activation::None;
  e.bias = nullptr;
  e.bias_per_group = false;
  e.out = p.scratch;
  e.out_scales = nullptr;
  pass_scratch_past(p, stage_bytes(p), inner);
  return inner;
}

bool staged_applies(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  const bool every_row_owned = p.grouping == Grouping::Dense || p.grouping == Grouping::Batched;
  return nvfp4_output(e) && e.out_scales != nullptr && e.residual == nullptr && every_row_owned && p.m >= 1 &&
         p.n_out() >= 1 && p.n_out() % 16 == 0 && (!geglu(p) || p.n % 2 == 0);
}

constexpr const char* kName = "staged";

bool supports(const GemmProblem& p) {
  return staged_applies(p) && find_gemm_backend(inner_problem(p), p.cc) != nullptr;
}

int64_t scratch_bytes(const GemmProblem& p) {
  return stage_bytes(p) + delegate_scratch_bytes(inner_problem(p), kName);
}

struct EncodeParams {
  const float* stage;              // [rows, stage_cols], 16-byte aligned rows
  int64_t rows, stage_cols, nkb;   // nkb: 16-column blocks of the result (stage_cols / 16, / 32 under GeGLU)
  GemmEpilogue epilogue;           // bias, bias_type, bias_per_group, activation and out_format are read
  int64_t group_rows;              // rows per bias row when the bias is per group
  ScaleGrid grid;                  // the output's swizzled scale grid, padding included
  uint8_t* values;                 // [rows, nkb * 8] packed E2M1
  uint8_t* scales;
  bool vector_stores;              // values are 8-byte aligned (whole blocks)
};

constexpr int kGroup = kNvfp4OutGroup;

// The stage's row `row` at columns [col0, col0 + n) plus the bias: epilogue_sum of the stage (which
// holds alpha * acc already; the staged problems have no residual).
template <int n>
__device__ __forceinline__ void load_biased(const EncodeParams& p, int64_t row, int64_t col0, float* y) {
  load_lanes<n>(p.stage + row * p.stage_cols + col0, y);
#pragma unroll
  for (int i = 0; i < n; ++i) {
    y[i] = epilogue_sum(p.epilogue, y[i], 1.0f, row, col0 + i, p.stage_cols, row / p.group_rows);
  }
}

// The result's block `kb` of row `row` (epilogue.cuh's nvfp4_output_value of stage + bias).
__device__ __forceinline__ void finished_block(const EncodeParams& p, int64_t row, int64_t kb,
                                               float (&x)[kGroup]) {
  if (p.epilogue.activation == Activation::Geglu) {
    float y[2 * kGroup];
    load_biased<2 * kGroup>(p, row, 2 * kGroup * kb, y);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) x[i] = nvfp4_output_value(p.epilogue, y[2 * i], y[2 * i + 1]);
  } else {
    load_biased<kGroup>(p, row, kGroup * kb, x);
#pragma unroll
    for (int i = 0; i < kGroup; ++i) x[i] = nvfp4_output_value(p.epilogue, x[i], 0.0f);
  }
}

// One thread per (row, block) of the scale grid, as the quantizer walks it (real blocks get their
// codes and scale, padding gets scale 0), but one row per thread, not the quantizer's four: the
// activations' arithmetic needs the threads (at 256 x 4096 four rows a thread left 64 CTAs).
__global__ void __launch_bounds__(kMatrixThreads) encode_kernel(const EncodeParams p) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t kb = matrix_col();
  if (kb >= p.grid.cols) return;
  for (int64_t row = matrix_first_row(); row < p.grid.rows; row += matrix_row_stride()) {
    uint8_t scale = 0;
    if (row < p.rows && kb < p.nkb) {
      float x[kGroup];
      finished_block(p, row, kb, x);
      scale = encode_nvfp4_block(x, p.values + (row * p.nkb + kb) * kNvfp4OutBlockBytes, p.vector_stores);
    }
    p.scales[scale_index(ScaleLayout::Swizzled, row, kb, p.nkb)] = scale;
  }
}

void run(const GemmProblem& p, cudaStream_t stream) {
  if (p.scratch_bytes < stage_bytes(p)) {
    throw std::runtime_error("fp4_gemm: the staged GEMM got less scratch than scratch_bytes() asked for");
  }
  const GemmProblem inner = inner_problem(p);
  if (!is_aligned(inner.epilogue.out, 16)) {
    throw std::runtime_error("fp4_gemm: the staged GEMM's scratch is not 16-byte aligned");
  }
  delegate_backend(inner, kName).run(inner, stream);

  EncodeParams e{};
  e.stage = static_cast<const float*>(inner.epilogue.out);
  e.rows = p.m;
  e.stage_cols = p.n;
  e.nkb = p.n_out() / kGroup;
  e.epilogue = p.epilogue;
  e.group_rows = p.group_rows > 0 ? p.group_rows : p.m;
  e.grid = scale_grid(ScaleLayout::Swizzled, p.m, e.nkb);
  e.values = static_cast<uint8_t*>(p.epilogue.out);
  e.scales = static_cast<uint8_t*>(p.epilogue.out_scales);
  e.vector_stores = is_aligned(e.values, kNvfp4OutBlockBytes);
  const MatrixLaunch shape = matrix_launch(e.grid.rows, e.grid.cols);
  // PDL: the kernel waits for the inner GEMM before its first read.
  launch_kernel(encode_kernel, shape.grid, shape.block, 0, stream, true, e);
}

const GemmBackendRegistrar kRegistrar({kName, GemmArch::Portable, &supports, &run,
                                      &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm
