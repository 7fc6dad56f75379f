// Host-visible enums shared by the bindings and the kernels.
#pragma once

namespace fp4_gemm {

// Quantization recipe: element format, block size and scale rule (docs/FORMATS.md).
// Nvfp4Mse stores NVFP4 (same encoding) with a per-block least-squares scale choice.
enum class Recipe : int { Mxfp8 = 0, Mxfp4 = 1, Nvfp4 = 2, Nvfp4Mse = 3, E0m3 = 4 };

// Floating-point types read or written by kernels.
enum class FloatType : int { Bf16 = 0, Fp16 = 1, Fp32 = 2 };

}  // namespace fp4_gemm
