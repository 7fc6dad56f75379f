// The registered ops of fp4-gemm: a compact set of general ops under which both public API
// families sit. Schemas are defined here, with the CUDA implementations that call csrc/. CPU
// implementations (the reference), fake implementations, and the CUDA implementation of every op
// that has no kernel yet (the reference, run on the GPU) are registered from fp4_gemm/_registry.py.
#include "torch-ext/torch_binding.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

// The op namespace as a string (registration.h's own macros differ between build tools).
#define FP4_GEMM_NAME_STRING_(x) #x
#define FP4_GEMM_NAME_STRING(x) FP4_GEMM_NAME_STRING_(x)

#include "csrc/common/types.h"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/dispatch.h"
#include "csrc/gemm/blackwell/group_scales.h"
#include "csrc/quant/dequantize.h"
#include "csrc/quant/permute.h"
#include "csrc/quant/quantize.h"
#include "csrc/quant/repack.h"
#include "csrc/quant/swiglu_quant.h"
#include "registration.h"

namespace {

// A quantization recipe by name: a block format of csrc/common/types.h's table, or "nvfp4_mse"
// (NVFP4 with each block's scale the candidate of least squared error).
struct Recipe {
  fp4_gemm::OperandFormat format;
  bool least_squares_scale;
};

Recipe parse_recipe(std::string_view recipe) {
  if (recipe == "nvfp4_mse") return {fp4_gemm::OperandFormat::Nvfp4, true};
  const auto& names = fp4_gemm::kOperandFormatNames;
  const auto named = std::find(std::begin(names), std::end(names), recipe);
  TORCH_CHECK(named != std::end(names) && recipe != "bf16", "fp4_gemm: unknown quantization recipe '", recipe, "'");
  return {static_cast<fp4_gemm::OperandFormat>(named - std::begin(names)), false};
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

// Compute capability of a device, read once per device.
int device_cc(c10::DeviceIndex index) {
  static int cache[64] = {};
  TORCH_CHECK(index >= 0 && index < 64, "fp4_gemm: device index out of range");
  if (cache[index] == 0) {
    const auto* props = at::cuda::getDeviceProperties(index);
    cache[index] = props->major * 10 + props->minor;
  }
  return cache[index];
}

// Logical columns of stored values: one E4M3 byte per element, or two 4-bit codes per byte.
int64_t stored_columns(const at::Tensor& values) {
  return values.scalar_type() == at::kByte ? values.size(-1) * 2 : values.size(-1);
}

// Whether this build has machine code for the tensor's GPU. Where it has none (a GPU outside
// build.toml's capabilities, loaded with check_arch=False), every native op runs its exact reference.
bool has_native_code(const at::Tensor& t) {
  return fp4_gemm::arch_runs_on(fp4_gemm::GemmArch::Portable, device_cc(t.get_device()));
}

// `<op>_reference`: the op's schema, its exact reference registered for CUDA from Python.
template <class Signature, class... Args>
void call_reference(const char* op, Args&&... args) {
  const std::string name = std::string(FP4_GEMM_NAME_STRING(TORCH_EXTENSION_NAME) "::") + op + "_reference";
  c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), "").typed<Signature>().call(std::forward<Args>(args)...);
}

}  // namespace

void quantize_cuda(const at::Tensor& input, std::string_view recipe, bool swizzle, bool pdl, at::Tensor& values,
                   at::Tensor& scales) {
  if (!has_native_code(input)) {
    return call_reference<decltype(quantize_cuda)>("quantize", input, recipe, swizzle, pdl, values, scales);
  }
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
  const Recipe parsed = parse_recipe(recipe);
  problem.format = parsed.format;
  problem.least_squares_scale = parsed.least_squares_scale;
  problem.layout = swizzle ? fp4_gemm::ScaleLayout::Swizzled : fp4_gemm::ScaleLayout::Plain;
  problem.pdl = pdl;
  fp4_gemm::quantize(problem, at::cuda::getCurrentCUDAStream());
}

void dequantize_cuda(const at::Tensor& values, const at::Tensor& scales, std::string_view recipe, bool swizzle,
                     at::Tensor& out) {
  if (!has_native_code(values)) {
    return call_reference<decltype(dequantize_cuda)>("dequantize", values, scales, recipe, swizzle, out);
  }
  TORCH_CHECK(values.is_contiguous() && scales.is_contiguous() && out.is_contiguous() && out.dim() == 2,
              "fp4_gemm.dequantize: tensors must be contiguous and out 2-D");
  const c10::cuda::CUDAGuard guard(values.device());
  fp4_gemm::DequantizeProblem problem;
  problem.values = values.data_ptr();
  problem.scales = scales.data_ptr<uint8_t>();
  problem.format = parse_recipe(recipe).format;  // nvfp4_mse stores NVFP4
  problem.layout = swizzle ? fp4_gemm::ScaleLayout::Swizzled : fp4_gemm::ScaleLayout::Plain;
  problem.rows = out.size(0);
  problem.cols = out.size(1);
  problem.out = out.data_ptr();
  problem.out_type = float_type(out);
  fp4_gemm::dequantize(problem, at::cuda::getCurrentCUDAStream());
}

void swiglu_quant_cuda(const at::Tensor& input, const at::Tensor& counts, std::string_view recipe,
                       at::Tensor& values, at::Tensor& scales) {
  if (!has_native_code(input)) {
    return call_reference<decltype(swiglu_quant_cuda)>("swiglu_quant", input, counts, recipe, values, scales);
  }
  TORCH_CHECK(input.dim() == 2 && input.scalar_type() == at::kBFloat16 && input.is_contiguous(),
              "fp4_gemm.swiglu_quant: input must be a contiguous 2-D bfloat16 tensor");
  TORCH_CHECK(counts.dim() == 1 && counts.scalar_type() == at::kInt && counts.is_contiguous() &&
                  counts.numel() >= 1 && counts.device() == input.device(),
              "fp4_gemm.swiglu_quant: counts must be a contiguous 1-D int32 tensor on the input's device");
  TORCH_CHECK(recipe == "mxfp8" || recipe == "nvfp4", "fp4_gemm.swiglu_quant: recipe must be mxfp8 or nvfp4");
  const bool fp4 = recipe == "nvfp4";
  const int64_t group = fp4 ? 16 : 32;
  const int64_t rows = input.size(0);
  const int64_t hidden = input.size(1) / 2;
  TORCH_CHECK(input.size(1) % (2 * group) == 0 && rows % counts.numel() == 0,
              "fp4_gemm.swiglu_quant: input must be [groups * M, 2 * hidden], hidden a multiple of ", group);
  TORCH_CHECK(values.is_contiguous() && values.scalar_type() == (fp4 ? at::kByte : at::kFloat8_e4m3fn) &&
                  values.numel() == rows * (fp4 ? hidden / 2 : hidden),
              "fp4_gemm.swiglu_quant: values must be contiguous ",
              fp4 ? "uint8 [rows, hidden / 2]" : "float8_e4m3fn [rows, hidden]");
  const auto grid = fp4_gemm::scale_grid(fp4_gemm::ScaleLayout::Swizzled, rows, hidden / group);
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kByte && scales.numel() == grid.rows * grid.cols,
              "fp4_gemm.swiglu_quant: scales must be a contiguous uint8 buffer of ", grid.rows * grid.cols, " bytes");
  TORCH_CHECK(values.device() == input.device() && scales.device() == input.device(),
              "fp4_gemm.swiglu_quant: values and scales must be on the input's device");
  const c10::cuda::CUDAGuard guard(input.device());
  fp4_gemm::SwigluQuantProblem problem;
  problem.input = input.data_ptr();
  problem.counts = counts.data_ptr<int32_t>();
  problem.rows = rows;
  problem.hidden = hidden;
  problem.groups = counts.numel();
  problem.format = parse_recipe(recipe).format;
  problem.values = values.data_ptr();
  problem.scales = scales.data_ptr<uint8_t>();
  fp4_gemm::swiglu_quant(problem, at::cuda::getCurrentCUDAStream());
}

void permute_to_masked_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& topk_ids,
                            int64_t num_experts, int64_t max_token_num, at::Tensor& permute_x, at::Tensor& out_scale,
                            at::Tensor& index_map, at::Tensor& counts) {
  if (!has_native_code(x)) {
    return call_reference<decltype(permute_to_masked_cuda)>("permute_to_masked", x, scale, topk_ids, num_experts,
                                                            max_token_num, permute_x, out_scale, index_map, counts);
  }
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat8_e4m3fn),
              "fp4_gemm.permute_to_masked: x must be a contiguous 2-D bfloat16 or float8_e4m3fn tensor");
  const int64_t tokens = x.size(0);
  const int64_t hidden = x.size(1);
  const bool broadcast = scale.scalar_type() == at::kInt;
  TORCH_CHECK(scale.dim() == 2 && scale.is_contiguous() && (broadcast || scale.scalar_type() == at::kByte) &&
                  scale.size(0) == tokens && scale.size(1) * (broadcast ? 512 : 32) == hidden,
              "fp4_gemm.permute_to_masked: scale must be contiguous int32 [tokens, hidden / 512] or uint8 "
              "[tokens, hidden / 32]");
  // topk may be 0 (no slot routed: every row is zeroed, every count is 0), as on the CPU.
  TORCH_CHECK(topk_ids.dim() == 2 && topk_ids.is_contiguous() && topk_ids.scalar_type() == at::kLong &&
                  topk_ids.size(0) == tokens && topk_ids.numel() <= INT32_MAX,
              "fp4_gemm.permute_to_masked: topk_ids must be contiguous int64 [tokens, topk], below 2^31 slots");
  TORCH_CHECK(num_experts >= 1 && num_experts <= fp4_gemm::kPermuteMaxExperts && max_token_num >= 1,
              "fp4_gemm.permute_to_masked: num_experts must be in [1, ", fp4_gemm::kPermuteMaxExperts,
              "] and max_token_num positive");
  const int64_t rows = num_experts * max_token_num;
  const auto grid = fp4_gemm::scale_grid(fp4_gemm::ScaleLayout::Swizzled, rows, hidden / 32);
  TORCH_CHECK(permute_x.is_contiguous() && permute_x.scalar_type() == x.scalar_type() &&
                  permute_x.numel() == rows * hidden,
              "fp4_gemm.permute_to_masked: permute_x must be contiguous [num_experts * max_token_num, hidden] of "
              "x's type");
  TORCH_CHECK(out_scale.is_contiguous() && out_scale.scalar_type() == at::kByte &&
                  out_scale.numel() >= grid.rows * grid.cols,
              "fp4_gemm.permute_to_masked: out_scale must be a contiguous uint8 buffer of ", grid.rows * grid.cols,
              " bytes");
  TORCH_CHECK(index_map.is_contiguous() && index_map.scalar_type() == at::kInt &&
                  index_map.numel() == topk_ids.numel() && counts.is_contiguous() &&
                  counts.scalar_type() == at::kInt && counts.numel() == num_experts,
              "fp4_gemm.permute_to_masked: index_map must be int32 [tokens, topk] and counts int32 [num_experts, 1]");
  const auto on_x_device = [&x](const at::Tensor& t) { return t.device() == x.device(); };
  TORCH_CHECK(on_x_device(scale) && on_x_device(topk_ids) && on_x_device(permute_x) && on_x_device(out_scale) &&
                  on_x_device(index_map) && on_x_device(counts),
              "fp4_gemm.permute_to_masked: every tensor must be on x's device");
  const c10::cuda::CUDAGuard guard(x.device());
  // Per-chunk counters from the caching allocator: stream-ordered, so this works inside CUDA graphs.
  const at::Tensor workspace = at::empty({fp4_gemm::permute_workspace_elements(topk_ids.numel(), num_experts)},
                                         topk_ids.options().dtype(at::kInt));
  fp4_gemm::PermuteProblem problem;
  problem.x = x.data_ptr();
  problem.tokens = tokens;
  problem.row_bytes = hidden * x.element_size();
  problem.hidden = hidden;
  problem.scale = static_cast<const uint8_t*>(scale.data_ptr());
  problem.broadcast_scale = broadcast;
  problem.topk_ids = topk_ids.data_ptr<int64_t>();
  problem.topk = topk_ids.size(1);
  problem.experts = num_experts;
  problem.max_token_num = max_token_num;
  problem.permute_x = permute_x.data_ptr();
  problem.out_scale = out_scale.data_ptr<uint8_t>();
  problem.index_map = index_map.data_ptr<int32_t>();
  problem.counts = counts.data_ptr<int32_t>();
  problem.workspace = workspace.data_ptr<int32_t>();
  fp4_gemm::permute_to_masked(problem, at::cuda::getCurrentCUDAStream());
}

void repack_cuda(const at::Tensor& b, at::Tensor& out) {
  if (!has_native_code(b)) return call_reference<decltype(repack_cuda)>("repack", b, out);
  TORCH_CHECK(b.dim() == 2 && b.scalar_type() == at::kByte && b.is_contiguous() && out.scalar_type() == at::kByte &&
                  out.is_contiguous() && out.sizes() == b.sizes() && out.device() == b.device(),
              "fp4_gemm.repack: b and out must be contiguous uint8 [N, K/2] tensors on one device");
  TORCH_CHECK(b.size(0) % 8 == 0 && b.size(1) % 32 == 0,
              "fp4_gemm.repack: the streaming layout tiles 8 rows x 64 elements (N % 8 == 0, K % 64 == 0)");
  const c10::cuda::CUDAGuard guard(b.device());
  // The kernel reads and writes different places of a row: an overlapping out goes through a copy.
  const bool overlap = out.data_ptr<uint8_t>() < b.data_ptr<uint8_t>() + b.numel() &&
                       b.data_ptr<uint8_t>() < out.data_ptr<uint8_t>() + out.numel();
  at::Tensor target = overlap ? at::empty_like(out) : out;
  fp4_gemm::RepackProblem problem;
  problem.in = b.data_ptr<uint8_t>();
  problem.out = target.data_ptr<uint8_t>();
  problem.rows = b.size(0);
  problem.row_bytes = b.size(1);
  fp4_gemm::repack_interleaved(problem, at::cuda::getCurrentCUDAStream());
  if (overlap) out.copy_(target);
}

void tile_group_scales_cuda(const std::optional<at::Tensor>& group_index, int64_t group_rows, const at::Tensor& scales,
                            int64_t groups, int64_t nkb, at::Tensor& layout, at::Tensor& out_scales) {
  using namespace fp4_gemm;
  if (!has_native_code(scales)) {
    return call_reference<decltype(tile_group_scales_cuda)>("tile_group_scales", group_index, group_rows, scales,
                                                            groups, nkb, layout, out_scales);
  }
  const bool strided = !group_index.has_value();
  TORCH_CHECK(strided || (group_index->dim() == 1 && group_index->scalar_type() == at::kInt &&
                          group_index->is_contiguous() && group_index->device() == scales.device()),
              "fp4_gemm.tile_group_scales: group_index must be a contiguous 1-D int32 tensor on scales' device");
  TORCH_CHECK(!strided || group_rows >= 1, "fp4_gemm.tile_group_scales: strided groups need group_rows >= 1");
  const int64_t m = strided ? groups * group_rows : group_index->numel();
  TORCH_CHECK(groups >= 1 && nkb >= 1, "fp4_gemm.tile_group_scales: groups and nkb must be positive");
  const auto bytes_of = [](const at::Tensor& t, at::ScalarType type) {
    return t.is_contiguous() && t.scalar_type() == type ? t.numel() : int64_t{-1};
  };
  TORCH_CHECK(bytes_of(scales, at::kByte) >= ceil_div(m, kSfTileRows) * sf_k_tiles(nkb) * kSfTileBytes,
              "fp4_gemm.tile_group_scales: scales must be the contiguous uint8 swizzled scales of the ", m, " rows");
  TORCH_CHECK(bytes_of(layout, at::kInt) == 3 * groups, "fp4_gemm.tile_group_scales: layout must be int32 [3, groups]");
  TORCH_CHECK(bytes_of(out_scales, at::kByte) >= group_scale_bytes(m, groups, nkb),
              "fp4_gemm.tile_group_scales: out_scales must be a contiguous uint8 buffer of at least ",
              group_scale_bytes(m, groups, nkb), " bytes");
  TORCH_CHECK(layout.device() == scales.device() && out_scales.device() == scales.device(),
              "fp4_gemm.tile_group_scales: every tensor must be on scales' device");
  const c10::cuda::CUDAGuard guard(scales.device());
  // The tile -> expert map is the kernels' own: scratch from the caching allocator (stream-ordered).
  const at::Tensor tile_group = at::empty({group_scale_tiles(m, groups)}, layout.options());
  TileGroupScalesProblem problem;
  problem.group_index = strided ? nullptr : group_index->data_ptr<int32_t>();
  problem.group_rows = strided ? group_rows : 0;
  problem.m = m;
  problem.groups = groups;
  problem.scales = scales.data_ptr<uint8_t>();
  problem.nkb = nkb;
  problem.out.first = layout.data_ptr<int32_t>();
  problem.out.rows = problem.out.first + groups;
  problem.out.tile = problem.out.rows + groups;
  problem.out.tile_group = tile_group.data_ptr<int32_t>();
  problem.out.scales = out_scales.data_ptr<uint8_t>();
  tile_group_scales(problem, at::cuda::getCurrentCUDAStream());
}

namespace {

// The `gemm` op's two packed integers: `kind` says what is computed, `knobs` how it runs (never
// what). Each field sits at `shift`, `bits` wide: a named field holds its name's index in
// problem.h's names (gemm_names), an integer its value plus `offset` (so that -1, "automatic", is 0).
// Packed, because the dispatcher's parse of each Python argument is a large part of a call's host
// cost. Python packs them from this table (gemm_packing; fp4_gemm/_gemm.py's GemmCall.op_arguments).
struct PackedField {
  const char* name;
  int shift;
  int bits;
  int offset;
};

enum KindField { kAFormat, kBFormat, kBInterleaved, kGrouping, kActivation, kOutFormat, kGroupRows };
constexpr PackedField kKindFields[] = {{"a_format", 0, 3, 0},     {"b_format", 3, 3, 0},   {"b_interleaved", 6, 1, 0},
                                       {"grouping", 7, 2, 0},     {"activation", 9, 3, 0}, {"out_format", 12, 3, 0},
                                       {"group_rows", 16, 47, 0}};

enum KnobField { kSchedule, kVariant, kWarps, kStages, kPdl, kSmCount, kSplits };
constexpr PackedField kKnobFields[] = {{"schedule", 0, 2, 0}, {"variant", 2, 4, 1}, {"warps", 6, 8, 0},
                                       {"stages", 14, 8, 0},  {"pdl", 22, 1, 0},    {"sm_count", 23, 32, 1},
                                       {"splits", 55, 4, 0}};

constexpr bool names_fit(const PackedField& field, size_t names) { return names <= (size_t{1} << field.bits); }
static_assert(names_fit(kKindFields[kAFormat], std::size(fp4_gemm::kOperandFormatNames)) &&
              names_fit(kKindFields[kBFormat], std::size(fp4_gemm::kOperandFormatNames)) &&
              names_fit(kKindFields[kGrouping], std::size(fp4_gemm::kGroupingNames)) &&
              names_fit(kKindFields[kActivation], std::size(fp4_gemm::kActivationNames)) &&
              names_fit(kKindFields[kOutFormat], std::size(fp4_gemm::kOutFormatNames)) &&
              names_fit(kKnobFields[kSchedule], std::size(fp4_gemm::kScheduleNames)));

int64_t unpack(int64_t packed, const PackedField& field) {
  return ((packed >> field.shift) & ((int64_t{1} << field.bits) - 1)) - field.offset;
}

template <class Enum, size_t N>
Enum unpack_name(int64_t packed, const PackedField& field, const std::string_view (&names)[N]) {
  const int64_t code = unpack(packed, field);
  TORCH_CHECK(code < static_cast<int64_t>(N), "fp4_gemm.gemm: ", field.name, " code ", code, " names nothing");
  return static_cast<Enum>(code);
}

// Every packed field as "kind.<name>" or "knobs.<name>", with its shift, bits and offset.
std::tuple<std::vector<std::string>, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>> gemm_packing() {
  std::vector<std::string> names;
  std::vector<int64_t> shifts, bits, offsets;
  const auto add = [&](const char* prefix, const auto& fields) {
    for (const PackedField& field : fields) {
      names.push_back(std::string(prefix) + field.name);
      shifts.push_back(field.shift);
      bits.push_back(field.bits);
      offsets.push_back(field.offset);
    }
  };
  add("kind.", kKindFields);
  add("knobs.", kKnobFields);
  return {names, shifts, bits, offsets};
}

// The names a named field of the packing takes, by code.
std::vector<std::string> gemm_names(std::string_view field) {
  using namespace fp4_gemm;
  const auto listed = [](const auto& names) { return std::vector<std::string>(std::begin(names), std::end(names)); };
  if (field == "a_format" || field == "b_format") return listed(kOperandFormatNames);
  if (field == "grouping") return listed(kGroupingNames);
  if (field == "activation") return listed(kActivationNames);
  if (field == "out_format") return listed(kOutFormatNames);
  if (field == "schedule") return listed(kScheduleNames);
  TORCH_CHECK(false, "fp4_gemm.gemm_names: no named field '", field, "'");
}

// A tensor's address in the problem. A meta tensor (ops.gemm_backends asks about a call's shapes,
// not its buffers) stands for a 4096-byte aligned buffer: supports() reads presence and alignment.
void* address(const at::Tensor& t) { return t.is_meta() ? reinterpret_cast<void*>(uintptr_t{1} << 12) : t.data_ptr(); }

template <class T>
T* optional_address(const std::optional<at::Tensor>& t) {
  return t.has_value() ? static_cast<T*>(address(*t)) : nullptr;
}

// The problem a `gemm` call describes (everything but the device and the scratch), from the op's
// arguments (their meaning: the `gemm` schema below; Python: fp4_gemm/_gemm.py's GemmCall).
fp4_gemm::GemmProblem describe_gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa,
                                    const at::Tensor& sfb, const std::optional<at::Tensor>& group_index,
                                    const std::optional<at::Tensor>& alpha, const std::optional<at::Tensor>& bias,
                                    const std::optional<at::Tensor>& residual, const at::Tensor& out,
                                    const std::optional<at::Tensor>& out_scales, int64_t kind, double alpha_scale,
                                    int64_t knobs) {
  using namespace fp4_gemm;
  TORCH_CHECK(a.dim() >= 2 && b.dim() >= 2, "fp4_gemm.gemm: a and b must be at least 2-D");
  GemmProblem problem;
  problem.a.format = unpack_name<OperandFormat>(kind, kKindFields[kAFormat], kOperandFormatNames);
  problem.b.format = unpack_name<OperandFormat>(kind, kKindFields[kBFormat], kOperandFormatNames);
  problem.b_interleaved = unpack(kind, kKindFields[kBInterleaved]) != 0;
  problem.grouping = unpack_name<Grouping>(kind, kKindFields[kGrouping], kGroupingNames);
  problem.epilogue.activation = unpack_name<Activation>(kind, kKindFields[kActivation], kActivationNames);
  problem.epilogue.out_format = unpack_name<OutFormat>(kind, kKindFields[kOutFormat], kOutFormatNames);
  problem.group_rows = unpack(kind, kKindFields[kGroupRows]);
  problem.schedule = unpack_name<Schedule>(knobs, kKnobFields[kSchedule], kScheduleNames);
  TORCH_CHECK(sfa.has_value() == block_scaled(problem.a.format),
              "fp4_gemm.gemm: sfa is given exactly when A is block-scaled (not bf16)");
  problem.k = a.size(-1) * a.element_size() * 8 / element_bits(problem.a.format);  // a bf16 A: K elements
  problem.m = a.numel() / a.size(-1);
  problem.n = b.size(-2);
  problem.groups = b.dim() == 3 ? b.size(0) : 1;
  problem.a.values = address(a);
  problem.a.scales = optional_address<uint8_t>(sfa);
  problem.b.values = address(b);
  problem.b.scales = static_cast<uint8_t*>(address(sfb));
  problem.group_index = optional_address<const int32_t>(group_index);
  auto& epilogue = problem.epilogue;
  epilogue.alpha = optional_address<const float>(alpha);
  epilogue.alpha_count = alpha.has_value() ? alpha->numel() : 0;
  epilogue.alpha_scale = static_cast<float>(alpha_scale);
  if (bias.has_value()) {
    epilogue.bias = address(*bias);
    epilogue.bias_type = float_type(*bias);
    epilogue.bias_per_group = bias->dim() > 1;
  }
  epilogue.residual = optional_address<const void>(residual);
  epilogue.out = address(out);
  epilogue.out_scales = optional_address<uint8_t>(out_scales);
  problem.variant = static_cast<int>(unpack(knobs, kKnobFields[kVariant]));
  problem.sm_count = static_cast<int>(unpack(knobs, kKnobFields[kSmCount]));
  problem.warps = static_cast<int>(unpack(knobs, kKnobFields[kWarps]));
  problem.stages = static_cast<int>(unpack(knobs, kKnobFields[kStages]));
  problem.splits = static_cast<int>(unpack(knobs, kKnobFields[kSplits]));
  problem.pdl = unpack(knobs, kKnobFields[kPdl]) != 0;
  return problem;
}

// The backend `gemm_on` names for the call in flight on this thread; empty: dispatch chooses.
thread_local std::string_view named_gemm_backend;

// The backend that runs `problem`: dispatch's choice (nullptr: the reference), or the named one,
// which must serve the problem on this device.
const fp4_gemm::GemmBackend* serving_backend(const fp4_gemm::GemmProblem& problem) {
  using namespace fp4_gemm;
  if (named_gemm_backend.empty()) return find_gemm_backend(problem, problem.cc);
  const auto& backends = gemm_backends();
  const auto named = std::find_if(backends.begin(), backends.end(),
                                  [](const GemmBackend& backend) { return backend.name == named_gemm_backend; });
  TORCH_CHECK(named != backends.end(), "fp4_gemm.gemm_on: no backend named '", named_gemm_backend, "' in this build");
  TORCH_CHECK(arch_runs_on(named->arch, problem.cc) && named->supports(problem), "fp4_gemm.gemm_on: backend '",
              named_gemm_backend, "' does not serve this problem on compute capability ", problem.cc);
  return &*named;
}

// `gemm` on a named backend (`gemm_cuda` with the backend's name in front).
template <class Signature>
struct GemmOn;

template <class... Args>
struct GemmOn<void(Args...)> {
  static void call(std::string_view backend, Args... args) {
    struct Named {
      explicit Named(std::string_view name) { named_gemm_backend = name; }
      ~Named() { named_gemm_backend = {}; }
    } named(backend);
    gemm_cuda(args...);
  }
};

// For a `gemm` call on compute capability cc (`describe_gemm` with cc in front): dispatch's choice
// ("" where the reference runs it), then every other backend of this build that can serve the call
// (gemm_on's names). Host-side only.
template <class Signature>
struct GemmBackendsFor;

template <class... Args>
struct GemmBackendsFor<void(Args...)> {
  static std::vector<std::string> call(int64_t cc, Args... args) {
    using namespace fp4_gemm;
    GemmProblem problem = describe_gemm(args...);
    problem.cc = static_cast<int>(cc);
    const GemmBackend* chosen = find_gemm_backend(problem, problem.cc);
    std::vector<std::string> names{chosen == nullptr ? "" : chosen->name};
    for (const auto& backend : gemm_backends()) {
      if (&backend != chosen && arch_runs_on(backend.arch, problem.cc) && backend.supports(problem)) {
        names.emplace_back(backend.name);
      }
    }
    return names;
  }
};

// The dispatch policy (csrc/gemm/dispatch.cpp), one entry per row and column, for tests and docs.
std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, std::vector<int64_t>,
           std::vector<int64_t>, std::vector<std::string>, std::vector<std::string>, std::vector<std::string>,
           std::vector<std::string>>
gemm_dispatch_table() {
  using namespace fp4_gemm;
  static constexpr const char* kArchs[] = {"any", "sm_90"};
  static constexpr const char* kGroupings[] = {"any", "dense", "grouped"};
  static constexpr const char* kOperands[] = {"any", "same block-scaled", "other block-scaled B", "bf16 A", "e0m3",
                                              "nvfp4 output or geglu"};
  std::vector<std::string> backends, archs, groupings, operands, conditions, reasons, evidence;
  std::vector<int64_t> min_rows, max_rows;
  for (const DispatchRow& row : dispatch_table()) {
    backends.emplace_back(row.backend);
    archs.emplace_back(kArchs[static_cast<int>(row.arch)]);
    groupings.emplace_back(kGroupings[static_cast<int>(row.grouping)]);
    min_rows.push_back(row.min_rows);
    max_rows.push_back(row.max_rows);
    operands.emplace_back(kOperands[static_cast<int>(row.operands)]);
    conditions.emplace_back(row.condition_name);
    reasons.emplace_back(row.reason);
    evidence.emplace_back(row.evidence);
  }
  return {backends, archs, groupings, min_rows, max_rows, operands, conditions, reasons, evidence};
}

// The arguments of `gemm`, `gemm_reference`, `gemm_on` and `gemm_backends`: the tensors, then
// `kind`, alpha_scale and `knobs` (kKindFields, kKnobFields).
constexpr const char* kGemmArgs =
    "Tensor a, Tensor b, Tensor? sfa, Tensor sfb, Tensor? group_index, Tensor? alpha, Tensor? bias, "
    "Tensor? residual, Tensor(a!) out, Tensor(b!)? out_scales, int kind, float alpha_scale, int knobs";

std::string gemm_schema(const std::string& head, const std::string& returns = "()") {
  return head + kGemmArgs + ") -> " + returns;
}

}  // namespace

void gemm_cuda(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& sfa, const at::Tensor& sfb,
               const std::optional<at::Tensor>& group_index, const std::optional<at::Tensor>& alpha,
               const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual, at::Tensor& out,
               const std::optional<at::Tensor>& out_scales, int64_t kind, double alpha_scale, int64_t knobs) {
  using namespace fp4_gemm;
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && (!sfa.has_value() || sfa->is_contiguous()) &&
                  sfb.is_contiguous() && out.is_contiguous(),
              "fp4_gemm.gemm: operands, scales and out must be contiguous");
  const c10::cuda::CUDAGuard guard(a.device());
  GemmProblem problem =
      describe_gemm(a, b, sfa, sfb, group_index, alpha, bias, residual, out, out_scales, kind, alpha_scale, knobs);
  problem.cc = device_cc(a.get_device());
  if (const GemmBackend* backend = serving_backend(problem)) {
    // The caching allocator's block itself (no tensor around it: one dispatcher round trip less per
    // call), on a's device (the guard's), held until the launch is enqueued; reuse is stream-ordered.
    c10::DataPtr scratch;
    if (backend->scratch_bytes != nullptr) {
      const int64_t bytes = backend->scratch_bytes(problem);
      if (bytes > 0) {
        scratch = c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(bytes));
        problem.scratch = scratch.get();
        problem.scratch_bytes = bytes;
      }
    }
    backend->run(problem, at::cuda::getCurrentCUDAStream());
    return;
  }
  // No kernel of this build serves the problem (or this GPU): the exact reference, with PyTorch ops.
  call_reference<decltype(gemm_cuda)>("gemm", a, b, sfa, sfb, group_index, alpha, bias, residual, out, out_scales,
                                      kind, alpha_scale, knobs);
}

std::vector<std::string> gemm_backend_names() {
  std::vector<std::string> names;
  for (const auto& backend : fp4_gemm::gemm_backends()) names.emplace_back(backend.name);
  return names;
}

std::vector<int64_t> gemm_backend_archs() {
  std::vector<int64_t> archs;
  for (const auto& backend : fp4_gemm::gemm_backends()) {
    const auto arch = static_cast<int64_t>(backend.arch);
    if (arch != 0 && std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
  }
  std::sort(archs.begin(), archs.end());
  return archs;
}

namespace {

// `name` with its CUDA kernel, and `name_reference` with the same schema: the exact reference,
// registered for CUDA from Python, which the kernel runs where this build has no code for the GPU.
template <class Kernel>
void def_native(torch::Library& ops, const std::string& name, const std::string& arguments, Kernel* kernel) {
  ops.def((name + arguments).c_str());
  ops.impl(name.c_str(), c10::kCUDA, kernel);
  ops.def((name + "_reference" + arguments).c_str());
}

}  // namespace

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, ops) {
  // Block quantization (recipes mxfp8, mxfp4, nvfp4, nvfp4_mse, e0m3). values and scales are written
  // in place, every byte, padding included; values may be wider and taller than input (zero padding).
  def_native(ops, "quantize",
             "(Tensor input, str recipe, bool swizzle, bool pdl, Tensor(a!) values, Tensor(b!) scales) -> ()",
             &quantize_cuda);

  // Exact dequantization of stored values and their scales into out (bf16, fp16 or fp32).
  def_native(ops, "dequantize", "(Tensor values, Tensor scales, str recipe, bool swizzle, Tensor(a!) out) -> ()",
             &dequantize_cuda);

  // Every GEMM of both API families: out = encode(act(alpha_scale * alpha[g] * A @ B[g]^T + bias + residual)).
  // sfa: A's scales, absent for a bf16 A. `kind` packs the operand formats, b_interleaved, the
  // grouping (dense | batched | contiguous: group_index = expert id per row | masked: group_index =
  // valid rows per group) with group_rows, the activation and out_format (bf16 | fp16 | nvfp4 |
  // nvfp4_from_fp16: out_scales then receives the swizzled scales); `knobs` packs schedule (auto |
  // streamk | m256), variant, sm_count, warps, stages, splits and pdl, which choose how a kernel runs, never
  // what it computes. The packing: gemm_packing and gemm_names.
  // Where no kernel of this build serves a problem, `gemm` runs `gemm_reference`.
  def_native(ops, "gemm", gemm_schema("("), &gemm_cuda);

  // `gemm` on the backend named first (ops.gemm_backend's names), which must serve the problem on
  // this device: tests hold each backend to the reference on the GPU they have, also where dispatch
  // would choose another.
  ops.def(gemm_schema("gemm_on(str backend, ").c_str());
  ops.impl("gemm_on", c10::kCUDA, &GemmOn<decltype(gemm_cuda)>::call);

  // For that `gemm` call on compute capability cc: dispatch's choice ("": the reference), then every
  // other backend that can serve it. Host-side: it reads shapes, formats and the alignment of the
  // buffers; meta tensors stand for aligned buffers, so a call can be described without memory.
  ops.def(gemm_schema("gemm_backends(int cc, ", "str[]").c_str(), &GemmBackendsFor<decltype(gemm_cuda)>::call);

  // The fields `gemm`'s kind and knobs pack ("kind.<field>" / "knobs.<field>"), each at its shift,
  // bits wide, an integer stored plus its offset; and the names a named field takes, by code.
  ops.def("gemm_packing() -> (str[] fields, int[] shifts, int[] bits, int[] offsets)", &gemm_packing);
  ops.def("gemm_names(str field) -> str[]", &gemm_names);

  // Names of the GEMM backends compiled into this build (gemm_on's names).
  ops.def("gemm_backend_names() -> str[]", &gemm_backend_names);

  // The dispatch policy, row by row: backend, arch, grouping, rows per group (min, max), operands,
  // measured condition, reason, result file (csrc/gemm/dispatch.cpp).
  ops.def(
      "gemm_dispatch_table() -> (str[] backends, str[] archs, str[] groupings, int[] min_rows, int[] max_rows, "
      "str[] operands, str[] conditions, str[] reasons, str[] evidence)",
      &gemm_dispatch_table);

  // SwiGLU (input = [gate | up]) then quantization (recipe mxfp8 or nvfp4) of each group's first
  // counts[g] rows; other rows are not written.
  def_native(ops, "swiglu_quant",
             "(Tensor input, Tensor counts, str recipe, Tensor(a!) values, Tensor(b!) scales) -> ()",
             &swiglu_quant_cuda);

  // MoE routing: tokens (and their UE8M0 scales) into a padded [experts * max_token_num] layout.
  def_native(ops, "permute_to_masked",
             "(Tensor x, Tensor scale, Tensor topk_ids, int num_experts, int max_token_num, Tensor(a!) permute_x, "
             "Tensor(b!) out_scale, Tensor(c!) index_map, Tensor(d!) counts) -> ()",
             &permute_to_masked_cuda);

  // Row-major packed NVFP4 weight -> the streaming layout of the decode GEMV.
  def_native(ops, "repack", "(Tensor b, Tensor(a!) out) -> ()", &repack_cuda);

  // Groups on whole scale tiles: contiguous (group_index = expert id per row) or, without
  // group_index, strided (group g = rows [g * group_rows, (g + 1) * group_rows)). Each group's first
  // row, rows and first tile into layout [3, groups], and its rows' swizzled scales re-laid from that
  // tile on into out_scales (csrc/gemm/blackwell/group_scales.h); what grouped GEMM kernels run first.
  def_native(ops, "tile_group_scales",
             "(Tensor? group_index, int group_rows, Tensor scales, int groups, int nkb, Tensor(a!) layout, "
             "Tensor(b!) out_scales) -> ()",
             &tile_group_scales_cuda);

  // Compute capabilities (90, 100, 110, 120) whose GEMM backend is compiled into this build.
  ops.def("gemm_backend_archs() -> int[]", &gemm_backend_archs);

  // The ops above with a CUDA kernel in this library (each with its `_reference`); the others run the
  // reference on the GPU.
  ops.def("native_cuda_ops() -> str[]", []() -> std::vector<std::string> {
    return {"quantize", "dequantize", "swiglu_quant", "permute_to_masked", "gemm", "repack", "tile_group_scales"};
  });
}

REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
