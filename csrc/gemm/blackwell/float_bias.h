// The Blackwell epilogue tree reads its bias as float32 (blackwell/epilogue.cuh), so that one kernel
// per (format, output type, tile) serves every bias dtype the API takes: a bf16 or fp16 bias, or an
// fp32 one that is not 16-byte aligned for the tree's vector loads, is first copied into scratch as
// float32. The widening is exact, so the result is the same as reading the bias in its own type.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/common/types.h"

namespace fp4_gemm {

// Elements of a bias of `width` columns, one row per group where it has one.
inline int64_t bias_elements(int64_t width, int64_t groups, bool per_group) { return per_group ? groups * width : width; }

// Widens `count` elements of `bias` (of `type`) into out[0, count). With `pdl` the kernel may start
// before the previous one ends (it waits for it before reading).
void widen_to_float(const void* bias, FloatType type, int64_t count, float* out, bool pdl, cudaStream_t stream);

}  // namespace fp4_gemm
