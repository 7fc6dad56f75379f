// CUDA implementations of the registered ops. Rules are checked in Python (_validate.py) before
// any call; the TORCH_CHECKs here are a last guard for callers that bypass the Python layer.
#pragma once

#include <ATen/Tensor.h>

#include <optional>
#include <string>
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

void repack_cuda(const at::Tensor& b, at::Tensor& out);

void tile_group_scales_cuda(const std::optional<at::Tensor>& group_index, int64_t group_rows, const at::Tensor& scales,
                            int64_t groups, int64_t nkb, at::Tensor& layout, at::Tensor& out_scales);

void gemm_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa, const at::Tensor& sfb,
               const std::optional<at::Tensor>& group_index, const std::optional<at::Tensor>& alpha,
               const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual, at::Tensor& out,
               const std::optional<at::Tensor>& out_scales, int64_t kind, double alpha_scale, int64_t knobs);

std::vector<std::string> gemm_backend_names();

std::vector<int64_t> gemm_backend_archs();
