#include "csrc/gemm/dispatch.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "csrc/gemm/skinny/geometry.h"

namespace fp4_gemm {
namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
constexpr int64_t kSkinnyMaxRows = skinny::kMaxTokens;

// The fewest rows from which dequantizing both operands once and cuBLASLt's bf16 GEMM (the
// composition backend) beat the fused Hopper engine on every measured (N, K): MXFP8, MXFP4 or NVFP4
// on both sides, and every other pair with a block-scaled weight (W4A16 measured; E0M3 and mixed
// pairs not: they take the W4A16 value).
constexpr int64_t kCompositionMinRowsSameFormat = 768;
constexpr int64_t kCompositionMinRowsOther = 1024;

// 17 to 64 rows, dense: the M <= 16 tier's register-streaming kernel beat the engine's 64-row tile
// where its 16-row weight tiles times 8-row token tiles stay small (at most 4 token tiles, M <= 32)
// on narrow weights; or the caller names the kernel.
constexpr int kWideStreamMaxTokenTiles = 4;
constexpr int64_t kWideStreamMaxTileTokens = 1024;
constexpr int64_t kWideStreamMaxTileTokensMxfp8 = 768;

bool register_stream_beats_engine(const GemmProblem& p) {
  if (p.variant == kVariantSkinnyRegisterStream) return true;
  const int token_tiles = skinny::stream_token_tiles(p.m);
  if (token_tiles > kWideStreamMaxTokenTiles) return false;
  const int64_t weight_tiles = (p.n + skinny::kStreamTileRows - 1) / skinny::kStreamTileRows;
  const int64_t limit = p.b.format == OperandFormat::Mxfp8 ? kWideStreamMaxTileTokensMxfp8 : kWideStreamMaxTileTokens;
  return weight_tiles * token_tiles <= limit;
}

// 9 to 256 rows of W4A16 (bf16 activations, a 4-bit weight), dense, on sm_90: the engine with the
// roles swapped (sm90_swap_ab: the weight decoded into wgmma's register fragments, the activation rows
// as its narrow TMA-fed tile) beat the engine's own tiles and the register-streaming kernel at every
// measured M from 17 and weight, and the M <= 16 tier at 12 and 16 rows; from 9 rows that tier runs
// two 8-row token tiles, its 12-row cost, while the swapped tile is 16 rows wide from 1 to 16
// (docs/PERFORMANCE.md). A caller that names a tile or kernel (variant) gets it.
constexpr int64_t kSwapAbMinRows = 9;
constexpr int64_t kSwapAbMaxRows = 256;

bool swap_ab_beats_engine(const GemmProblem& p) { return p.variant == kVariantAuto; }

using A = ArchRule;
using G = GroupingRule;
using O = OperandRule;

// The policy, read top to bottom: the first row that matches the problem and whose backend serves it.
const std::vector<DispatchRow> kDispatchTable = {
    {"sm90_swap_ab", A::Hopper, G::Dense, kSwapAbMinRows, kSkinnyMaxRows, O::Bf16Activations,
     &swap_ab_beats_engine, "swap_ab_beats_engine",
     "W4A16 of 9 to 16 rows: the swapped tile beat the M <= 16 tier's two token tiles",
     "h100-gemm-w4a16-small-m.json"},
    {"skinny", A::Any, G::Any, 1, kSkinnyMaxRows, O::Any, nullptr, "",
     "at most 16 rows a weight: the weight streamed once at memory bandwidth beats any tile",
     "h200-gemm-skinny.json"},
    {"sm90_swap_ab", A::Hopper, G::Dense, kSkinnyMaxRows + 1, kSwapAbMaxRows, O::Bf16Activations,
     &swap_ab_beats_engine, "swap_ab_beats_engine",
     "W4A16 from 17 rows: the weight decoded into registers, the activation rows a narrow tile, beat the engine",
     "h100-gemm-w4a16-swap-decode.json"},
    {"skinny", A::Hopper, G::Dense, kSkinnyMaxRows + 1, skinny::kStreamMaxTokens, O::Any,
     &register_stream_beats_engine, "register_stream_beats_engine",
     "17 to 32 rows on narrow weights: the register-streaming kernel beat the engine's 64-row tile",
     "h200-skinny-wide-recheck.json"},
    {"composition", A::Hopper, G::Dense, kCompositionMinRowsSameFormat, kNoLimit, O::SameBlockScaled, nullptr, "",
     "from 768 rows: dequantize once + cuBLASLt bf16 beat the fused engine on every measured shape",
     "h200-composition-floor-dequantizer.json"},
    {"composition", A::Hopper, G::Dense, kCompositionMinRowsOther, kNoLimit, O::OtherBlockScaledB, nullptr, "",
     "from 1024 rows for the other pairs (W4A16 measured; E0M3 and mixed pairs take its value)",
     "h200-composition-floor-dequantizer.json"},
    {"sm90_engine", A::Any, G::Any, 1, kNoLimit, O::Any, nullptr, "",
     "the Hopper engine: every other problem it serves", "h200-gemm.json"},
    {"sm100_cutlass", A::Any, G::Any, 1, kNoLimit, O::Any, nullptr, "",
     "CUTLASS's block-scaled tcgen05 kernels (compile-verified)", ""},
    {"sm110_cutlass", A::Any, G::Any, 1, kNoLimit, O::Any, nullptr, "",
     "CUTLASS's block-scaled tcgen05 kernels for Thor (compile-verified)", ""},
    {"sm120_cutlass", A::Any, G::Any, 1, kNoLimit, O::Any, nullptr, "",
     "CUTLASS's block-scaled warp-level MMA kernels (compile-verified)", ""},
    {"composition", A::Any, G::Dense, kSkinnyMaxRows + 1, kNoLimit, O::Bf16Activations, nullptr, "",
     "bf16 activations no arch kernel reads: dequantize the weight once, cuBLASLt", ""},
    {"skinny", A::Any, G::Grouped, kSkinnyMaxRows + 1, kNoLimit, O::Bf16Activations, nullptr, "",
     "grouped bf16 activations no arch kernel reads: the M <= 16 kernels in 16-row chunks", ""},
    {"e0m3_split", A::Any, G::Any, 1, kNoLimit, O::E0m3, nullptr, "",
     "E0M3 no arch kernel reads: one NVFP4 GEMM over 2K or 4K", "h200-gemm-e0m3-split.json"},
    {"staged", A::Any, G::Any, 1, kNoLimit, O::Nvfp4OutputOrGeglu, nullptr, "",
     "NVFP4 outputs and GeGLU no kernel encodes: a float32 stage, then the encoding", "h200-gemm-staged.json"},
};

bool same_block_scaled(const GemmProblem& p) {
  const OperandFormat f = p.a.format;
  return f == p.b.format && (f == OperandFormat::Mxfp8 || f == OperandFormat::Mxfp4 || f == OperandFormat::Nvfp4);
}

bool operands_match(OperandRule rule, const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  switch (rule) {
    case OperandRule::Any: return true;
    case OperandRule::SameBlockScaled: return same_block_scaled(p);
    case OperandRule::OtherBlockScaledB: return block_scaled(p.b.format) && !same_block_scaled(p);
    case OperandRule::Bf16Activations: return p.a.format == OperandFormat::Bf16;
    case OperandRule::E0m3: return p.a.format == OperandFormat::E0m3 || p.b.format == OperandFormat::E0m3;
    case OperandRule::Nvfp4OutputOrGeglu:
      return e.out_format == OutFormat::Nvfp4 || e.out_format == OutFormat::Nvfp4FromFp16 ||
             e.activation == Activation::Geglu;
  }
  return false;
}

bool row_matches(const DispatchRow& row, const GemmProblem& p) {
  if (row.arch == ArchRule::Hopper && p.cc != static_cast<int>(GemmArch::Sm90)) return false;
  const bool dense = p.grouping == Grouping::Dense;
  if ((row.grouping == GroupingRule::Dense && !dense) || (row.grouping == GroupingRule::Grouped && dense)) return false;
  const int64_t rows = rows_per_group(p);
  if (rows < row.min_rows || rows > row.max_rows || !operands_match(row.operands, p)) return false;
  return row.condition == nullptr || row.condition(p);
}

const GemmBackend* registered(const char* name) {
  for (const GemmBackend& backend : gemm_backends()) {
    if (std::strcmp(backend.name, name) == 0) return &backend;
  }
  return nullptr;
}

// Each row's backend, looked up once: every backend registers while the library loads, before the
// first GEMM, so the hot path does no name lookups.
const std::vector<const GemmBackend*>& row_backends() {
  static const std::vector<const GemmBackend*> backends = [] {
    std::vector<const GemmBackend*> resolved;
    for (const DispatchRow& row : kDispatchTable) resolved.push_back(registered(row.backend));
    return resolved;
  }();
  return backends;
}

}  // namespace

bool arch_runs_on(GemmArch arch, int cc) {
  const int major = cc / 10;
  switch (arch) {
    case GemmArch::Portable:
      return cc == 90 || major == 10 || cc == 110 || major == 12;
    case GemmArch::Sm100:
      return major == 10;
    case GemmArch::Sm120:
      return major == 12;
    default:
      return static_cast<int>(arch) == cc;
  }
}

int64_t rows_per_group(const GemmProblem& p) {
  switch (p.grouping) {
    case Grouping::Batched:
    case Grouping::Masked: return p.group_rows;
    case Grouping::Contiguous: return p.groups > 0 ? (p.m + p.groups - 1) / p.groups : p.m;
    default: return p.m;
  }
}

const std::vector<DispatchRow>& dispatch_table() { return kDispatchTable; }

const GemmBackend* find_gemm_backend(const GemmProblem& problem, int cc) {
  GemmProblem matched = problem;
  matched.cc = cc;
  const std::vector<const GemmBackend*>& backends = row_backends();
  for (size_t i = 0; i < kDispatchTable.size(); ++i) {
    const GemmBackend* backend = backends[i];
    if (backend == nullptr || !row_matches(kDispatchTable[i], matched)) continue;
    if (arch_runs_on(backend->arch, cc) && backend->supports(matched)) return backend;
  }
  return nullptr;
}

const GemmBackend& delegate_backend(const GemmProblem& problem, const char* delegator) {
  const GemmBackend* backend = find_gemm_backend(problem, problem.cc);
  if (backend == nullptr) {
    throw std::runtime_error(std::string("fp4_gemm: no backend serves the ") + delegator +
                             " GEMM's problem on this device");
  }
  return *backend;
}

int64_t delegate_scratch_bytes(const GemmProblem& problem, const char* delegator) {
  const GemmBackend& backend = delegate_backend(problem, delegator);
  return backend.scratch_bytes == nullptr ? 0 : backend.scratch_bytes(problem);
}

void pass_scratch_past(const GemmProblem& outer, int64_t own_bytes, GemmProblem& inner) {
  inner.scratch = outer.scratch == nullptr ? nullptr : static_cast<uint8_t*>(outer.scratch) + own_bytes;
  inner.scratch_bytes = outer.scratch_bytes > own_bytes ? outer.scratch_bytes - own_bytes : 0;
}

}  // namespace fp4_gemm
