// E0M3 operands on a backend whose MMA has no E0M3: as one NVFP4 GEMM over a longer K
// (docs/FORMATS.md, "GEMM result"; reference: reference.gemm_into).
//
// Every E0M3 integer v is the sum of two E2M1 values with its sign, 2 floor(v / 2) and v mod 2
// (formats.cuh), under the block's own UE4M3 scale. With P_A and P_B the parts of each operand (2
// for E0M3, 1 for E2M1) and S = P_A P_B,
//
//   sum_k A[m, k] B[n, k] = sum_k sum_(i < P_A) sum_(j < P_B) A_i[m, k] B_j[n, k]
//
// is one NVFP4 GEMM over K' = S K: block kb becomes the S blocks kb' = kb S + s, s = i P_B + j,
// holding part i of A's block and part j of B's under the original scales. The products are the
// same exact values, split; only the float32 summation runs over K' terms, so the test bound reads
// K' for K. This backend writes both split operands into its scratch, scale grids padded with zero
// bytes (a padding scale meets zero-filled TMA values and must not be NaN), and hands the NVFP4
// problem, every other field unchanged, to the backend that serves it on the same device.
//
// Served: E0M3 A or B, the other E0M3 or NVFP4, B row-major, when another backend serves the NVFP4
// problem. Registered after the arch backends: the Hopper engine and the skinny tiers read E0M3
// directly and run first; on Blackwell this serves E0M3 wherever the skinny tiers do not.
#include <cstdint>
#include <stdexcept>

#include "csrc/common/formats.cuh"
#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/dispatch.h"

namespace fp4_gemm {
namespace {

constexpr int64_t kBlockBytes = 8;  // 16 packed 4-bit codes

bool is_e0m3(OperandFormat f) { return f == OperandFormat::E0m3; }
int parts(OperandFormat f) { return is_e0m3(f) ? 2 : 1; }
int split(const GemmProblem& p) { return parts(p.a.format) * parts(p.b.format); }

// One operand's split copy: values [rows, nkb * S] blocks, then its swizzled scales.
struct SplitLayout {
  int64_t rows, nkb;  // of the original operand
  int64_t values_bytes, scales_bytes;

  int64_t nkb_out(int s) const { return nkb * s; }
  int64_t bytes() const { return values_bytes + scales_bytes; }
};

SplitLayout split_layout(int64_t rows, const GemmProblem& p) {
  const int64_t nkb = p.k / 16, nkb_out = nkb * split(p);
  return {rows, nkb, scratch_part_bytes(rows * nkb_out * kBlockBytes),
          scratch_part_bytes(ceil_div(rows, kSfTileRows) * sf_k_tiles(nkb_out) * kSfTileBytes)};
}

SplitLayout a_layout(const GemmProblem& p) { return split_layout(p.m, p); }
SplitLayout b_layout(const GemmProblem& p) { return split_layout(p.groups * p.n, p); }
int64_t own_bytes(const GemmProblem& p) { return a_layout(p).bytes() + b_layout(p).bytes(); }

// Where the split operands sit in the scratch: A's values and scales, then B's (the inner backend's
// scratch follows). Before the scratch exists (supports, scratch_bytes) an aligned address stands in.
struct SplitBuffers {
  uint8_t *a_values, *a_scales, *b_values, *b_scales;
};

SplitBuffers split_buffers(const GemmProblem& p) {
  const SplitLayout a = a_layout(p), b = b_layout(p);
  uint8_t* const stand_in = reinterpret_cast<uint8_t*>(uintptr_t{1} << 12);
  uint8_t* base = p.scratch != nullptr ? static_cast<uint8_t*>(p.scratch) : stand_in;
  return {base, base + a.values_bytes, base + a.bytes(), base + a.bytes() + b.values_bytes};
}

// The NVFP4 problem over K' = S K, on the split operands.
GemmProblem inner_problem(const GemmProblem& p) {
  const SplitBuffers buffers = split_buffers(p);
  GemmProblem inner = p;
  inner.k = p.k * split(p);
  inner.a = {buffers.a_values, buffers.a_scales, OperandFormat::Nvfp4};
  inner.b = {buffers.b_values, buffers.b_scales, OperandFormat::Nvfp4};
  pass_scratch_past(p, own_bytes(p), inner);
  return inner;
}

bool split_applies(const GemmProblem& p) {
  const auto e2m1_or_e0m3 = [](OperandFormat f) { return f == OperandFormat::Nvfp4 || is_e0m3(f); };
  return (is_e0m3(p.a.format) || is_e0m3(p.b.format)) && e2m1_or_e0m3(p.a.format) && e2m1_or_e0m3(p.b.format) &&
         !p.b_interleaved && p.m >= 1 && p.n >= 1 && p.k >= 16 && p.k % 16 == 0 &&
         is_aligned(p.a.values, kBlockBytes) && is_aligned(p.b.values, kBlockBytes);
}

constexpr const char* kName = "e0m3_split";

bool supports(const GemmProblem& p) {
  return split_applies(p) && find_gemm_backend(inner_problem(p), p.cc) != nullptr;
}

int64_t scratch_bytes(const GemmProblem& p) {
  return own_bytes(p) + delegate_scratch_bytes(inner_problem(p), kName);
}

struct SplitParams {
  const uint64_t* values;  // [rows, nkb] blocks
  const uint8_t* scales;   // swizzled, nkb columns
  int64_t rows, nkb;
  bool e0m3;               // two parts; else the E2M1 block itself, repeated
  int part_stride;         // block s of a split group holds part (s / part_stride) % parts
  int split;               // S
  uint64_t* out_values;    // [rows, nkb * S] blocks
  uint8_t* out_scales;     // swizzled, nkb * S columns, padding zeroed
};

// One thread per (row, block) of the output's padded scale grid.
__global__ void __launch_bounds__(kMatrixThreads) split_kernel(const SplitParams p) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t nkb_out = p.nkb * p.split;
  const int64_t kb_out = matrix_col();
  if (kb_out >= sf_k_tiles(nkb_out) * kSfTileCols) return;
  const int64_t padded_rows = ceil_div(p.rows, kSfTileRows) * kSfTileRows;
  for (int64_t m = matrix_first_row(); m < padded_rows; m += matrix_row_stride()) {
    uint8_t scale = 0;
    if (m < p.rows && kb_out < nkb_out) {
      const int64_t kb = kb_out / p.split;
      const int s = int(kb_out % p.split);
      const uint64_t codes = __ldg(p.values + m * p.nkb + kb);
      const bool odd_part = p.e0m3 && (s / p.part_stride) % 2 == 1;
      const uint64_t part = !p.e0m3 ? codes : odd_part ? e0m3_odd_part_e2m1x16(codes) : e0m3_even_part_e2m1x16(codes);
      p.out_values[m * nkb_out + kb_out] = part;
      scale = p.scales[sf_offset(m, kb, sf_k_tiles(p.nkb))];
    }
    p.out_scales[sf_offset(m, kb_out, sf_k_tiles(nkb_out))] = scale;
  }
}

void launch_split(const GemmOperand& operand, const SplitLayout& layout, int part_stride, uint8_t* out_values,
                  uint8_t* out_scales, int s, bool pdl, cudaStream_t stream) {
  const SplitParams params{static_cast<const uint64_t*>(operand.values),
                           operand.scales,
                           layout.rows,
                           layout.nkb,
                           is_e0m3(operand.format),
                           part_stride,
                           s,
                           reinterpret_cast<uint64_t*>(out_values),
                           out_scales};
  const MatrixLaunch shape =
      matrix_launch(ceil_div(layout.rows, kSfTileRows) * kSfTileRows, sf_k_tiles(layout.nkb_out(s)) * kSfTileCols);
  launch_kernel(split_kernel, shape.grid, shape.block, 0, stream, pdl, params);
}

void run(const GemmProblem& p, cudaStream_t stream) {
  if (p.scratch_bytes < own_bytes(p)) {
    throw std::runtime_error("fp4_gemm: the split E0M3 GEMM got less scratch than scratch_bytes() asked for");
  }
  const SplitBuffers buffers = split_buffers(p);
  const int s = split(p);
  // A's part i fills the P_B blocks s = i P_B + j; B's part j every P_B-th block.
  launch_split(p.a, a_layout(p), parts(p.b.format), buffers.a_values, buffers.a_scales, s, p.pdl, stream);
  launch_split(p.b, b_layout(p), 1, buffers.b_values, buffers.b_scales, s, true, stream);
  GemmProblem inner = inner_problem(p);
  inner.pdl = true;  // the split kernels wait for the previous grid before their first read
  delegate_backend(inner, kName).run(inner, stream);
}

const GemmBackendRegistrar kRegistrar({kName, GemmArch::Portable, &supports, &run,
                                      &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm
