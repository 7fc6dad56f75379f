// The Hopper backend: which problems the engine serves, its tile choice, and the launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/dequantize_operand.h"
#include "csrc/gemm/grouping.cuh"
#include "csrc/gemm/sm90/kernel.cuh"
#include "csrc/common/tensor_map.h"

namespace fp4_gemm::sm90 {
namespace {

// Operand pairs the engine decodes: the three symmetric modes, E0M3 weights under NVFP4 or E0M3
// activations, and bf16 activations (W4A16) with NVFP4 or MXFP4 weights; bf16 x bf16 is the plain
// bf16 GEMM underneath (dense only).
bool four_bit_weights(OperandFormat b) { return b == OperandFormat::Nvfp4 || b == OperandFormat::Mxfp4; }

bool operand_pair_supported(OperandFormat a, OperandFormat b) {
  if (a == b) return true;
  if (a == OperandFormat::Bf16) return four_bit_weights(b);
  return a == OperandFormat::Nvfp4 && b == OperandFormat::E0m3;
}

int64_t row_bytes(OperandFormat format, int64_t k) { return k * element_bits(format) / 8; }

// Groupings the scheduler serves (scheduler.cuh): dense; batched and masked over groups of
// group_rows rows; contiguous from the expert id of every row. Grouped kernels are built for the
// three symmetric modes (the halops functions' operands).
bool grouping_supported(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (p.grouping == Grouping::Dense) return p.groups == 1 && !e.bias_per_group && e.alpha_count <= 1;
  const bool w4a16 = p.a.format == OperandFormat::Bf16 && four_bit_weights(p.b.format);
  const bool symmetric = p.a.format == p.b.format && p.a.format != OperandFormat::E0m3 && p.a.format != OperandFormat::Bf16;
  if (!(w4a16 || symmetric) || p.groups < 1) return false;
  if (e.alpha_count > 1 && e.alpha_count != p.groups) return false;
  if (p.groups * p.n > INT32_MAX) return false;  // TMA row coordinates of B
  // The scheduler's 32-bit tile index inside a group (a contiguous span is at most all m rows).
  const int64_t group_rows = p.grouping == Grouping::Contiguous ? p.m : p.group_rows;
  if (ceil_div(group_rows, 128) * ceil_div(p.n, 128) > INT32_MAX) return false;
  switch (p.grouping) {
    case Grouping::Batched:
      return p.group_rows >= 1 && p.groups * p.group_rows == p.m;
    case Grouping::Masked:
      return p.group_rows >= 1 && p.groups * p.group_rows == p.m && p.group_index != nullptr;
    case Grouping::Contiguous:
      return p.group_index != nullptr && p.groups <= INT32_MAX;
    default:
      return false;
  }
}

bool supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (p.b_interleaved || !grouping_supported(p)) return false;
  if (e.out_format != OutFormat::Bf16 && e.out_format != OutFormat::Fp16 && e.out_format != OutFormat::Fp32) {
    return false;
  }
  if (e.activation == Activation::Geglu) return false;
  if (!operand_pair_supported(p.a.format, p.b.format)) return false;
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.m > INT32_MAX || p.n > INT32_MAX) return false;
  // TMA: 16-byte aligned bases and row pitches; bulk scale copies: 16-byte aligned buffers.
  if (row_bytes(p.a.format, p.k) % 16 != 0 || row_bytes(p.b.format, p.k) % 16 != 0) return false;
  if (!is_aligned(p.a.values, 16) || !is_aligned(p.b.values, 16)) return false;
  if ((block_scaled(p.a.format) && !is_aligned(p.a.scales, 16)) ||
      (block_scaled(p.b.format) && !is_aligned(p.b.scales, 16))) {
    return false;
  }
  // Paired stores and loads.
  const size_t pair_bytes = e.out_format == OutFormat::Fp32 ? 8 : 4;
  return is_aligned(e.out, pair_bytes) && (e.residual == nullptr || is_aligned(e.residual, pair_bytes));
}

int device_sm_count() {
  static int cache[64] = {};  // per device, asked once
  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) throw std::runtime_error("fp4_gemm sm90: device index out of range");
  if (cache[device] == 0) {
    FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&cache[device], cudaDevAttrMultiProcessorCount, device));
  }
  return cache[device];
}

int64_t sm_count(const GemmProblem& p) { return p.sm_count > 0 ? p.sm_count : device_sm_count(); }

// The output tile, rows x columns. variant 0: 128 x 128; 1 ("widen"): 128 x 256; 2: 64 x 256 (dense
// problems with block-scaled weights; others run 128 x 256); -1 picks by shape. A 256-wide tile
// decodes half the A fragments per column, which outweighs the narrow tiles' shorter tail wave.
//
// The 64-row tile runs no padding rows at M <= 64; above, it does about the same wgmma work as the
// 128-row tile but decodes B once per 64 rows, which pays only while there is little work per SM
// (short stream-K pieces: ramp, fix-up and epilogue dominate): up to kShortTileMaxRows rows and
// kShortTileMaxKTilesPerSm K tiles per SM. Other operand pairs (E0M3, bf16 x MXFP4: not measured)
// take it at M <= 64 only, where it is strictly less work. Evidence for each constant:
// docs/PERFORMANCE.md, "Tuned constants".
struct TileShape {
  int rows, width;
};

constexpr int64_t kShortTileRows = 64;
constexpr int64_t kShortTileMaxRows = 192;
constexpr int64_t kShortTileMaxKTilesPerSm = 32;

bool short_tile_pays(const GemmProblem& p) {
  if (p.m <= kShortTileRows) return true;
  const OperandFormat a = p.a.format, b = p.b.format;
  const bool measured_pair = (a == b && (a == OperandFormat::Nvfp4 || a == OperandFormat::Mxfp4 ||
                                         a == OperandFormat::Mxfp8)) ||
                             (a == OperandFormat::Bf16 && b == OperandFormat::Nvfp4);
  if (!measured_pair || p.m > kShortTileMaxRows) return false;
  const int64_t k_tiles = ceil_div(p.m, kShortTileRows) * ceil_div(p.n, 256) * ceil_div(p.k, 64);
  return k_tiles <= kShortTileMaxKTilesPerSm * sm_count(p);
}

// A swapped problem (sm90_swap_ab: the packed weight as A, bf16 activations as B): 128 weight rows by
// the fewest of 16, 32, 64, 128, 256 activation rows that hold them all.
bool swapped(const GemmProblem& p) { return p.a.format != OperandFormat::Bf16 && p.b.format == OperandFormat::Bf16; }

TileShape tile_shape(const GemmProblem& p) {
  if (p.grouping != Grouping::Dense) return {128, 256};  // the grouped kernels' one tile
  if (swapped(p)) return {128, p.n <= 16 ? 16 : p.n <= 32 ? 32 : p.n <= 64 ? 64 : p.n <= 128 ? 128 : 256};
  const bool short_tile_built = p.b.format != OperandFormat::Bf16;
  if (p.variant == kVariantDefaultTile) return {128, 128};
  if (p.variant == kVariantWidenTile) return {128, 256};
  if (p.variant == kVariantPingpongTile) return {short_tile_built ? 64 : 128, 256};  // no pingpong kernel here
  if (p.n <= 128) return {128, 128};
  return {short_tile_built && short_tile_pays(p) ? 64 : 128, 256};
}

// How the CTAs share the work (scheduler.cuh): one whole tile per CTA, or stream-K over
// one CTA per SM. Stream-K pays for its partial-tile fix-up only where whole tiles would leave their
// waves less than kWholeTileFillPercent full and there are few waves to spread that over; the
// streamk schedule asks for it always. Whole tiles in tile order have a wave's CTAs on neighbouring
// tiles at the same K offset, sharing A's and B's tiles in L2; stream-K's split tiles sit each at its
// own K offset, spread over the output, so they lose that sharing (docs/PERFORMANCE.md,
// kWholeTileFillPercent), and stream-K splits only the last waves' tiles.
// A tile of fewer than kStreamKMinKTiles K tiles (K < 512) runs whole in any case: its walk is too
// short to share, and whole tiles need no partial-tile fix-up and no flags, whose clearing is one
// more launch.
constexpr int64_t kWholeTileFillPercent = 95;
constexpr int64_t kStreamKMinKTiles = 8;

struct WorkSplit {
  int64_t ctas;
  bool stream_k;
  int64_t whole_tiles;  // Dense: the tiles CTAs take whole before the split ones (scheduler.cuh)
};

// Stream-K over more than a wave of tiles splits only the last wave's tiles; the CTAs take the tiles
// before them whole (scheduler.cuh), a wave's CTAs on neighbouring tiles at one K offset as without
// stream-K. Where the last wave holds fewer than 1 / kFewSplitTilesFraction of the SMs' tiles, each
// of its tiles would be split between kFewSplitTilesFraction CTAs or more, so the last two waves'
// tiles are split instead (docs/PERFORMANCE.md, kFewSplitTilesFraction).
constexpr int64_t kFewSplitTilesFraction = 16;

int64_t whole_tiles_before_split(int64_t tiles, int64_t sms) {
  const int64_t full_waves = tiles / sms, last_wave = tiles % sms;
  const int64_t split_waves = last_wave * kFewSplitTilesFraction < sms ? 2 : 1;
  return full_waves >= split_waves ? (full_waves - (split_waves - 1)) * sms : 0;
}

// A grouped problem's tile count is known on the device only; the persistent CTAs walk what there is.
// This bounds it: each group's rows in whole 128-row tiles; valid contiguous ids (each expert's rows
// consecutive) add at most one part-filled tile per expert.
int64_t grouped_tile_bound(const GemmProblem& p, const TileShape& tile) {
  const int64_t m_tiles = p.grouping == Grouping::Contiguous ? ceil_div(p.m, tile.rows) + p.groups
                                                             : p.groups * ceil_div(p.group_rows, tile.rows);
  return m_tiles * ceil_div(p.n, tile.width);
}

WorkSplit work_split(const GemmProblem& p, const TileShape& tile) {
  if (p.grouping != Grouping::Dense) {
    return {std::max<int64_t>(1, std::min(grouped_tile_bound(p, tile), sm_count(p))), false, 0};
  }
  const int64_t tiles = ceil_div(p.m, tile.rows) * ceil_div(p.n, tile.width);
  const int64_t k_tiles = ceil_div(p.k, 64);
  const int64_t units = tiles * k_tiles;
  const int64_t sms = sm_count(p);
  const bool part_filled = tiles * 100 < ceil_div(tiles, sms) * sms * kWholeTileFillPercent;
  const bool uneven = part_filled && tiles < 8 * sms && k_tiles >= kStreamKMinKTiles;
  if (p.schedule != Schedule::StreamK && !uneven) return {tiles, false, tiles};
  return {units < sms ? units : sms, true, whole_tiles_before_split(tiles, sms)};
}

// B is dequantized once into a bf16 scratch matrix (BSource::Bf16) when at least this many 128-row
// tiles of A would each decode it again; that costs K * N * (bits / 8 + 2) bytes of memory traffic
// and the scratch, and frees the consumers from decoding B. 128 x 256 tiles only
// (docs/PERFORMANCE.md, kBf16BMinRowTiles).
constexpr int64_t kBf16BMinRowTiles = 24;

// The bf16 copy of B is transient scratch; past this size the packed path runs instead.
constexpr int64_t kBf16BMaxBytes = int64_t(1) << 30;

bool bf16_b(const GemmProblem& p) {
  if (p.b.format == OperandFormat::Bf16) return false;  // already bf16: read as it is
  const TileShape tile = tile_shape(p);
  return p.grouping == Grouping::Dense && tile.rows == 128 && tile.width == 256 &&
         ceil_div(p.m, 128) >= kBf16BMinRowTiles && p.n * p.k * 2 <= kBf16BMaxBytes;
}

// The scratch the op allocates for a launch (GemmBackend::scratch_bytes), 256-byte aligned parts:
// stream-K flags, stream-K partial tiles, the bf16 B; or the contiguous groups' spans (unless the
// kernel's blocks find them: spans_in_block).
struct Scratch {
  int64_t partials = 0, b_bf16 = 0, spans = 0, bytes = 0;
};

Scratch scratch_layout(const GemmProblem& p) {
  const TileShape tile = tile_shape(p);
  const WorkSplit split = work_split(p, tile);
  Scratch layout;
  if (split.stream_k) {  // flags, then partial tiles: partial_slots_per_cta of each per CTA (scheduler.cuh)
    const int64_t slots = partial_slots_per_cta(int(tile.rows)) * split.ctas;
    layout.partials = scratch_part_bytes(slots * int64_t(sizeof(int)));
    layout.bytes = layout.partials + slots * int64_t(tile.rows) * tile.width * int64_t(sizeof(float));
  }
  if (bf16_b(p)) {
    layout.b_bf16 = scratch_part_bytes(layout.bytes);
    layout.bytes = layout.b_bf16 + p.n * p.k * 2;
  }
  if (p.grouping == Grouping::Contiguous && !spans_in_block(p)) {  // first[groups], then rows[groups]
    layout.spans = scratch_part_bytes(layout.bytes);
    layout.bytes = layout.spans + span_table_bytes(p.groups);
  }
  return layout;
}

int64_t scratch_bytes(const GemmProblem& p) { return scratch_layout(p).bytes; }

// B dequantized exactly into the bf16 scratch: the matrix BSource::Bf16 tiles come from.
const void* dequantize_b(const GemmProblem& p, const Scratch& layout, cudaStream_t stream) {
  void* out = static_cast<uint8_t*>(p.scratch) + layout.b_bf16;
  dequantize_operand(p.b, p.n, p.k, FloatType::Bf16, out, stream);
  return out;
}

// Lowers the stream-K flags before the engine runs (one block). The engine is launched behind it
// with PDL, so its prologue (barriers, tensor maps) overlaps this kernel; a cudaMemsetAsync would
// leave a gap before it.
__global__ void clear_flags(int* flags, int count) {
  griddep_wait();  // the previous kernel may still be reading the scratch these flags live in
  griddep_launch_dependents();
  for (int i = int(threadIdx.x); i < count; i += int(blockDim.x)) flags[i] = 0;
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
  const int64_t b_rows = p.groups * p.n;
  // Packed operands are byte matrices read as stored; bf16 ones come in the 128-byte swizzle.
  const CUtensorMap map_a =
      Config::kBf16A ? byte_matrix_map(p.a.values, p.m, row_bytes(Config::kFormatA, p.k), Config::kRowBytesA,
                                       Config::kBlockM, /*swizzle_128b=*/true)
                     : byte_matrix_map(p.a.values, p.m, row_bytes(Config::kFormatA, p.k), Config::kRowBytesA,
                                       Config::kBlockM);
  const void* b_bf16 = !Config::kPackedB && Config::kFormatB != OperandFormat::Bf16 ? dequantize_b(p, layout, stream)
                                                                                    : p.b.values;
  const CUtensorMap map_b =
      Config::kPackedB
          ? byte_matrix_map(p.b.values, b_rows, row_bytes(Config::kFormatB, p.k), Config::kRowBytesB, Config::kBlockN)
          : byte_matrix_map(b_bf16, p.n, p.k * 2, Config::kBlockK * 2, Config::kBlockN, /*swizzle_128b=*/true);
  EngineParams params;
  params.m = p.m;
  params.n = p.n;
  params.k = p.k;
  params.sfa = p.a.scales;
  params.sfb = p.b.scales;
  params.nkb = p.k / Config::kBlockSize;
  params.sf_k_atoms = sf_k_tiles(params.nkb);
  params.sf_row_tiles_a = ceil_div(p.m, kSfTileRows);
  params.sf_row_tiles_b = ceil_div(b_rows, kSfTileRows);
  ScheduleParams& schedule = params.schedule;
  schedule.k_tiles = ceil_div(p.k, Config::kBlockK);
  schedule.n_tiles = ceil_div(p.n, Config::kBlockN);
  schedule.m_tiles = ceil_div(p.m, Config::kBlockM);
  const WorkSplit split = work_split(p, {Config::kBlockM, Config::kBlockN});
  schedule.units = schedule.m_tiles * schedule.n_tiles * schedule.k_tiles;
  schedule.whole_tiles = split.whole_tiles;
  // Contiguous: the spans into the scratch (2 * groups int32 at layout.spans), found before the GEMM,
  // or by the kernel's blocks.
  schedule.groups =
      spans_in_block(p)
          ? group_rows_without_spans(p)
          : device_group_rows(p, reinterpret_cast<int32_t*>(static_cast<uint8_t*>(p.scratch) + layout.spans), stream);
  params.flags = nullptr;
  params.partials = nullptr;
  params.epilogue = p.epilogue;
  if (split.stream_k) {
    params.flags = static_cast<int*>(p.scratch);
    params.partials = reinterpret_cast<float*>(static_cast<uint8_t*>(p.scratch) + layout.partials);
    const int slots = partial_slots_per_cta(Config::kBlockM) * int(split.ctas);
    launch_kernel(clear_flags, dim3(1), dim3(256), 0, stream, p.pdl, params.flags, slots);
  }
  // After the spans or the flags kernel, PDL overlaps this kernel's prologue with it (the kernel
  // waits for it).
  const bool pdl = p.pdl || split.stream_k || (p.grouping == Grouping::Contiguous && !spans_in_block(p));
  launch_kernel(engine_kernel<Config>, dim3(unsigned(split.ctas)), dim3(Config::kThreads), Config::kSmemBytes, stream,
                pdl, map_a, map_b, params);
}

template <OperandFormat kA, OperandFormat kB>
void run_dense(const GemmProblem& p, const Scratch& layout, cudaStream_t stream) {
  const TileShape tile = tile_shape(p);
  if constexpr (kB == OperandFormat::Bf16) {
    if (tile.width == 256) return launch<EngineConfig<kA, kB, 256, BSource::Bf16>>(p, layout, stream);
    if constexpr (kA != OperandFormat::Bf16) {  // swapped: activation rows
      if (tile.width == 16) return launch<EngineConfig<kA, kB, 16, BSource::Bf16>>(p, layout, stream);
      if (tile.width == 32) return launch<EngineConfig<kA, kB, 32, BSource::Bf16>>(p, layout, stream);
      if (tile.width == 64) return launch<EngineConfig<kA, kB, 64, BSource::Bf16>>(p, layout, stream);
    }
    return launch<EngineConfig<kA, kB, 128, BSource::Bf16>>(p, layout, stream);
  } else {
    if (bf16_b(p)) return launch<EngineConfig<kA, kB, 256, BSource::Bf16>>(p, layout, stream);
    if (tile.rows == 64) {
      return launch<EngineConfig<kA, kB, 256, BSource::Packed, Grouping::Dense, 64>>(p, layout, stream);
    }
    if (tile.width == 256) return launch<EngineConfig<kA, kB, 256>>(p, layout, stream);
    return launch<EngineConfig<kA, kB, 128>>(p, layout, stream);
  }
}

template <OperandFormat kA, OperandFormat kB>
void run_grouped(const GemmProblem& p, const Scratch& layout, cudaStream_t stream) {
  switch (p.grouping) {
    case Grouping::Batched:
      return launch<EngineConfig<kA, kB, 256, BSource::Packed, Grouping::Batched>>(p, layout, stream);
    case Grouping::Masked:
      return launch<EngineConfig<kA, kB, 256, BSource::Packed, Grouping::Masked>>(p, layout, stream);
    default:
      return launch<EngineConfig<kA, kB, 256, BSource::Packed, Grouping::Contiguous>>(p, layout, stream);
  }
}

template <OperandFormat kA, OperandFormat kB>
void run_pair(const GemmProblem& p, cudaStream_t stream) {
  const Scratch layout = scratch_layout(p);
  // The scratch comes from the binding (scratch_bytes); a caller without it cannot run this problem.
  if (layout.bytes > 0 && (p.scratch == nullptr || p.scratch_bytes < layout.bytes)) {
    throw std::runtime_error("fp4_gemm sm90: the GEMM needs " + std::to_string(layout.bytes) + " bytes of scratch");
  }
  constexpr bool kGroupedPair = (kA == kB && kA != OperandFormat::E0m3 && kA != OperandFormat::Bf16) ||
                                (kA == OperandFormat::Bf16 && kB != OperandFormat::Bf16);
  if constexpr (kGroupedPair) {
    if (p.grouping != Grouping::Dense) return run_grouped<kA, kB>(p, layout, stream);
  }
  run_dense<kA, kB>(p, layout, stream);
}

void run(const GemmProblem& p, cudaStream_t stream) {
  using F = OperandFormat;
  if (p.a.format == F::Bf16) {
    switch (p.b.format) {
      case F::Nvfp4:
        return run_pair<F::Bf16, F::Nvfp4>(p, stream);
      case F::Mxfp4:
        return run_pair<F::Bf16, F::Mxfp4>(p, stream);
      default:
        return run_pair<F::Bf16, F::Bf16>(p, stream);
    }
  }
  switch (p.b.format) {
    case F::Mxfp8:
      return run_pair<F::Mxfp8, F::Mxfp8>(p, stream);
    case F::Mxfp4:
      return run_pair<F::Mxfp4, F::Mxfp4>(p, stream);
    case F::Nvfp4:
      return run_pair<F::Nvfp4, F::Nvfp4>(p, stream);
    case F::E0m3:
      return p.a.format == F::E0m3 ? run_pair<F::E0m3, F::E0m3>(p, stream) : run_pair<F::Nvfp4, F::E0m3>(p, stream);
    default:
      throw std::logic_error("fp4_gemm sm90: an operand format the engine does not decode");
  }
}

const GemmBackendRegistrar kRegistrar({"sm90_engine", GemmArch::Sm90, &supports, &run, &scratch_bytes});

// ---- sm90_swap_ab: W4A16 with the roles swapped ----------------------------------------------------
//
// out^T = W · X^T: the weight is the engine's A, decoded straight into wgmma's register fragments,
// and the few activation rows its bf16 B, which TMA delivers in the 128-byte swizzle; the decoded
// weight never goes through shared memory, and a tile spends its wgmma columns on activation rows
// (16, 32, 64, 128 or 256: tile_shape; more rows take several 256-wide tiles). Dense W4A16 (bf16
// activations, NVFP4 or MXFP4 weights) of at most 1024 rows (the composition's W4A16 floor), plain
// scaling into a bf16 or fp16 output whose rows are a multiple of 8 elements.
// Dispatch gives it the rows where it measured faster (dispatch.cpp, swap_ab_beats_engine).
constexpr int64_t kSwapMaxRows = 1024;

GemmProblem swap_roles(const GemmProblem& p) {
  GemmProblem q = p;
  q.a = p.b;
  q.b = p.a;
  q.m = p.n;
  q.n = p.m;
  return q;
}

// The engine's own rules for the same buffers (TMA rows and bases, scale copies), then the swapped
// tile's: dense W4A16, at most kSwapMaxRows rows, plain scaling into 16-byte pieces of 16-bit rows.
bool swap_supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (!supports(p) || p.grouping != Grouping::Dense) return false;
  if (p.a.format != OperandFormat::Bf16 || !four_bit_weights(p.b.format) || p.m > kSwapMaxRows) return false;
  if (e.out_format != OutFormat::Bf16 && e.out_format != OutFormat::Fp16) return false;
  if (e.bias != nullptr || e.residual != nullptr || e.activation != Activation::None) return false;
  return p.n % 8 == 0 && is_aligned(e.out, 16);
}

int64_t swap_scratch_bytes(const GemmProblem& p) { return scratch_layout(swap_roles(p)).bytes; }

void swap_run(const GemmProblem& p, cudaStream_t stream) {
  const GemmProblem q = swap_roles(p);
  if (q.a.format == OperandFormat::Nvfp4) return run_pair<OperandFormat::Nvfp4, OperandFormat::Bf16>(q, stream);
  run_pair<OperandFormat::Mxfp4, OperandFormat::Bf16>(q, stream);
}

const GemmBackendRegistrar kSwapRegistrar({"sm90_swap_ab", GemmArch::Sm90, &swap_supports, &swap_run,
                                           &swap_scratch_bytes});

}  // namespace
}  // namespace fp4_gemm::sm90
