// CUDA implementations of the registered ops. Rules are checked in Python (_validate.py) before
// any call; the TORCH_CHECKs here are a last guard for callers that bypass the Python layer.
#pragma once

#include <ATen/Tensor.h>

#include <string_view>
#include <vector>

void quantize_cuda(const at::Tensor& input, std::string_view recipe, bool swizzle, bool pdl, at::Tensor& values,
                   at::Tensor& scales);

void dequantize_cuda(const at::Tensor& values, const at::Tensor& scales, std::string_view recipe, bool swizzle,
                     at::Tensor& out);

void swiglu_quant_cuda(const at::Tensor& input, const at::Tensor& counts, std::string_view recipe,
                       at::Tensor& values, at::Tensor& scales);

void permute_to_masked_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& topk_ids,
                            int64_t num_experts, int64_t max_token_num, at::Tensor& permute_x, at::Tensor& out_scale,
                            at::Tensor& index_map, at::Tensor& counts);

std::vector<int64_t> gemm_backend_archs();
