// Outputs no kernel writes directly, through a stage: NVFP4 outputs and GeGLU (docs/FORMATS.md,
// "GEMM result"; reference: reference.gemm_into).
//
// The staged backend has the backend that serves the same problem with a float output (float32,
// or fp16 where the contract rounds the result to fp16 before quantizing it) write the epilogue
// result into a stage in the scratch. For GeGLU that problem has no activation, and a small kernel
// then pairs the stage's columns, gelu(y[:, 2j]) * y[:, 2j + 1] in float32. The package's NVFP4
// quantizer (bit-exact with reference.quantize_blocks) encodes the result into out and out_scales,
// every scale byte of the padded grid included. The stage holds what the reference quantizes (its
// float32 result, or that rounded to fp16), so the encoding is the reference's.
//
// Served: NVFP4 outputs without a residual where every row is owned (dense and batched problems:
// the quantizer encodes the whole matrix), N_out a multiple of 16, when some backend serves the
// stage problem for the same compute capability. It registers after every other backend, so a
// kernel that writes NVFP4 itself runs first.
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
constexpr int kPairThreads = 256;

bool geglu(const GemmProblem& p) { return p.epilogue.activation == Activation::Geglu; }

// What the quantizer reads: fp16 for `_fp16` outputs (the contract's rounding), float32 otherwise.
FloatType encoded_type(const GemmProblem& p) {
  return p.epilogue.out_format == OutFormat::Nvfp4FromFp16 ? FloatType::Fp16 : FloatType::Fp32;
}

int64_t type_bytes(FloatType t) { return t == FloatType::Fp16 ? 2 : 4; }

// The inner backend writes the quantizer's input directly, except under GeGLU (float32 columns
// the pairing kernel reads).
FloatType stage_type(const GemmProblem& p) { return geglu(p) ? FloatType::Fp32 : encoded_type(p); }

int64_t stage_bytes(const GemmProblem& p) {
  return ceil_div(p.m * p.n * type_bytes(stage_type(p)), kStageAlign) * kStageAlign;
}

// GeGLU's paired result, [M, N / 2] of encoded_type.
int64_t paired_bytes(const GemmProblem& p) {
  return geglu(p) ? ceil_div(p.m * p.n_out() * type_bytes(encoded_type(p)), kStageAlign) * kStageAlign : 0;
}

// The problem the inner backend computes: its out and scratch in `p`'s scratch (once allocated).
GemmProblem inner_problem(const GemmProblem& p) {
  GemmProblem inner = p;
  inner.epilogue.out_format = stage_type(p) == FloatType::Fp16 ? OutFormat::Fp16 : OutFormat::Fp32;
  if (geglu(p)) inner.epilogue.activation = Activation::None;
  inner.epilogue.out = p.scratch;
  inner.epilogue.out_scales = nullptr;
  const int64_t own = stage_bytes(p) + paired_bytes(p);
  inner.scratch = p.scratch == nullptr ? nullptr : static_cast<uint8_t*>(p.scratch) + own;
  inner.scratch_bytes = p.scratch_bytes > own ? p.scratch_bytes - own : 0;
  return inner;
}

bool staged_applies(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  const bool nvfp4 = e.out_format == OutFormat::Nvfp4 || e.out_format == OutFormat::Nvfp4FromFp16;
  const bool every_row_owned = p.grouping == Grouping::Dense || p.grouping == Grouping::Batched;
  return nvfp4 && e.out_scales != nullptr && e.residual == nullptr && every_row_owned && p.m >= 1 &&
         p.n_out() >= 1 && p.n_out() % 16 == 0 && (!geglu(p) || p.n % 2 == 0);
}

const GemmBackend* inner_backend(const GemmProblem& p, int cc) {
  return find_gemm_backend(inner_problem(p), cc);
}

bool supports(const GemmProblem& p) { return staged_applies(p) && inner_backend(p, p.cc) != nullptr; }

const GemmBackend& inner_backend_here(const GemmProblem& p) {
  const GemmBackend* inner = inner_backend(p, current_device_cc());
  if (inner == nullptr) throw std::runtime_error("fp4_gemm: no backend serves the staged GEMM on this device");
  return *inner;
}

int64_t scratch_bytes(const GemmProblem& p) {
  const GemmBackend& inner = inner_backend_here(p);
  const int64_t inner_bytes = inner.scratch_bytes == nullptr ? 0 : inner.scratch_bytes(inner_problem(p));
  return stage_bytes(p) + paired_bytes(p) + inner_bytes;
}

// out[m, j] = gelu(stage[m, 2j]) * stage[m, 2j + 1] in float32, stored as Out.
template <class Out>
__global__ void __launch_bounds__(kPairThreads) geglu_pairs_kernel(const float2* stage, Out* out, int64_t rows,
                                                                   int64_t cols) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t j = matrix_col();
  if (j >= cols) return;
  for (int64_t m = matrix_first_row(); m < rows; m += matrix_row_stride()) {
    const float2 y = stage[m * cols + j];
    const float value = activate(Activation::Gelu, y.x) * y.y;
    if constexpr (std::is_same_v<Out, __half>) {
      out[m * cols + j] = __float2half_rn(value);
    } else {
      out[m * cols + j] = value;
    }
  }
}

void run(const GemmProblem& p, cudaStream_t stream) {
  if (p.scratch_bytes < stage_bytes(p) + paired_bytes(p)) {
    throw std::runtime_error("fp4_gemm: the staged GEMM got less scratch than scratch_bytes() asked for");
  }
  const GemmProblem inner = inner_problem(p);
  inner_backend_here(p).run(inner, stream);

  const void* encoded = inner.epilogue.out;
  if (geglu(p)) {
    void* paired = static_cast<uint8_t*>(p.scratch) + stage_bytes(p);
    const MatrixLaunch shape = matrix_launch(p.m, p.n_out());
    const auto* stage = static_cast<const float2*>(inner.epilogue.out);
    if (encoded_type(p) == FloatType::Fp16) {
      launch_kernel(geglu_pairs_kernel<__half>, shape.grid, shape.block, 0, stream, true, stage,
                    static_cast<__half*>(paired), p.m, p.n_out());
    } else {
      launch_kernel(geglu_pairs_kernel<float>, shape.grid, shape.block, 0, stream, true, stage,
                    static_cast<float*>(paired), p.m, p.n_out());
    }
    encoded = paired;
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

const GemmBackendRegistrar kRegistrar({"staged", GemmArch::Portable, kStagedPriority, &supports, &run,
                                      &scratch_bytes});

}  // namespace

}  // namespace fp4_gemm
