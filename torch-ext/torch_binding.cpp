// The registered ops of fp4-gemm: a compact set of general ops under which both public API
// families sit. Schemas are defined here; CUDA implementations call csrc/; CPU implementations
// (the reference) and fake implementations are registered from Python (fp4_gemm/_registry.py).
#include "torch-ext/torch_binding.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "csrc/common/types.h"
#include "csrc/gemm/backends.h"
#include "csrc/quant/quantize.h"
#include "registration.h"

namespace {

fp4_gemm::Recipe parse_recipe(std::string_view recipe) {
  if (recipe == "mxfp8") return fp4_gemm::Recipe::Mxfp8;
  if (recipe == "mxfp4") return fp4_gemm::Recipe::Mxfp4;
  if (recipe == "nvfp4") return fp4_gemm::Recipe::Nvfp4;
  TORCH_CHECK(false, "fp4_gemm: unknown quantization recipe '", recipe, "'");
}

fp4_gemm::FloatType half_type(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
              "fp4_gemm: expected a bfloat16 or float16 tensor, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16 ? fp4_gemm::FloatType::Bf16 : fp4_gemm::FloatType::Fp16;
}

}  // namespace

void quantize_cuda(const at::Tensor& input, std::string_view recipe, bool swizzle, bool pdl, at::Tensor& values,
                   at::Tensor& scales) {
  TORCH_CHECK(input.dim() == 2 && input.is_contiguous() && values.is_contiguous() && scales.is_contiguous(),
              "fp4_gemm.quantize: tensors must be contiguous and the input 2-D");
  const c10::cuda::CUDAGuard guard(input.device());
  fp4_gemm::QuantizeProblem problem;
  problem.input = input.data_ptr();
  problem.input_type = half_type(input);
  problem.in_rows = input.size(0);
  problem.in_cols = input.size(1);
  problem.out_rows = values.size(0);
  problem.out_cols = values.scalar_type() == at::kByte ? values.size(1) * 2 : values.size(1);
  problem.values = values.data_ptr();
  problem.scales = scales.data_ptr<uint8_t>();
  problem.recipe = parse_recipe(recipe);
  problem.layout = swizzle ? fp4_gemm::ScaleLayout::Swizzled : fp4_gemm::ScaleLayout::Plain;
  problem.pdl = pdl;
  fp4_gemm::quantize(problem, at::cuda::getCurrentCUDAStream());
}

std::vector<int64_t> gemm_backend_archs() {
  std::vector<int64_t> archs;
  for (const auto arch : fp4_gemm::gemm_backends()) archs.push_back(static_cast<int64_t>(arch));
  return archs;
}

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // values/scales are written in place: every byte, padding included.
  ops.def("quantize(Tensor input, str recipe, bool swizzle, bool pdl, Tensor(a!) values, Tensor(b!) scales) -> ()");
  ops.impl("quantize", c10::kCUDA, &quantize_cuda);

  // Compute capabilities (90, 100, 110, 120) whose GEMM backend is compiled into this build.
  ops.def("gemm_backend_archs() -> int[]", &gemm_backend_archs);
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
