// Block dequantization: out[r, c] = element(r, c) * scale(r, c / g), one float32 multiply of the
// decoded element and block scale, then rounded to nearest even into the output type (overflow
// gives inf). A NaN scale gives NaN for its whole block (docs/FORMATS.md). Reference:
// reference.dequantize_blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/common/sf_layout.cuh"
#include "csrc/common/types.h"

namespace fp4_gemm {

struct DequantizeProblem {
  const void* values;     // [rows, cols] E4M3 bytes (Mxfp8) or [rows, cols / 2] packed nibbles
  const uint8_t* scales;  // swizzled (sf_offset over rows x cols / g) or plain [rows, cols / g]
  OperandFormat format;   // Mxfp8, Mxfp4, Nvfp4 or E0m3
  ScaleLayout layout;
  int64_t rows;
  int64_t cols;           // multiple of the format's block size
  void* out;              // [rows, cols] row-major, out_type
  FloatType out_type;     // Bf16, Fp16 or Fp32
};

void dequantize(const DequantizeProblem& problem, cudaStream_t stream);

// Whether two matrices can be dequantized in one launch: the same stored encoding, scale layout,
// column count and output type (a GEMM's A and B of one format).
bool pairable(const DequantizeProblem& first, const DequantizeProblem& second);

// Two pairable matrices in one launch over the rows of both: the second needs no launch of its own
// and fills the first's last wave.
void dequantize_pair(const DequantizeProblem& first, const DequantizeProblem& second, cudaStream_t stream);

}  // namespace fp4_gemm
