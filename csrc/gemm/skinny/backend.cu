// The skinny backend: which problems its two kernels serve, how a launch is planned, and the
// registration. The staged kernel (kernel.cuh) serves every problem of the tier (slab warps, ring
// depth, the K split over a cluster, the grid); the register-streaming kernel (register_stream.cuh)
// dense problems with 4-bit or MXFP8 weights where it is the faster of the two (choose_stream_plan).
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "csrc/common/check.h"
#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/grouping.cuh"
#include "csrc/common/tensor_map.h"
#include "csrc/gemm/skinny/kernel.cuh"
#include "csrc/gemm/skinny/register_stream.cuh"

namespace fp4_gemm::skinny {
namespace {

using KernelFn = void (*)(SkinnyArgs);

// 128-byte stage rows, two stages: the smallest CTA that keeps a stage in flight, so the most CTAs
// (and consumer warps) per SM (docs/PERFORMANCE.md, kDefaultLanes).
constexpr int kDefaultLanes = 2;
constexpr int kDefaultStages = 2;
constexpr int kWideLanes = 4;  // where the K split cannot grow (make_plan): 256-byte stage rows
constexpr int kMaxSplits = 8;      // the portable cluster size
// GemmProblem::variant names a kernel of the tier (problem.h); any other value lets the planner choose.
constexpr int kVariantStaged = kVariantSkinnyStaged;
constexpr int kVariantRegisterStream = kVariantSkinnyRegisterStream;
constexpr int kMaxDevices = 64;

// Operand pairs the kernel decodes: the three symmetric modes, E0M3 weights under NVFP4 or E0M3
// activations, and bf16 activations (W4A16) over NVFP4, MXFP4 or MXFP8 weights.
bool operand_pair_supported(OperandFormat a, OperandFormat b) {
  switch (b) {
    case OperandFormat::Nvfp4:
    case OperandFormat::Mxfp4:
    case OperandFormat::Mxfp8: return a == b || a == OperandFormat::Bf16;
    case OperandFormat::E0m3: return a == OperandFormat::Nvfp4 || a == OperandFormat::E0m3;
    case OperandFormat::Bf16: return false;
  }
  return false;
}

int64_t row_bytes(OperandFormat format, int64_t k) { return k * element_bits(format) / 8; }

size_t float_type_bytes(FloatType type) { return type == FloatType::Fp32 ? 4 : 2; }

// The most activation rows one group hands a unit: its tile count is 1 (<= 8) or 2.
int64_t max_unit_rows(const GemmProblem& p) {
  switch (p.grouping) {
    case Grouping::Batched:
    case Grouping::Masked: return std::min<int64_t>(p.group_rows, kMaxTokens);
    case Grouping::Contiguous: return std::min<int64_t>(p.m, kMaxTokens);
    default: return p.m;
  }
}

// Grouped bf16 activations (the W4A16 modes) with more rows per group than a unit holds: the units
// walk each group in 16-row chunks, streaming its weight once per chunk (dispatch takes this where
// no arch kernel reads a bf16 A).
bool chunks_groups(const GemmProblem& p) { return p.a.format == OperandFormat::Bf16; }

// Dense problems of 17 to 64 rows on the register-streaming kernel (below, with the planner).
bool wide_stream_serves(const GemmProblem& p);

// NVFP4 outputs the register-streaming kernel encodes itself (below, with the planner).
bool stream_writes_nvfp4(const GemmProblem& p);

// Grouped problems whose groups own at most 16 rows each (batched, masked), or 16 on average
// (contiguous: a group with more rows is streamed once per 16-row chunk); any rows under
// chunks_groups. Every group's weight rows must start on a 128-row SfAtom tile (N % 128 == 0) when
// there are several.
bool grouping_supported(const GemmProblem& p) {
  const bool group_rows_fit = p.group_rows >= 1 && (p.group_rows <= kMaxTokens || chunks_groups(p));
  switch (p.grouping) {
    case Grouping::Dense: return p.groups == 1 && (p.m <= kMaxTokens || wide_stream_serves(p));
    case Grouping::Batched: return group_rows_fit && p.m == p.groups * p.group_rows;
    case Grouping::Masked: return p.group_index != nullptr && group_rows_fit && p.m == p.groups * p.group_rows;
    case Grouping::Contiguous: return p.group_index != nullptr && (p.m <= kMaxTokens * p.groups || chunks_groups(p));
  }
  return false;
}

bool supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.groups < 1 || p.k > INT32_MAX) return false;
  if (p.groups * p.n > INT32_MAX) return false;  // TMA box coordinates are int32
  if (p.schedule == Schedule::M256 || !grouping_supported(p)) return false;
  if (p.groups > 1 && p.n % kBlockRows != 0) return false;
  if (!operand_pair_supported(p.a.format, p.b.format)) return false;
  // Float32: the staged backend's stage (NVFP4 outputs and GeGLU encoded from it). NVFP4 (and
  // GeGLU, which has only NVFP4 outputs): where the register-streaming kernel encodes them.
  const bool fp32 = e.out_format == OutFormat::Fp32;
  const bool nvfp4 = nvfp4_output(e);
  if (e.out_format != OutFormat::Bf16 && e.out_format != OutFormat::Fp16 && !fp32 && !nvfp4) return false;
  if (e.activation == Activation::Geglu && !nvfp4) return false;
  if (e.bias_per_group && p.grouping == Grouping::Dense) return false;
  if (e.alpha != nullptr && !((e.alpha_count == 1 || e.alpha_count == p.groups) && is_aligned(e.alpha, 4))) return false;
  if (e.bias != nullptr && !is_aligned(e.bias, float_type_bytes(e.bias_type))) return false;
  // Paired output stores; bulk copies of B rows and SfAtom tiles; 16-byte loads of A, 4-byte of sfa.
  if (!is_aligned(e.out, fp32 ? 8 : 4) || (e.residual != nullptr && !is_aligned(e.residual, 2))) return false;
  if (p.k % block_size(p.b.format) != 0 || row_bytes(p.b.format, p.k) % kChunkBytes != 0) return false;
  if (row_bytes(p.a.format, p.k) % kChunkBytes != 0) return false;
  if (!is_aligned(p.a.values, 16) || !is_aligned(p.b.values, 16) || !is_aligned(p.b.scales, 16)) return false;
  if (block_scaled(p.a.format) && !is_aligned(p.a.scales, 4)) return false;
  // The streaming layout (tiles of 8 rows x 64 elements) is read by the M = 1 decode GEMV.
  if (p.b_interleaved && !(p.a.format == OperandFormat::Nvfp4 && p.b.format == OperandFormat::Nvfp4 &&
                           p.grouping == Grouping::Dense && p.m == 1 && p.n % 8 == 0 && p.k % 64 == 0)) {
    return false;
  }
  const int max_warps = p.variant == kVariantRegisterStream ? kStreamMaxWarps : 8;
  if (!(p.warps >= 0 && p.warps <= max_warps && p.stages >= 0 && p.stages <= kMaxStages && p.splits >= 0 &&
        p.splits <= kMaxSplits)) {
    return false;
  }
  return !nvfp4 || stream_writes_nvfp4(p);
}

// The kernel of an operand pair, and the power of two its codecs' values carry.
struct KernelChoice {
  KernelFn kernel;
  int unbias_exponent;
};

template <OperandFormat A, OperandFormat B>
KernelChoice kernel_for(bool two_token_tiles, bool interleaved) {
  constexpr int kUnbias = OperandCodec<A>::kUnbiasExponent + OperandCodec<B>::kUnbiasExponent;
  if constexpr (A == OperandFormat::Nvfp4 && B == OperandFormat::Nvfp4) {
    if (interleaved) return {&skinny_gemm_kernel<A, B, 1, true>, kUnbias};
  }
  return {two_token_tiles ? &skinny_gemm_kernel<A, B, 2, false> : &skinny_gemm_kernel<A, B, 1, false>, kUnbias};
}

KernelChoice select_kernel(const GemmProblem& p, bool two_token_tiles) {
  using F = OperandFormat;
  const bool il = p.b_interleaved;
  const bool bf16 = p.a.format == F::Bf16;
  switch (p.b.format) {
    case F::Nvfp4: return bf16 ? kernel_for<F::Bf16, F::Nvfp4>(two_token_tiles, il) : kernel_for<F::Nvfp4, F::Nvfp4>(two_token_tiles, il);
    case F::Mxfp4: return bf16 ? kernel_for<F::Bf16, F::Mxfp4>(two_token_tiles, il) : kernel_for<F::Mxfp4, F::Mxfp4>(two_token_tiles, il);
    case F::Mxfp8: return bf16 ? kernel_for<F::Bf16, F::Mxfp8>(two_token_tiles, il) : kernel_for<F::Mxfp8, F::Mxfp8>(two_token_tiles, il);
    case F::E0m3:
      return p.a.format == F::Nvfp4 ? kernel_for<F::Nvfp4, F::E0m3>(two_token_tiles, il)
                                    : kernel_for<F::E0m3, F::E0m3>(two_token_tiles, il);
    case F::Bf16: break;
  }
  throw std::logic_error("fp4_gemm skinny: unsupported operand formats");
}

int current_device() {
  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) throw std::runtime_error("fp4_gemm skinny: device index out of range");
  return device;
}

// The dynamic shared memory a block of `kernel` may use on this device (what it may opt into, less
// the kernel's static barriers), opted into once per kernel.
int max_dynamic_shared_memory(int device, const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, kernel);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  cudaFuncAttributes attributes{};
  FP4_GEMM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int bytes = device_attribute(device, cudaDevAttrMaxSharedMemoryPerBlockOptin) - int(attributes.sharedSizeBytes);
  FP4_GEMM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  cache.emplace(key, bytes);
  return bytes;
}

// How one problem runs.
struct Plan {
  KernelChoice choice;
  int token_tiles;
  int lanes;
  int stages;
  int splits;
  int threads;
  int64_t clusters;
  int64_t row_blocks;
  int64_t slabs;
  int64_t row_stages;
  int row_stride;
  int rows_bytes;
  int stage_bytes;
  int act_offset;
  int act_bytes;
  int span_offset;
  size_t smem;
};

// A contiguous problem's spans, in the scratch or in shared memory.
int64_t span_bytes(const GemmProblem& p) { return scratch_part_bytes(span_table_bytes(p.groups)); }

// The shared memory of a configuration (kernel.cuh's layout): `stages` ring buffers, then the two
// activation buffers, which the partial sums reuse, then the CTA's own contiguous spans.
void size_shared_memory(const GemmProblem& p, Plan& plan, int max_smem) {
  const int bits = element_bits(p.b.format);
  const int slab_blocks = kSlabBytes * 8 / bits / block_size(p.b.format);
  plan.row_stride = plan.lanes * kSlabBytes;  // a TMA box lands densely
  plan.rows_bytes = kBlockRows * plan.row_stride;
  plan.stage_bytes = plan.rows_bytes + int(ceil_div(3 + plan.lanes * slab_blocks, kSfTileCols)) * kSfTileBytes;
  const int word_bytes = (32 / bits) / 2 * 4;
  plan.act_bytes = plan.lanes * plan.token_tiles * kChunkWords * 32 * word_bytes;
  const int partial_bytes = plan.token_tiles * kTileTokens * kPartialStride * 4;
  const int act_region = std::max(2 * plan.act_bytes, partial_bytes);
  const int span_region = spans_in_block(p) ? int(span_bytes(p)) : 0;
  const int fit = (max_smem - act_region - span_region) / plan.stage_bytes;
  if (fit < 1) throw std::runtime_error("fp4_gemm skinny: the kernel configuration does not fit in shared memory");
  plan.stages = std::min(plan.stages, fit);
  plan.act_offset = plan.stages * plan.stage_bytes;
  plan.span_offset = spans_in_block(p) ? plan.act_offset + act_region : -1;
  plan.smem = size_t(plan.act_offset) + size_t(act_region) + size_t(span_region);
}

// Units the problem may have: exact for dense and batched (one per group, 16-row chunk and row
// block), an upper bound for masked (counts below group_rows) and contiguous (sum over groups of
// ceil(rows / 16) <= ceil(m / 16) + groups).
int64_t max_units(const GemmProblem& p, int64_t row_blocks) {
  switch (p.grouping) {
    case Grouping::Batched:
    case Grouping::Masked: return p.groups * ceil_div(p.group_rows, kMaxTokens) * row_blocks;
    case Grouping::Contiguous: return (ceil_div(p.m, kMaxTokens) + std::min(p.groups, p.m)) * row_blocks;
    default: return row_blocks;
  }
}

// The K split: the knob where the variant names this kernel or the one it stands in for (at most one
// slice per stage, and only where one cluster of it fits on an SM's resources), else the largest
// split whose CTAs all fit on the device at once (one wave), each slice at least one stage; when even
// one CTA per unit does not fit, the grid is persistent.
Plan make_plan(const GemmProblem& p, int lanes) {
  Plan plan{};
  plan.token_tiles = max_unit_rows(p) <= kTileTokens ? 1 : 2;
  plan.choice = select_kernel(p, plan.token_tiles == 2);
  plan.lanes = lanes;
  plan.stages = p.stages > 0 ? p.stages : kDefaultStages;
  plan.threads = (kRowGroups * plan.lanes + 1) * 32;
  const int device = current_device();
  size_shared_memory(p, plan, max_dynamic_shared_memory(device, reinterpret_cast<const void*>(plan.choice.kernel)));
  plan.row_blocks = ceil_div(p.n, kBlockRows);
  plan.slabs = ceil_div(row_bytes(p.b.format, p.k), kSlabBytes);
  plan.row_stages = ceil_div(plan.slabs, plan.lanes);
  const int device_sms = device_attribute(device, cudaDevAttrMultiProcessorCount);
  const int sms = p.sm_count > 0 ? std::min(p.sm_count, device_sms) : device_sms;
  const auto capacity = [&](int splits) {
    const int64_t ctas =
        resident_ctas(device, reinterpret_cast<const void*>(plan.choice.kernel), plan.threads, plan.smem, splits);
    return ctas / splits * sms / device_sms * splits;  // whole clusters on the SMs allowed
  };
  const int64_t units = max_units(p, plan.row_blocks);
  const int max_splits = int(std::min<int64_t>(kMaxSplits, plan.row_stages));
  plan.splits = 1;
  int64_t best = 0;
  for (int splits = 1; splits <= max_splits; ++splits) {
    const int64_t ctas = units * splits;
    if (ctas <= capacity(splits) && ctas > best) {
      best = ctas;
      plan.splits = splits;
    }
  }
  // The register-streaming kernel, named where it cannot serve (choose_stream_plan), passes its knob on.
  const bool named = p.variant == kVariantStaged || p.variant == kVariantRegisterStream;
  const int forced = named ? std::min(p.splits, max_splits) : 0;
  if (forced > 0 && capacity(forced) >= forced) plan.splits = forced;
  const int64_t fits = std::max<int64_t>(1, capacity(plan.splits) / plan.splits);
  plan.clusters = std::min(units, fits);
  return plan;
}

// The stages one CTA streams back to back: its units times its slice of a row.
int64_t serial_stages(const GemmProblem& p, const Plan& plan) {
  return ceil_div(max_units(p, plan.row_blocks), plan.clusters) * ceil_div(plan.row_stages, plan.splits);
}

// The slab warps: the knob, else 2, or 4 where that shortens the chain of stages one CTA streams.
// That happens only where the split, not the device, bounds the grid at 2 (the expert-sized weights:
// one wave of clusters of kMaxSplits); 4 slab warps then take twice the K of a stage per CTA.
Plan make_plan(const GemmProblem& p) {
  if (p.warps > 0) return make_plan(p, std::min(p.warps, kMaxLanes));
  const Plan narrow = make_plan(p, kDefaultLanes);
  if (narrow.splits < kMaxSplits || narrow.clusters < max_units(p, narrow.row_blocks)) return narrow;
  const Plan wide = make_plan(p, kWideLanes);
  return serial_stages(p, wide) < serial_stages(p, narrow) ? wide : narrow;
}

// The operand fields both kernels' arguments share (SkinnyArgs, StreamArgs).
template <class Args>
void set_operands(const GemmProblem& p, Args& args) {
  args.a = static_cast<const uint8_t*>(p.a.values);
  args.sfa = p.a.scales;
  args.a_row_bytes = row_bytes(p.a.format, p.k);
  args.sfa_k_tiles = block_scaled(p.a.format) ? sf_k_tiles(p.k / block_size(p.a.format)) : 0;
  args.b = static_cast<const uint8_t*>(p.b.values);
  args.sfb = p.b.scales;
  args.b_row_bytes = row_bytes(p.b.format, p.k);
  args.sfb_k_tiles = sf_k_tiles(p.k / block_size(p.b.format));
}

// ---- the register-streaming kernel ------------------------------------------------------------

constexpr int kStreamStepsPerWarp = 4;  // the fewest steps of a row a warp's slice should hold
constexpr int kStreamLongSteps = kStreamMaxWarps * kStreamStepsPerWarp;  // one CTA's warps at 4 steps each
constexpr int kStreamClusterRows = 3;   // activation rows from which the planner's split runs (auto)
// Steps of 16-row tiles of the 4-bit weights it runs at M > 8 (auto): 64 per SM of a 132-SM Hopper,
// a fixed count, so that supports() decides without a device.
constexpr int64_t kStreamSmallWeightTileSteps = 64 * 132;
constexpr int kStreamMxfp8RowSteps = 64;     // the longest MXFP8 rows (K <= 8192) it runs at M > 8 (auto)

using StreamKernelFn = void (*)(StreamArgs);

struct StreamPlan {
  StreamKernelFn kernel;
  int unbias_exponent;
  int token_tiles;
  int splits;
  int slice_warps;
  int tile_warps;
  int tiles_per_cta;
  int64_t ctas;
  int steps;
  int token_stride;
  int partial_offset;
  size_t smem;
  int64_t cost;  // the serial work of one warp, in quarter steps (make_stream_plan)
};

int round_up_to(int value, int step) { return int(ceil_div(value, step) * step); }

// The steps (128 bytes each) of a weight row.
int stream_steps(const GemmProblem& p) { return int(ceil_div(row_bytes(p.b.format, p.k), kStreamStepBytes)); }

// Dense weights in the row-major layout, at most 16 rows: 4-bit weights with A in their format or
// bf16, MXFP8 weights with MXFP8 A (the API has no bf16-activation mode over MXFP8 weights).
bool register_stream_supported(const GemmProblem& p) {
  using F = OperandFormat;
  if (p.grouping != Grouping::Dense || p.groups != 1 || p.m > kStreamMaxTokens || p.b_interleaved) return false;
  if (p.b.format == F::Mxfp8) return p.a.format == F::Mxfp8;
  if (p.b.format != F::Nvfp4 && p.b.format != F::Mxfp4) return false;
  return p.a.format == p.b.format || p.a.format == F::Bf16;
}

template <OperandFormat A, OperandFormat B>
std::pair<StreamKernelFn, int> stream_kernel_for(int token_tiles) {
  constexpr int kUnbias = OperandCodec<A>::kUnbiasExponent + OperandCodec<B>::kUnbiasExponent;
  switch (token_tiles) {
    case 1: return {&register_stream_kernel<A, B, 1>, kUnbias};
    case 2: return {&register_stream_kernel<A, B, 2>, kUnbias};
    case 4: return {&register_stream_kernel<A, B, 4>, kUnbias};
    default: return {&register_stream_kernel<A, B, 8>, kUnbias};
  }
}

std::pair<StreamKernelFn, int> select_stream_kernel(const GemmProblem& p, int token_tiles) {
  using F = OperandFormat;
  const bool bf16 = p.a.format == F::Bf16;
  if (p.b.format == F::Mxfp8) return stream_kernel_for<F::Mxfp8, F::Mxfp8>(token_tiles);
  if (p.b.format == F::Nvfp4) {
    return bf16 ? stream_kernel_for<F::Bf16, F::Nvfp4>(token_tiles) : stream_kernel_for<F::Nvfp4, F::Nvfp4>(token_tiles);
  }
  return bf16 ? stream_kernel_for<F::Bf16, F::Mxfp4>(token_tiles) : stream_kernel_for<F::Mxfp4, F::Mxfp4>(token_tiles);
}

// Shared memory of a plan: every activation row's fragments of the longest K slice of a rank (and,
// with S > 1, the CTA's sums of its outputs over them once the weight loop is done), then the
// partial sums of every warp and tile.
void size_stream_shared_memory(const GemmProblem& p, StreamPlan& plan) {
  const int slice_steps = int(ceil_div(plan.steps, plan.splits));
  plan.token_stride = slice_steps * stream_step_fragment_bytes(element_bits(p.b.format)) + 64;  // 64 mod 128
  const int act_bytes = int(p.m + 1) * plan.token_stride;           // and a row of zeros
  const int sums_bytes = plan.splits > 1 ? plan.tiles_per_cta * int(p.m) * kStreamTileRows * 4 : 0;
  plan.partial_offset = std::max(act_bytes, sums_bytes);
  plan.smem = size_t(plan.partial_offset) +
              size_t(plan.tiles_per_cta) * plan.slice_warps * 32 * 4 * plan.token_tiles * 4;
}

// A plan's token tiles, steps of a row, split and warps of a group (Wk): the knob (a forced run), else
// one per kStreamStepsPerWarp steps of the rank's slice (at most 8: a slice of a few steps leaves
// each warp's first loads unhidden).
StreamPlan stream_plan_split(const GemmProblem& p, int splits, bool forced) {
  StreamPlan plan{};
  plan.token_tiles = stream_token_tiles(p.m);
  plan.steps = stream_steps(p);
  plan.splits = splits;
  const int slice_steps = int(ceil_div(plan.steps, splits));
  const int64_t warps = forced && p.warps > 0 ? p.warps : slice_steps / kStreamStepsPerWarp;
  plan.slice_warps = int(std::clamp<int64_t>(warps, 1, std::min(kStreamMaxWarps, slice_steps)));
  return plan;
}

// The plan of a K split over clusters of `splits` CTAs (stream_plan_split), or no kernel where the
// activations do not fit in shared memory. Groups (Wt, S > 1 only): as many as fill 8 warps, at most
// one per tile, so that more warps share the activations a CTA stages. Tiles per CTA: the knob, else
// the fewest that fit the grid in one wave of resident clusters (counted at one tile per group):
// a second, partial wave costs more than the CTAs' longer walks.
StreamPlan make_stream_plan(const GemmProblem& p, int splits, bool forced) {
  StreamPlan plan = stream_plan_split(p, splits, forced);
  std::tie(plan.kernel, plan.unbias_exponent) = select_stream_kernel(p, plan.token_tiles);
  const int slice_steps = int(ceil_div(plan.steps, splits));
  const int max_groups = splits > 1 ? kStreamMaxWarps / plan.slice_warps : 1;
  const int64_t row_tiles = ceil_div(p.n, kStreamTileRows);
  const int device = current_device();
  const auto kernel = reinterpret_cast<const void*>(plan.kernel);
  const int max_smem = max_dynamic_shared_memory(device, kernel);
  const int tile_step = stream_tiles_per_block(p.epilogue.activation);
  if (forced && p.stages > 0) {
    plan.tiles_per_cta = round_up_to(int(std::min<int64_t>(p.stages, row_tiles)), tile_step);
    plan.tile_warps = std::min(max_groups, plan.tiles_per_cta);
  } else {
    // Above 16 rows each tile's partial sums are 4 or 8 times larger: fewer tiles per CTA where they
    // would not fit (fewer groups, more and shorter clusters); so too for NVFP4 outputs, which have no
    // other kernel. stream_fits guarantees that one block's tiles fit at the largest split.
    const bool must_fit = p.m > kMaxTokens || nvfp4_output(p.epilogue);
    plan.tile_warps = int(std::min<int64_t>(max_groups, row_tiles));
    plan.tiles_per_cta = round_up_to(plan.tile_warps, tile_step);
    size_stream_shared_memory(p, plan);
    while (must_fit && plan.smem > size_t(max_smem) && plan.tile_warps > 1) {
      --plan.tile_warps;
      plan.tiles_per_cta = round_up_to(plan.tile_warps, tile_step);
      size_stream_shared_memory(p, plan);
    }
    if (plan.smem > size_t(max_smem)) return StreamPlan{};
    const int threads = plan.slice_warps * plan.tile_warps * 32;
    const int64_t clusters = std::max<int64_t>(1, resident_ctas(device, kernel, threads, plan.smem, splits) / splits);
    plan.tiles_per_cta = round_up_to(int(std::clamp<int64_t>(ceil_div(row_tiles, clusters), 1, kStreamMaxTiles)),
                                     tile_step);
    plan.tile_warps = std::min(plan.tile_warps, plan.tiles_per_cta);
    size_stream_shared_memory(p, plan);
    while (must_fit && plan.smem > size_t(max_smem) && plan.tiles_per_cta > tile_step) {
      plan.tiles_per_cta -= tile_step;
      plan.tile_warps = std::min(plan.tile_warps, plan.tiles_per_cta);
      size_stream_shared_memory(p, plan);
    }
  }
  size_stream_shared_memory(p, plan);
  if (plan.smem > size_t(max_smem)) return StreamPlan{};
  const int threads = plan.slice_warps * plan.tile_warps * 32;
  // A cluster must fit on the device at all (its CTAs on SMs of one GPC).
  if (splits > 1 && resident_ctas(device, kernel, threads, plan.smem, splits) == 0) return StreamPlan{};
  plan.ctas = ceil_div(row_tiles, plan.tiles_per_cta) * splits;
  // A warp streams ceil(P / Wt) tiles of its sub-slice; before that the CTA's threads stage the
  // activation chunks of the slice, each about a quarter of a step's work.
  plan.cost = 4 * ceil_div(plan.tiles_per_cta, plan.tile_warps) * ceil_div(slice_steps, plan.slice_warps) +
              ceil_div(int64_t(p.m + 1) * slice_steps * kStreamStepChunks, threads);
  return plan;
}

// The split: the knob (a forced run), else the one of the least serial work per warp
// (StreamPlan::cost), the smaller on a tie.
StreamPlan make_stream_plan(const GemmProblem& p, bool forced) {
  if (forced && p.splits > 0) return make_stream_plan(p, p.splits, true);
  const int steps = stream_steps(p);
  StreamPlan best{};
  for (int splits = 1; splits <= std::min(kMaxSplits, steps); ++splits) {
    const StreamPlan plan = make_stream_plan(p, splits, forced);
    if (plan.kernel != nullptr && (best.kernel == nullptr || plan.cost < best.cost)) best = plan;
  }
  return best;
}

// Where the register-streaming kernel runs, from the problem alone: where the variant names it, above
// 16 rows (wide_stream_serves chose it), else (auto) where it beats the staged kernel: every dense
// problem of up to 8 activation rows, and of 9 to 16 on expert-sized 4-bit weights (at most
// kStreamSmallWeightTileSteps steps of 16-row tiles) and on MXFP8 rows of at most
// kStreamMxfp8RowSteps steps (docs/PERFORMANCE.md). A grid limited to some SMs (sm_count) runs the
// staged kernel, whose grid is persistent.
bool register_stream_chosen(const GemmProblem& p) {
  if (p.variant == kVariantStaged || !register_stream_supported(p)) return false;
  if (p.variant == kVariantRegisterStream || p.m > kMaxTokens) return true;
  if (p.sm_count > 0) return false;
  if (p.m <= kTileTokens) return true;
  const int64_t steps = stream_steps(p);
  if (p.b.format == OperandFormat::Mxfp8) return steps <= kStreamMxfp8RowSteps;
  return ceil_div(p.n, kStreamTileRows) * steps <= kStreamSmallWeightTileSteps;
}

// The register-streaming kernel's split where it runs (register_stream_chosen): the knobs where the
// variant names it; from kStreamClusterRows rows on, the split of the least serial work
// (make_stream_plan); with fewer, staging the activations is cheap and one CTA per K range is
// fastest, unless that leaves its warps more than 4 steps each (long K): then the fewest CTAs, a
// power of two, whose slices have at most kStreamLongSteps steps. MXFP8 rows long enough for that to
// be kMaxSplits take it at every M (the least-work split is slower there than the staged kernel,
// S = 8 faster). No kernel: the activations do not fit, the staged kernel runs;
// an NVFP4 output, which it alone encodes, then takes any split that fits (stream_fits: the largest
// does).
StreamPlan choose_stream_plan(const GemmProblem& p) {
  if (!register_stream_chosen(p)) return StreamPlan{};
  if (p.variant == kVariantRegisterStream) return make_stream_plan(p, true);
  if (p.m > kMaxTokens) return make_stream_plan(p, false);
  const bool mxfp8 = p.b.format == OperandFormat::Mxfp8;
  const int64_t steps = stream_steps(p);
  int splits = 1;
  while (splits < kMaxSplits && steps > int64_t(splits) * kStreamLongSteps) splits *= 2;
  const bool least_work = p.m >= kStreamClusterRows && !(mxfp8 && splits == kMaxSplits);
  const StreamPlan plan = least_work ? make_stream_plan(p, false) : make_stream_plan(p, splits, false);
  if (plan.kernel == nullptr && !least_work && nvfp4_output(p.epilogue)) return make_stream_plan(p, false);
  return plan;
}

// The dynamic shared memory a block may opt into (sm_90, sm_100: 227 KB; sm_120: 99 KB, which this
// host-side check assumes for every other arch, sm_110 included: a problem it rejects runs staged).
int opt_in_shared_bytes(int cc) {
  return cc == static_cast<int>(GemmArch::Sm90) || cc == static_cast<int>(GemmArch::Sm100) ? 232448 : 101376;
}

// Whether the planner is sure to find a plan, from the problem alone (supports() runs without a
// device): the activations and one block's tiles of partial sums fit at the largest split (or the
// knobs of a forced run); the planner shrinks the tiles per CTA to fit.
bool stream_fits(const GemmProblem& p) {
  const bool forced = p.variant == kVariantRegisterStream;  // its knobs as make_stream_plan takes them
  const int splits = forced && p.splits > 0 ? p.splits : std::min(kMaxSplits, stream_steps(p));
  StreamPlan plan = stream_plan_split(p, splits, forced);
  const int tiles = forced && p.stages > 0 ? p.stages : 1;
  plan.tiles_per_cta = round_up_to(tiles, stream_tiles_per_block(p.epilogue.activation));
  size_stream_shared_memory(p, plan);
  return plan.smem <= size_t(opt_in_shared_bytes(p.cc));
}

// Dense problems of 17 to 64 rows: the register-streaming kernel, where the variant does not name
// the staged kernel (which stops at 16 rows) and its activations and one tile's partial sums fit the
// arch's shared memory at the largest split (stream_fits). A grid limited to some SMs (sm_count) is
// not served: the kernel's grid follows the weight. Dispatch takes it where it measured faster than
// the Hopper engine (dispatch.cpp).
bool wide_stream_serves(const GemmProblem& p) {
  if (p.m <= kMaxTokens || p.sm_count > 0 || p.variant == kVariantStaged) return false;
  return register_stream_supported(p) && stream_fits(p);
}

// NVFP4 outputs (and GeGLU) the register-streaming kernel encodes in its epilogue: where it would
// serve the same problem's float output (register_stream_chosen; 17 to 64 rows where
// wide_stream_serves), without a residual, in whole 16-column blocks, with scales to write, where a
// plan surely fits. The staged backend serves the others (on large weights its staged kernel plus
// the encode is the faster: docs/PERFORMANCE.md, stream_writes_nvfp4).
bool stream_writes_nvfp4(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (e.residual != nullptr || e.out_scales == nullptr || p.n_out() % kNvfp4OutGroup != 0) return false;
  return register_stream_chosen(p) && stream_fits(p);
}

void run_register_stream(const GemmProblem& p, const StreamPlan& plan, cudaStream_t stream) {
  StreamArgs args{};
  set_operands(p, args);
  args.n = p.n;
  args.m = int(p.m);
  args.row_chunks = int(args.b_row_bytes / kChunkBytes);
  args.steps = plan.steps;
  args.splits = plan.splits;
  args.slice_warps = plan.slice_warps;
  args.tile_warps = plan.tile_warps;
  args.tiles_per_cta = plan.tiles_per_cta;
  args.token_stride = plan.token_stride;
  args.partial_offset = plan.partial_offset;
  args.epilogue = p.epilogue;
  args.unbias = exp2i(plan.unbias_exponent);
  const dim3 block(unsigned(plan.slice_warps * plan.tile_warps * 32));
  launch_kernel_in_clusters(plan.kernel, dim3(unsigned(plan.ctas)), block, plan.smem, stream, p.pdl, plan.splits, args);
}

// Contiguous problems the CTAs do not find the spans of themselves: each group's span of rows
// (find_group_spans, from the ids on the device).
int64_t scratch_bytes(const GemmProblem& p) {
  return p.grouping == Grouping::Contiguous && !spans_in_block(p) ? span_bytes(p) : 0;
}

void run(const GemmProblem& p, cudaStream_t stream) {
  const StreamPlan stream_plan = choose_stream_plan(p);
  if (stream_plan.kernel != nullptr) {
    run_register_stream(p, stream_plan, stream);
    return;
  }
  if ((p.m > kMaxTokens && p.grouping == Grouping::Dense) || nvfp4_output(p.epilogue)) {
    throw std::runtime_error("fp4_gemm skinny: no register-streaming plan fits this problem (more than 16 rows or "
                             "an NVFP4 output)");
  }
  const Plan plan = make_plan(p);
  SkinnyArgs args{};
  if (!p.b_interleaved) {
    args.b_map = byte_matrix_map(p.b.values, p.groups * p.n, row_bytes(p.b.format, p.k), plan.row_stride,
                                       kBlockRows);
  }
  set_operands(p, args);
  args.n = p.n;
  args.row_blocks = plan.row_blocks;
  args.slabs = plan.slabs;
  args.row_stages = plan.row_stages;
  args.splits = plan.splits;
  args.lanes = plan.lanes;
  args.stages = plan.stages;
  args.row_stride = plan.row_stride;
  args.rows_bytes = plan.rows_bytes;
  args.stage_bytes = plan.stage_bytes;
  args.act_offset = plan.act_offset;
  args.act_bytes = plan.act_bytes;
  args.span_offset = plan.span_offset;
  args.epilogue = p.epilogue;
  args.unbias = exp2i(plan.choice.unbias_exponent);
  const int64_t needed = scratch_bytes(p);
  if (needed > 0 && (p.scratch == nullptr || p.scratch_bytes < needed)) {
    throw std::runtime_error("fp4_gemm skinny: a contiguous grouping needs the scratch scratch_bytes() asks for");
  }
  args.groups =
      spans_in_block(p) ? group_rows_without_spans(p) : device_group_rows(p, static_cast<int32_t*>(p.scratch), stream);
  launch_kernel_in_clusters(plan.choice.kernel, dim3(unsigned(plan.clusters * plan.splits)),
                            dim3(unsigned(plan.threads)), plan.smem, stream, p.pdl, plan.splits, args);
}

const GemmBackendRegistrar kRegistrar({"skinny", GemmArch::Portable, &supports, &run, &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm::skinny
