// A block-scaled GEMM operand dequantized exactly into a 16-bit row-major matrix (docs/FORMATS.md;
// reference: reference.dequantize): what the backends that hand dense 16-bit operands to a matrix
// engine run first (the Hopper engine's bf16 B, the composition backend).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>

#include "csrc/gemm/problem.h"
#include "csrc/quant/dequantize.h"

namespace fp4_gemm {

// rows x k values of `operand` (swizzled scales), row-major, of `type` (bf16 or fp16).
inline DequantizeProblem operand_problem(const GemmOperand& operand, int64_t rows, int64_t k, FloatType type,
                                         void* out) {
  DequantizeProblem dq;
  dq.values = operand.values;
  dq.scales = operand.scales;
  dq.format = operand.format;
  dq.layout = ScaleLayout::Swizzled;
  dq.rows = rows;
  dq.cols = k;
  dq.out = out;
  dq.out_type = type;
  return dq;
}

// rows x k values of `operand` into out.
inline void dequantize_operand(const GemmOperand& operand, int64_t rows, int64_t k, FloatType type, void* out,
                               cudaStream_t stream) {
  dequantize(operand_problem(operand, rows, k, type, out), stream);
}

// The block-scaled ones of a GEMM's operands, each into its 16-bit copy: one launch for both where
// their formats match (dequantize_pair).
inline void dequantize_operands(const GemmOperand& a, int64_t m, void* a_out, const GemmOperand& b, int64_t n,
                                void* b_out, int64_t k, FloatType type, cudaStream_t stream) {
  const bool scaled_a = block_scaled(a.format), scaled_b = block_scaled(b.format);
  if (scaled_a && scaled_b) {
    const DequantizeProblem first = operand_problem(a, m, k, type, a_out);
    const DequantizeProblem second = operand_problem(b, n, k, type, b_out);
    if (pairable(first, second)) return dequantize_pair(first, second, stream);
  }
  if (scaled_a) dequantize_operand(a, m, k, type, a_out, stream);
  if (scaled_b) dequantize_operand(b, n, k, type, b_out, stream);
}

}  // namespace fp4_gemm
