// The skinny backend: which problems the M <= 16 kernels serve, how a launch is planned (warps,
// pipeline depth, K splits), the split-K scratch it asks the binding for, and the registration.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "csrc/common/check.h"
#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/skinny/kernel.cuh"

namespace fp4_gemm::skinny {
namespace {

using KernelFn = void (*)(SkinnyArgs);

// Defaults measured on the H200 (NVFP4, M = 1 and 16, (17408, 5120) and (5120, 17408)): 4 warps and
// 2 stages were fastest or within 3% of it; deeper rings were slower (more shared memory, fewer
// resident blocks), since the kernel is bound by its decode instructions, not by memory latency.
constexpr int kDefaultWarps = 4;
constexpr int kDefaultStages = 2;
constexpr int kMaxDevices = 64;
constexpr int kDefaultSharedBytes = 48 * 1024;  // above this a kernel must opt in
// The float32 partial sums of a K split make a round trip through memory: at most this many bytes.
constexpr int64_t kMaxPartialBytes = int64_t{8} << 20;
constexpr int64_t kCounterAlignment = 256;  // scratch layout: counters, then the partials, aligned

// Operand pairs the kernels decode: the three symmetric modes, and E0M3 weights under NVFP4 or E0M3
// activations.
bool operand_pair_supported(OperandFormat a, OperandFormat b) {
  switch (b) {
    case OperandFormat::Nvfp4:
    case OperandFormat::Mxfp4:
    case OperandFormat::Mxfp8: return a == b;
    case OperandFormat::E0m3: return a == OperandFormat::Nvfp4 || a == OperandFormat::E0m3;
  }
  return false;
}

size_t float_type_bytes(FloatType type) { return type == FloatType::Fp32 ? 4 : 2; }

int64_t row_bytes(const GemmProblem& p) { return p.k * element_bits(p.b.format) / 8; }

bool supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (p.m < 1 || p.m > kMaxTokens || p.n < 1 || p.k < 1 || p.n > INT32_MAX || p.k > INT32_MAX) return false;
  if (p.grouping != Grouping::Dense || p.groups != 1 || p.schedule == Schedule::M256) return false;
  if (!operand_pair_supported(p.a.format, p.b.format)) return false;
  if (e.out_format != OutFormat::Bf16 && e.out_format != OutFormat::Fp16) return false;
  if (e.activation == Activation::Geglu || e.bias_per_group) return false;
  if (e.alpha != nullptr && (e.alpha_count != 1 || !is_aligned(e.alpha, 4))) return false;
  if (e.bias != nullptr && !is_aligned(e.bias, float_type_bytes(e.bias_type))) return false;
  if (!is_aligned(e.out, 2) || (e.residual != nullptr && !is_aligned(e.residual, 2))) return false;
  // 16-byte copies of B and 4-byte loads of A at whole rows; 4-byte scale words.
  if (p.k % block_size(p.b.format) != 0 || row_bytes(p) % kChunkBytes != 0) return false;
  if (!is_aligned(p.a.values, 16) || !is_aligned(p.b.values, 16)) return false;
  if (!is_aligned(p.a.scales, 4) || !is_aligned(p.b.scales, 4)) return false;
  // The streaming layout (tiles of 8 rows x 64 elements) is read by the M = 1 decode GEMV.
  if (p.b_interleaved && !(p.a.format == OperandFormat::Nvfp4 && p.b.format == OperandFormat::Nvfp4 &&
                           p.m == 1 && p.n % 8 == 0 && p.k % 64 == 0)) {
    return false;
  }
  const bool warps_ok = p.warps == 0 || p.warps == 1 || p.warps == 2 || p.warps == 4 || p.warps == kMaxWarps;
  return warps_ok && p.stages >= 0 && p.stages <= kMaxStages;
}

template <OperandFormat A, OperandFormat B>
KernelFn kernel_for(const GemmProblem& p) {
  if constexpr (A == OperandFormat::Nvfp4 && B == OperandFormat::Nvfp4) {
    if (p.b_interleaved) return &skinny_gemm_kernel<A, B, 1, true>;
  }
  return p.m <= kTileTokens ? &skinny_gemm_kernel<A, B, 1, false> : &skinny_gemm_kernel<A, B, 2, false>;
}

KernelFn select_kernel(const GemmProblem& p) {
  using F = OperandFormat;
  switch (p.b.format) {
    case F::Nvfp4: return kernel_for<F::Nvfp4, F::Nvfp4>(p);
    case F::Mxfp4: return kernel_for<F::Mxfp4, F::Mxfp4>(p);
    case F::Mxfp8: return kernel_for<F::Mxfp8, F::Mxfp8>(p);
    case F::E0m3:
      return p.a.format == F::Nvfp4 ? kernel_for<F::Nvfp4, F::E0m3>(p) : kernel_for<F::E0m3, F::E0m3>(p);
  }
  throw std::logic_error("fp4_gemm skinny: unsupported operand formats");
}

int current_device() {
  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) throw std::runtime_error("fp4_gemm skinny: device index out of range");
  return device;
}

int device_sm_count(int device) {
  static int cache[kMaxDevices] = {};
  if (cache[device] == 0) {
    FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&cache[device], cudaDevAttrMultiProcessorCount, device));
  }
  return cache[device];
}

// Resident blocks per SM of a kernel configuration, asked once per (device, kernel, shape). Shared
// memory above 48 KiB is opted into first (an attribute of the function on the current device).
int blocks_per_sm(int device, KernelFn kernel, int threads, size_t smem) {
  static std::mutex mutex;
  static std::map<std::tuple<int, KernelFn, int, size_t>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, threads, smem);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  if (smem > size_t(kDefaultSharedBytes)) {
    FP4_GEMM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  }
  int blocks = 0;
  FP4_GEMM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  if (blocks < 1) throw std::runtime_error("fp4_gemm skinny: the kernel configuration does not fit on an SM");
  cache.emplace(key, blocks);
  return blocks;
}

// How one problem runs. Splitting K trades a float32 round trip of splits * M * N * 4 bytes for
// filling the GPU: the grid takes as many K splits as fit in one wave of resident blocks, at most one
// per slab and within kMaxPartialBytes.
struct Plan {
  KernelFn kernel;
  int warps;
  int stages;
  int64_t row_groups;
  int splits;
  int region_bytes;
  size_t smem;
  int64_t slabs;
  int64_t counter_bytes;  // scratch layout: one int32 counter per row group, then the partials
  int64_t partial_bytes;
};

Plan make_plan(const GemmProblem& p) {
  Plan plan{};
  plan.kernel = select_kernel(p);
  plan.warps = p.warps > 0 ? p.warps : kDefaultWarps;
  plan.stages = p.stages > 0 ? p.stages : kDefaultStages;
  plan.region_bytes = std::max(plan.stages * kSlotBytes, kReductionBytes);
  plan.smem = size_t(plan.warps) * plan.region_bytes;
  const int token_tiles = p.m <= kTileTokens ? 1 : 2;
  const int64_t block_rows = int64_t(kBlockFragments / token_tiles) * kTileRows;
  plan.row_groups = ceil_div(p.n, block_rows);
  plan.slabs = ceil_div(row_bytes(p), kSlabBytes);
  const int device = current_device();
  const int sms = p.sm_count > 0 ? std::min(p.sm_count, device_sm_count(device)) : device_sm_count(device);
  const int64_t capacity = int64_t(sms) * blocks_per_sm(device, plan.kernel, plan.warps * 32, plan.smem);
  const int64_t by_partials = kMaxPartialBytes / (p.m * p.n * 4);
  plan.splits = int(std::max<int64_t>(1, std::min({capacity / plan.row_groups, plan.slabs, by_partials})));
  if (plan.splits > 1) {
    plan.counter_bytes = ceil_div(plan.row_groups * 4, kCounterAlignment) * kCounterAlignment;
    plan.partial_bytes = int64_t(plan.splits) * p.m * p.n * 4;
  }
  return plan;
}

int64_t scratch_bytes(const GemmProblem& p) {
  const Plan plan = make_plan(p);
  return plan.counter_bytes + plan.partial_bytes;
}

void run(const GemmProblem& p, cudaStream_t stream) {
  Plan plan = make_plan(p);
  // A K split needs the scratch scratch_bytes() asked the binding for; without it, run unsplit.
  if (plan.splits > 1 && (p.scratch == nullptr || p.scratch_bytes < plan.counter_bytes + plan.partial_bytes)) {
    plan.splits = 1;
  }
  const GemmEpilogue& e = p.epilogue;
  SkinnyArgs args{};
  args.a = static_cast<const uint8_t*>(p.a.values);
  args.sfa = p.a.scales;
  args.b = static_cast<const uint8_t*>(p.b.values);
  args.sfb = p.b.scales;
  args.m = int(p.m);
  args.n = int(p.n);
  args.row_bytes = row_bytes(p);
  args.chunks = args.row_bytes / kChunkBytes;
  args.slabs = plan.slabs;
  args.scale_blocks = p.k / block_size(p.b.format);
  args.scale_k_tiles = sf_k_tiles(args.scale_blocks);
  args.eighth_stride = p.b_interleaved ? (p.k / 64) * 256 : 8 * args.row_bytes;
  args.slab_stride = p.b_interleaved ? 2 * 256 : kSlabBytes;
  args.splits = plan.splits;
  args.stages = plan.stages;
  args.region_bytes = plan.region_bytes;
  args.alpha = e.alpha;
  args.alpha_scale = e.alpha_scale;
  args.bias = e.bias;
  args.bias_type = e.bias_type;
  args.residual = e.residual;
  args.activation = e.activation;
  args.out = e.out;
  args.out_format = e.out_format;
  if (plan.splits > 1) {
    // The binding's scratch is stream-ordered (safe under graph capture and across streams) and
    // not zeroed: the counters start at 0 on every launch.
    uint8_t* scratch = static_cast<uint8_t*>(p.scratch);
    args.counters = reinterpret_cast<int32_t*>(scratch);
    args.partials = reinterpret_cast<float*>(scratch + plan.counter_bytes);
    FP4_GEMM_CUDA_CHECK(cudaMemsetAsync(args.counters, 0, size_t(plan.row_groups) * 4, stream));
  }
  launch_kernel(plan.kernel, dim3(unsigned(plan.row_groups), unsigned(plan.splits)), dim3(unsigned(plan.warps * 32)),
                plan.smem, stream, p.pdl, args);
}

const GemmBackendRegistrar kRegistrar({"skinny", GemmArch::Portable, 0, &supports, &run, &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm::skinny
