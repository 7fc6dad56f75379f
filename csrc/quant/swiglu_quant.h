// Fused SwiGLU + block quantization of masked MoE groups (docs/FORMATS.md, "SwiGLU + quantization").
// Reference: reference.swiglu_quant_into.
//
// For row r of input = [gate | up] (bf16 [rows, 2 * hidden]), group r / M with M = rows / groups:
// the row is owned iff r % M < clamp(counts[group], 0, M). An owned row gets
// y = up * (gate / (1 + exp(-gate))) (math.cuh's swiglu_float32) quantized with the recipe (Mxfp8:
// E4M3 + UE8M0 per 32; Nvfp4: E2M1 + UE4M3 per 16), its values and every scale byte of its row of the
// swizzled grid (padding columns 0). Scale-grid padding rows (rows..ceil(rows/128)*128) get 0.
// Rows not owned are neither read nor written. counts is read on the device, whatever it holds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/common/sf_layout.cuh"
#include "csrc/common/types.h"

namespace fp4_gemm {

struct SwigluQuantProblem {
  const void* input;      // bf16 [rows, 2 * hidden], row-major, contiguous
  const int32_t* counts;  // [groups], device memory
  int64_t rows;           // groups * M
  int64_t hidden;         // multiple of the format's block size
  int64_t groups;         // >= 1
  OperandFormat format;   // Mxfp8 or Nvfp4
  void* values;           // [rows, hidden] E4M3 bytes, or [rows, hidden / 2] packed nibbles
  uint8_t* scales;        // swizzled over rows x hidden / g: ceil(rows/128) * ceil(hidden/g/4) * 512 bytes
};

void swiglu_quant(const SwigluQuantProblem& problem, cudaStream_t stream);

}  // namespace fp4_gemm
