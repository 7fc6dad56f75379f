// One description of every GEMM of the package (docs/FORMATS.md, "GEMM result"):
//
//   out[m, n] = encode(act(alpha_scale * alpha[g(m)] * sum_k A[m, k] * B[g(m)][n, k] + bias + residual))
//
// over exactly dequantized block-scaled operands. The registered `gemm` op fills it from its
// arguments; dispatch hands it to the one backend that serves it. A new epilogue or grouping is a
// field here and a case in each backend, never a new kernel family. Each enum is followed by the
// names the op's string arguments give its values, in its order (torch_binding.cpp parses them;
// Python's GemmCall spells them): a new pointwise activation is a value and a name here, a case in
// epilogue.cuh's activate(), a line of reference.ACTIVATIONS, and one more case in
// tests/test_gemm_activations.py.
#pragma once

#include <cstdint>
#include <string_view>

#include "csrc/common/types.h"

namespace fp4_gemm {

// Which weight matrix each row of A multiplies, and which rows the op owns (writes).
//   Dense:      one weight.
//   Batched:    rows [g * group_rows, (g + 1) * group_rows) use weight g.
//   Contiguous: group_index[m] is row m's expert; ids outside [0, groups) are not owned.
//   Masked:     as Batched, but only the first clamp(group_index[g], 0, group_rows) rows of each
//               group are owned.
enum class Grouping : int { Dense = 0, Batched = 1, Contiguous = 2, Masked = 3 };
inline constexpr std::string_view kGroupingNames[] = {"dense", "batched", "contiguous", "masked"};

// Geglu: weight rows 2j (gate) and 2j + 1 (up) give out[:, j] = gelu(y[:, 2j]) * y[:, 2j + 1].
enum class Activation : int { None = 0, Gelu = 1, Relu2 = 2, Geglu = 3 };
inline constexpr std::string_view kActivationNames[] = {"none", "gelu", "relu2", "geglu"};

// Nvfp4FromFp16 rounds the epilogue result to fp16 before quantizing it. Fp32 is never a public
// output: it is the stage the staged backend has another backend write (staged.h).
enum class OutFormat : int { Bf16 = 0, Fp16 = 1, Nvfp4 = 2, Nvfp4FromFp16 = 3, Fp32 = 4 };
inline constexpr std::string_view kOutFormatNames[] = {"bf16", "fp16", "nvfp4", "nvfp4_from_fp16"};  // no Fp32

// The public function's schedule request: Auto lets dispatch choose; StreamK (the streamk functions)
// and M256 (the M >= 512 tier) name a flashrt-style tier. None of them changes the result.
enum class Schedule : int { Auto = 0, StreamK = 1, M256 = 2 };
inline constexpr std::string_view kScheduleNames[] = {"auto", "streamk", "m256"};

// GemmProblem::variant: a kernel configuration the caller names; -1 lets dispatch and the backends
// choose. 0, 1 and 2 are flashrt's "default", "widen" and "pingpong" ids, which each arch maps onto
// a tile it has (capabilities()["variant_tiles"]): sm_90 128 x 128, 128 x 256 and 64 x 256; the
// Blackwell kernels' BlackwellTile (blackwell/args.h). 3 and 4 name a kernel of the M <= 16 tier
// (tests and benchmarks hold both to the reference; no public function passes them).
inline constexpr int kVariantAuto = -1;
inline constexpr int kVariantDefaultTile = 0;
inline constexpr int kVariantWidenTile = 1;
inline constexpr int kVariantPingpongTile = 2;
inline constexpr int kVariantSkinnyStaged = 3;
inline constexpr int kVariantSkinnyRegisterStream = 4;

// A block-scaled operand: row-major stored values and CUTLASS SfAtom scales (docs/FORMATS.md).
struct GemmOperand {
  const void* values = nullptr;    // [rows, K * element_bits / 8] bytes, row pitch exactly that
  const uint8_t* scales = nullptr;  // swizzled scales of all rows (B: of all groups' rows); none for Bf16
  OperandFormat format = OperandFormat::Nvfp4;
};

struct GemmEpilogue {
  const float* alpha = nullptr;  // device: nullptr, one value, or one per group
  int64_t alpha_count = 0;
  float alpha_scale = 1.0f;
  const void* bias = nullptr;  // [N] or [groups, N] of bias_type
  FloatType bias_type = FloatType::Bf16;
  bool bias_per_group = false;
  const void* residual = nullptr;  // [M, N] of the output's dtype
  Activation activation = Activation::None;
  void* out = nullptr;  // [M, N_out] bf16/fp16/float32, or packed E2M1 [M, N_out / 2]
  uint8_t* out_scales = nullptr;  // swizzled UE4M3 scales of an NVFP4 output
  OutFormat out_format = OutFormat::Bf16;
};

struct GemmProblem {
  int64_t m = 0;       // rows of A (all groups)
  int64_t n = 0;       // rows of each weight matrix (before GeGLU halves the output)
  int64_t k = 0;
  int64_t groups = 1;  // weight matrices in B
  GemmOperand a;
  GemmOperand b;
  bool b_interleaved = false;  // B in the streaming layout (tiles of 8 rows x 64 elements)
  Grouping grouping = Grouping::Dense;
  const int32_t* group_index = nullptr;  // device: expert id per row (Contiguous), valid rows per group (Masked)
  int64_t group_rows = 0;
  GemmEpilogue epilogue;

  // How it runs, never what it computes.
  Schedule schedule = Schedule::Auto;
  int variant = kVariantAuto;
  int sm_count = -1;  // -1: all SMs of the device
  int warps = 0;      // skinny tiers: 0 picks
  int stages = 0;
  int splits = 0;     // skinny tiers: the CTAs of a cluster that split K; 0 picks
  bool pdl = false;
  // The compute capability of the device it runs on (the binding sets it; find_gemm_backend sets
  // the one it matches for on the problem supports() sees), so that a backend which dispatches in
  // turn asks for the same device.
  int cc = 0;
  // Scratch the binding allocates for the serving backend (GemmBackend::scratch_bytes) from the
  // stream-ordered caching allocator, so graph capture and concurrent streams stay safe. Not zeroed.
  void* scratch = nullptr;
  int64_t scratch_bytes = 0;

  int64_t n_out() const { return epilogue.activation == Activation::Geglu ? n / 2 : n; }
};

}  // namespace fp4_gemm
