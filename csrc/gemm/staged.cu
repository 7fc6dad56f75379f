// Outputs no kernel writes directly, through a stage: NVFP4 outputs and GeGLU (docs/FORMATS.md,
// "GEMM result"; reference: reference.gemm_into).
//
// The staged backend has the backend that serves the same problem with a float32 output, and no
// bias or activation, write alpha * A @ B^T into a stage in the scratch. The rest of the epilogue
// runs on the stage with the shared epilogue's own operations (epilogue.cuh: + bias, then the
// activation, or GeGLU's gelu(y[:, 2j]) * y[:, 2j + 1]), rounded to fp16 where the contract says so
// (`_fp16` outputs), and the package's NVFP4 quantizer (bit-exact with reference.quantize_blocks)
// encodes the result into out and out_scales, every scale byte of the padded grid included. So the
// float32 values quantized are those a fused epilogue would have, and the encoding is the
// reference's.
//
// Served: NVFP4 outputs without a residual where every row is owned (dense and batched problems:
// the quantizer encodes the whole matrix), N_out a multiple of 16, when some backend serves the
// float32 problem for the same compute capability. It registers after every other backend, so a
// kernel that writes NVFP4 itself would run first.
#include <cuda_fp16.h>

#include <stdexcept>
#include <type_traits>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/dispatch.h"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/quant/quantize.h"

namespace fp4_gemm {
namespace {

constexpr int64_t kStageAlign = 256;

bool geglu(const GemmProblem& p) { return p.epilogue.activation == Activation::Geglu; }

// What the quantizer reads: fp16 for `_fp16` outputs (the contract's rounding), float32 otherwise.
FloatType encoded_type(const GemmProblem& p) {
  return p.epilogue.out_format == OutFormat::Nvfp4FromFp16 ? FloatType::Fp16 : FloatType::Fp32;
}

// Whether anything runs between the stage and the quantizer: without it the stage is encoded as it is.
bool finishes(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  return e.bias != nullptr || e.activation != Activation::None || encoded_type(p) != FloatType::Fp32;
}

int64_t aligned_bytes(int64_t bytes) { return ceil_div(bytes, kStageAlign) * kStageAlign; }

// The float32 stage [M, N], then the finished result [M, N_out] of encoded_type.
int64_t stage_bytes(const GemmProblem& p) { return aligned_bytes(p.m * p.n * 4); }
int64_t finished_bytes(const GemmProblem& p) {
  return finishes(p) ? aligned_bytes(p.m * p.n_out() * (encoded_type(p) == FloatType::Fp16 ? 2 : 4)) : 0;
}
int64_t own_bytes(const GemmProblem& p) { return stage_bytes(p) + finished_bytes(p); }

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
  pass_scratch_past(p, own_bytes(p), inner);
  return inner;
}

bool staged_applies(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  const bool nvfp4 = e.out_format == OutFormat::Nvfp4 || e.out_format == OutFormat::Nvfp4FromFp16;
  const bool every_row_owned = p.grouping == Grouping::Dense || p.grouping == Grouping::Batched;
  return nvfp4 && e.out_scales != nullptr && e.residual == nullptr && every_row_owned && p.m >= 1 &&
         p.n_out() >= 1 && p.n_out() % 16 == 0 && (!geglu(p) || p.n % 2 == 0);
}

constexpr const char* kName = "staged";

bool supports(const GemmProblem& p) {
  return staged_applies(p) && find_gemm_backend(inner_problem(p), p.cc) != nullptr;
}

int64_t scratch_bytes(const GemmProblem& p) {
  return own_bytes(p) + delegate_scratch_bytes(inner_problem(p), kName);
}

struct FinishParams {
  const float* stage;  // [rows, stage_cols]
  int64_t rows, stage_cols, cols;  // cols: of the result (stage_cols / 2 under GeGLU)
  GemmEpilogue epilogue;           // bias, bias_type, bias_per_group and activation are read
  int64_t group_rows;              // rows per bias row when the bias is per group
  void* out;                       // [rows, cols] of Out
};

// The stage's value at (m, n) plus the bias: the first step of epilogue_value after alpha.
__device__ __forceinline__ float biased(const FinishParams& p, int64_t m, int64_t n) {
  const GemmEpilogue& e = p.epilogue;
  float y = p.stage[m * p.stage_cols + n];
  if (e.bias != nullptr) {
    const int64_t row = e.bias_per_group ? m / p.group_rows * p.stage_cols : 0;
    y += load_as_float(e.bias, e.bias_type, row + n);
  }
  return y;
}

// out[m, j] = act(stage[m, j] + bias[j]), or under GeGLU gelu(y[m, 2j]) * y[m, 2j + 1] with
// y = stage + bias, stored as Out (fp16 rounds to nearest, as the reference's .half()).
template <class Out>
__global__ void __launch_bounds__(kMatrixThreads) finish_kernel(const FinishParams p) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t j = matrix_col();
  if (j >= p.cols) return;
  const Activation act = p.epilogue.activation;
  for (int64_t m = matrix_first_row(); m < p.rows; m += matrix_row_stride()) {
    const float value = act == Activation::Geglu
                            ? activate(Activation::Gelu, biased(p, m, 2 * j)) * biased(p, m, 2 * j + 1)
                            : activate(act, biased(p, m, j));
    if constexpr (std::is_same_v<Out, __half>) {
      static_cast<__half*>(p.out)[m * p.cols + j] = __float2half_rn(value);
    } else {
      static_cast<float*>(p.out)[m * p.cols + j] = value;
    }
  }
}

void run(const GemmProblem& p, cudaStream_t stream) {
  if (p.scratch_bytes < own_bytes(p)) {
    throw std::runtime_error("fp4_gemm: the staged GEMM got less scratch than scratch_bytes() asked for");
  }
  const GemmProblem inner = inner_problem(p);
  delegate_backend(inner, kName).run(inner, stream);

  const void* encoded = inner.epilogue.out;
  if (finishes(p)) {
    FinishParams f{static_cast<const float*>(inner.epilogue.out),
                   p.m,
                   p.n,
                   p.n_out(),
                   p.epilogue,
                   p.group_rows > 0 ? p.group_rows : p.m,
                   static_cast<uint8_t*>(p.scratch) + stage_bytes(p)};
    const MatrixLaunch shape = matrix_launch(p.m, p.n_out());
    const bool fp16 = encoded_type(p) == FloatType::Fp16;
    launch_kernel(fp16 ? finish_kernel<__half> : finish_kernel<float>, shape.grid, shape.block, 0, stream, true, f);
    encoded = f.out;
  }
  QuantizeProblem q{};
  q.input = encoded;
  q.input_type = encoded_type(p);
  q.in_rows = q.out_rows = p.m;
  q.in_cols = q.out_cols = p.n_out();
  q.values = p.epilogue.out;
  q.scales = p.epilogue.out_scales;
  q.recipe = Recipe::Nvfp4;
  q.layout = ScaleLayout::Swizzled;
  q.pdl = true;  // the quantizer waits for the previous grid before its first read
  quantize(q, stream);
}

// After every other backend: a kernel that writes the output itself is preferred.
constexpr int kStagedPriority = 1000;

const GemmBackendRegistrar kRegistrar({kName, GemmArch::Portable, kStagedPriority, &supports, &run,
                                      &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm
