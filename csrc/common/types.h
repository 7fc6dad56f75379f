// Host-visible enums shared by the bindings and the kernels.
#pragma once

namespace fp4_gemm {

// Quantization recipe: element format, block size and scale rule (docs/FORMATS.md).
enum class Recipe : int { Mxfp8 = 0, Mxfp4 = 1, Nvfp4 = 2 };

// 16-bit floating-point types read or written by kernels.
enum class HalfType : int { Bf16 = 0, Fp16 = 1 };

}  // namespace fp4_gemm
