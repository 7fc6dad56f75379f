// The registered ops of fp4-gemm: a compact set of general ops under which both public API
// families sit. Schemas are defined here, with the CUDA implementations that call csrc/. CPU
// implementations (the reference), fake implementations, and the CUDA implementation of every op
// that has no kernel yet (the reference, run on the GPU) are registered from fp4_gemm/_registry.py.
#include "torch-ext/torch_binding.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "csrc/common/types.h"
#include "csrc/gemm/backends.h"
#include "csrc/quant/dequantize.h"
#include "csrc/quant/quantize.h"
#include "registration.h"

namespace {

fp4_gemm::Recipe parse_recipe(std::string_view recipe) {
  if (recipe == "mxfp8") return fp4_gemm::Recipe::Mxfp8;
  if (recipe == "mxfp4") return fp4_gemm::Recipe::Mxfp4;
  if (recipe == "nvfp4") return fp4_gemm::Recipe::Nvfp4;
  if (recipe == "nvfp4_mse") return fp4_gemm::Recipe::Nvfp4Mse;
  if (recipe == "e0m3") return fp4_gemm::Recipe::E0m3;
  TORCH_CHECK(false, "fp4_gemm: unknown quantization recipe '", recipe, "'");
}

fp4_gemm::FloatType float_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16:
      return fp4_gemm::FloatType::Bf16;
    case at::kHalf:
      return fp4_gemm::FloatType::Fp16;
    case at::kFloat:
      return fp4_gemm::FloatType::Fp32;
    default:
      TORCH_CHECK(false, "fp4_gemm: expected a bfloat16, float16 or float32 tensor, got ", t.scalar_type());
  }
}

// Logical columns of stored values: one E4M3 byte per element, or two 4-bit codes per byte.
int64_t stored_columns(const at::Tensor& values) {
  return values.scalar_type() == at::kByte ? values.size(-1) * 2 : values.size(-1);
}

}  // namespace

void quantize_cuda(const at::Tensor& input, std::string_view recipe, bool swizzle, bool pdl, at::Tensor& values,
                   at::Tensor& scales) {
  TORCH_CHECK(input.dim() == 2 && input.is_contiguous() && values.is_contiguous() && scales.is_contiguous(),
              "fp4_gemm.quantize: tensors must be contiguous and the input 2-D");
  const c10::cuda::CUDAGuard guard(input.device());
  fp4_gemm::QuantizeProblem problem;
  problem.input = input.data_ptr();
  problem.input_type = float_type(input);
  TORCH_CHECK(problem.input_type != fp4_gemm::FloatType::Fp32, "fp4_gemm.quantize: input must be bf16 or fp16");
  problem.in_rows = input.size(0);
  problem.in_cols = input.size(1);
  problem.out_rows = values.size(0);
  problem.out_cols = stored_columns(values);
  problem.values = values.data_ptr();
  problem.scales = scales.data_ptr<uint8_t>();
  problem.recipe = parse_recipe(recipe);
  problem.layout = swizzle ? fp4_gemm::ScaleLayout::Swizzled : fp4_gemm::ScaleLayout::Plain;
  problem.pdl = pdl;
  fp4_gemm::quantize(problem, at::cuda::getCurrentCUDAStream());
}

void dequantize_cuda(const at::Tensor& values, const at::Tensor& scales, std::string_view recipe, bool swizzle,
                     at::Tensor& out) {
  TORCH_CHECK(values.is_contiguous() && scales.is_contiguous() && out.is_contiguous() && out.dim() == 2,
              "fp4_gemm.dequantize: tensors must be contiguous and out 2-D");
  const c10::cuda::CUDAGuard guard(values.device());
  fp4_gemm::DequantizeProblem problem;
  problem.values = values.data_ptr();
  problem.scales = scales.data_ptr<uint8_t>();
  problem.recipe = parse_recipe(recipe == "nvfp4_mse" ? "nvfp4" : recipe);
  problem.layout = swizzle ? fp4_gemm::ScaleLayout::Swizzled : fp4_gemm::ScaleLayout::Plain;
  problem.rows = out.size(0);
  problem.cols = out.size(1);
  problem.out = out.data_ptr();
  problem.out_type = float_type(out);
  problem.pdl = false;
  fp4_gemm::dequantize(problem, at::cuda::getCurrentCUDAStream());
}

std::vector<int64_t> gemm_backend_archs() {
  std::vector<int64_t> archs;
  for (const auto arch : fp4_gemm::gemm_backends()) archs.push_back(static_cast<int64_t>(arch));
  return archs;
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Block quantization (recipes mxfp8, mxfp4, nvfp4, nvfp4_mse, e0m3). values and scales are written
  // in place, every byte, padding included; values may be wider and taller than input (zero padding).
  ops.def("quantize(Tensor input, str recipe, bool swizzle, bool pdl, Tensor(a!) values, Tensor(b!) scales) -> ()");
  ops.impl("quantize", c10::kCUDA, &quantize_cuda);

  // Exact dequantization of stored values and their scales into out (bf16, fp16 or fp32).
  ops.def("dequantize(Tensor values, Tensor scales, str recipe, bool swizzle, Tensor(a!) out) -> ()");
  ops.impl("dequantize", c10::kCUDA, &dequantize_cuda);

  // Every GEMM of both API families: out = encode(act(alpha_scale * alpha[g] * A @ B[g]^T + bias + residual)).
  // grouping: dense | batched | contiguous (group_index = expert id per row) | masked (group_index =
  // valid rows per group of group_rows). out_format: bf16 | fp16 | nvfp4 | nvfp4_from_fp16 (out_scales
  // then receives the swizzled scales). schedule, variant, sm_count, warps, stages, workspace and pdl
  // choose how a kernel runs, never what it computes.
  ops.def(
      "gemm(Tensor a, Tensor b, Tensor sfa, Tensor sfb, str a_format, str b_format, bool b_interleaved, "
      "str grouping, Tensor? group_index, int group_rows, Tensor? alpha, float alpha_scale, Tensor? bias, "
      "Tensor? residual, str activation, Tensor(a!) out, Tensor(b!)? out_scales, str out_format, str schedule, "
      "int variant, int sm_count, int warps, int stages, Tensor(c!)? workspace, bool pdl) -> ()");

  // SwiGLU (input = [gate | up]) then quantization (recipe mxfp8 or nvfp4) of each group's first
  // counts[g] rows; other rows are not written.
  ops.def("swiglu_quant(Tensor input, Tensor counts, str recipe, Tensor(a!) values, Tensor(b!) scales) -> ()");

  // MoE routing: tokens (and their UE8M0 scales) into a padded [experts * max_token_num] layout.
  ops.def(
      "permute_to_masked(Tensor x, Tensor scale, Tensor topk_ids, int num_experts, int max_token_num, "
      "Tensor(a!) permute_x, Tensor(b!) out_scale, Tensor(c!) index_map, Tensor(d!) counts) -> ()");

  // Row-major packed NVFP4 weight -> the streaming layout of the decode GEMV.
  ops.def("repack(Tensor b, Tensor(a!) out) -> ()");

  // Compute capabilities (90, 100, 110, 120) whose GEMM backend is compiled into this build.
  ops.def("gemm_backend_archs() -> int[]", &gemm_backend_archs);

  // The ops above with a CUDA kernel in this library; the others run the reference on the GPU.
  ops.def("native_cuda_ops() -> str[]", []() -> std::vector<std::string> { return {"quantize", "dequantize"}; });
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
