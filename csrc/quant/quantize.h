// Block quantization of a bf16/fp16 matrix: element codes plus one scale byte per block of g
// elements along each row (docs/FORMATS.md, "Quantizers"). Reference: reference.quantize_blocks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/common/sf_layout.cuh"
#include "csrc/common/types.h"

namespace fp4_gemm {

struct QuantizeProblem {
  const void* input;  // [in_rows, in_cols] row-major, contiguous
  FloatType input_type;  // bf16 or fp16
  int64_t in_rows;
  int64_t in_cols;
  // The output may be larger than the input (zero padding done here, by bounded reads).
  int64_t out_rows;
  int64_t out_cols;   // multiple of the format's block size
  void* values;       // [out_rows, out_cols] E4M3 bytes, or [out_rows, out_cols / 2] packed nibbles
  uint8_t* scales;    // every byte of scale_grid(layout, out_rows, out_cols / g) is written
  OperandFormat format;  // Mxfp8, Mxfp4, Nvfp4 or E0m3
  // NVFP4 only: each block's scale is the candidate of least squared error (docs/FORMATS.md, "MSE
  // variants"), not the round-to-nearest one.
  bool least_squares_scale = false;
  ScaleLayout layout;
  bool pdl;
};

void quantize(const QuantizeProblem& problem, cudaStream_t stream);

}  // namespace fp4_gemm
