// The Hopper backend: which problems the engine serves, its tile choice, and the launch.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/sm90/engine.cuh"
#include "csrc/gemm/sm90/tensor_map.h"
#include "csrc/quant/dequantize.h"

namespace fp4_gemm::sm90 {
namespace {

// Operand pairs the engine decodes: the three symmetric modes, and E0M3 weights under NVFP4 or
// E0M3 activations.
bool operand_pair_supported(OperandFormat a, OperandFormat b) {
  if (a == b) return true;
  return a == OperandFormat::Nvfp4 && b == OperandFormat::E0m3;
}

int64_t row_bytes(OperandFormat format, int64_t k) { return k * element_bits(format) / 8; }

bool supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (p.grouping != Grouping::Dense || p.groups != 1 || p.b_interleaved) return false;
  if (e.out_format != OutFormat::Bf16 && e.out_format != OutFormat::Fp16 && e.out_format != OutFormat::Fp32) {
    return false;
  }
  if (e.activation == Activation::Geglu || e.bias_per_group || e.alpha_count > 1) return false;
  if (!operand_pair_supported(p.a.format, p.b.format)) return false;
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.m > INT32_MAX || p.n > INT32_MAX) return false;
  // TMA: 16-byte aligned bases and row pitches; bulk scale copies: 16-byte aligned buffers.
  if (row_bytes(p.a.format, p.k) % 16 != 0 || row_bytes(p.b.format, p.k) % 16 != 0) return false;
  if (!is_aligned(p.a.values, 16) || !is_aligned(p.b.values, 16)) return false;
  if (!is_aligned(p.a.scales, 16) || !is_aligned(p.b.scales, 16)) return false;
  // Paired stores and loads.
  const size_t pair_bytes = e.out_format == OutFormat::Fp32 ? 8 : 4;
  return is_aligned(e.out, pair_bytes) && (e.residual == nullptr || is_aligned(e.residual, pair_bytes));
}

int device_sm_count() {
  int device = 0, sms = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// variant 0: 128-wide tiles; 1 ("widen"): 256-wide; others pick 256 unless N fits 128. Measured on
// the H200: a 256-wide tile decodes half the A fragments per column and ran 1.4-1.6x faster per
// column than a 128-wide one at every shape of benchmarks/bench_gemm.py, M = 256 included, where
// the extra wave of the narrow tiles costs more than the wide tiles' tail.
int tile_width(const GemmProblem& p) {
  if (p.variant == 0) return 128;
  if (p.variant == 1) return 256;
  return p.n > 128 ? 256 : 128;
}

// How the CTAs share the work (engine.cuh, "work split"): one whole tile per CTA, or stream-K over
// one CTA per SM. Stream-K pays for its partial-tile fix-up only where whole tiles would leave the
// last wave part-empty and there are few waves to spread that over; the streamk schedule asks
// for it always.
struct WorkSplit {
  int64_t ctas;
  bool stream_k;
};

WorkSplit work_split(const GemmProblem& p, int width) {
  const int64_t tiles = ceil_div(p.m, 128) * ceil_div(p.n, width);
  const int64_t units = tiles * ceil_div(p.k, 64);
  const int64_t sms = p.sm_count > 0 ? p.sm_count : device_sm_count();
  const bool uneven = tiles % sms != 0 && tiles < 8 * sms;
  if (p.schedule != Schedule::StreamK && !uneven) return {tiles, false};
  return {units < sms ? units : sms, true};
}

// B is dequantized once into a bf16 scratch matrix (BSource::Bf16) when at least this many 128-row
// tiles of A would each decode it again; that costs K * N * (bits / 8 + 2) bytes of memory traffic
// and the scratch, and frees the consumers from decoding B. 256-wide tiles only. Measured on the
// H200 (cuBLAS bf16 time / ours): M = 2048 0.61-0.66 with it against 0.65-0.69 without; M = 4096
// 0.70-0.75 against 0.62; 8192^3 0.83-0.90 against 0.70.
constexpr int64_t kBf16BMinRowTiles = 24;

// The bf16 copy of B is transient scratch; past this size the packed path runs instead.
constexpr int64_t kBf16BMaxBytes = int64_t(1) << 30;

bool bf16_b(const GemmProblem& p) {
  return tile_width(p) == 256 && ceil_div(p.m, 128) >= kBf16BMinRowTiles && p.n * p.k * 2 <= kBf16BMaxBytes;
}

// The scratch the op allocates for a launch (GemmBackend::scratch_bytes), 256-byte aligned parts:
// stream-K flags, stream-K partial tiles, the bf16 B.
struct Scratch {
  int64_t partials = 0, b_bf16 = 0, bytes = 0;
};

constexpr int64_t kAlign = 256;

Scratch scratch_layout(const GemmProblem& p) {
  const int width = tile_width(p);
  const WorkSplit split = work_split(p, width);
  Scratch layout;
  if (split.stream_k) {
    layout.partials = ceil_div(split.ctas * int64_t(sizeof(int)), kAlign) * kAlign;
    layout.bytes = layout.partials + split.ctas * 128 * width * int64_t(sizeof(float));
  }
  if (bf16_b(p)) {
    layout.b_bf16 = ceil_div(layout.bytes, kAlign) * kAlign;
    layout.bytes = layout.b_bf16 + p.n * p.k * 2;
  }
  return layout;
}

int64_t scratch_bytes(const GemmProblem& p) { return scratch_layout(p).bytes; }

Recipe dequantize_recipe(OperandFormat format) {
  switch (format) {
    case OperandFormat::Mxfp8:
      return Recipe::Mxfp8;
    case OperandFormat::Mxfp4:
      return Recipe::Mxfp4;
    case OperandFormat::Nvfp4:
      return Recipe::Nvfp4;
    default:
      return Recipe::E0m3;
  }
}

// B dequantized exactly into the bf16 scratch: the matrix BSource::Bf16 tiles come from.
const void* dequantize_b(const GemmProblem& p, const Scratch& layout, cudaStream_t stream) {
  DequantizeProblem dq;
  dq.values = p.b.values;
  dq.scales = p.b.scales;
  dq.recipe = dequantize_recipe(p.b.format);
  dq.layout = ScaleLayout::Swizzled;
  dq.rows = p.n;
  dq.cols = p.k;
  dq.out = static_cast<uint8_t*>(p.scratch) + layout.b_bf16;
  dq.out_type = FloatType::Bf16;
  dequantize(dq, stream);
  return dq.out;
}

template <class Config>
void launch(const GemmProblem& p, const Scratch& layout, cudaStream_t stream) {
  static_assert(Config::kSmemBytes <= Config::kMaxSmem, "shared memory budget");
  // Per device: the attribute belongs to the function on the current device.
  static bool configured[64] = {};
  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  if (!configured[device]) {
    FP4_GEMM_CUDA_CHECK(cudaFuncSetAttribute(engine_kernel<Config>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             Config::kSmemBytes));
    configured[device] = true;
  }
  const CUtensorMap map_a = byte_matrix_map(p.a.values, p.m, row_bytes(Config::kFormatA, p.k), Config::kRowBytesA,
                                            Config::kBlockM);
  const CUtensorMap map_b =
      Config::kPackedB
          ? byte_matrix_map(p.b.values, p.n, row_bytes(Config::kFormatB, p.k), Config::kRowBytesB, Config::kBlockN)
          : byte_matrix_map(dequantize_b(p, layout, stream), p.n, p.k * 2, Config::kBlockK * 2, Config::kBlockN,
                            /*swizzle_128b=*/true);
  EngineParams params;
  params.m = p.m;
  params.n = p.n;
  params.k = p.k;
  params.sfa = p.a.scales;
  params.sfb = p.b.scales;
  params.k_tiles = ceil_div(p.k, Config::kBlockK);
  params.nkb = p.k / block_size(Config::kFormatA);
  params.sf_k_atoms = sf_k_tiles(params.nkb);
  params.sf_row_tiles_b = ceil_div(p.n, kSfTileRows);
  params.tiles_m = ceil_div(p.m, Config::kBlockM);
  const int64_t tiles = params.tiles_m * ceil_div(p.n, Config::kBlockN);
  params.units = tiles * params.k_tiles;
  params.flags = nullptr;
  params.partials = nullptr;
  params.epilogue = p.epilogue;
  int64_t ctas = tiles;
  const WorkSplit split = work_split(p, Config::kBlockN);
  if (split.stream_k) {
    ctas = split.ctas;
    params.flags = static_cast<int*>(p.scratch);
    params.partials = reinterpret_cast<float*>(static_cast<uint8_t*>(p.scratch) + layout.partials);
    FP4_GEMM_CUDA_CHECK(cudaMemsetAsync(params.flags, 0, ctas * sizeof(int), stream));
  }
  launch_kernel(engine_kernel<Config>, dim3(unsigned(ctas)), dim3(Config::kThreads), Config::kSmemBytes, stream,
                p.pdl, map_a, map_b, params);
}

template <OperandFormat kA, OperandFormat kB>
void run_pair(const GemmProblem& p, cudaStream_t stream) {
  const Scratch layout = scratch_layout(p);
  // The scratch comes from the binding (scratch_bytes); a caller without it cannot run this problem.
  if (layout.bytes > 0 && (p.scratch == nullptr || p.scratch_bytes < layout.bytes)) {
    throw std::runtime_error("fp4_gemm sm90: the GEMM needs " + std::to_string(layout.bytes) + " bytes of scratch");
  }
  if (bf16_b(p)) {
    launch<EngineConfig<kA, kB, 256, BSource::Bf16>>(p, layout, stream);
  } else if (tile_width(p) == 256) {
    launch<EngineConfig<kA, kB, 256>>(p, layout, stream);
  } else {
    launch<EngineConfig<kA, kB, 128>>(p, layout, stream);
  }
}

void run(const GemmProblem& p, cudaStream_t stream) {
  using F = OperandFormat;
  switch (p.b.format) {
    case F::Mxfp8:
      return run_pair<F::Mxfp8, F::Mxfp8>(p, stream);
    case F::Mxfp4:
      return run_pair<F::Mxfp4, F::Mxfp4>(p, stream);
    case F::Nvfp4:
      return run_pair<F::Nvfp4, F::Nvfp4>(p, stream);
    case F::E0m3:
      return p.a.format == F::E0m3 ? run_pair<F::E0m3, F::E0m3>(p, stream) : run_pair<F::Nvfp4, F::E0m3>(p, stream);
  }
}

const GemmBackendRegistrar kRegistrar({"sm90_engine", GemmArch::Sm90, 10, &supports, &run, &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm::sm90
