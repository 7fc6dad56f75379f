// The one table of element formats, and the host-visible enums the bindings and the kernels share
// (docs/FORMATS.md). A format's codec (quantize_block, decode) is csrc/common/formats.cuh's
// <Format>Recipe traits; its Python twin, reference.FORMATS.
#pragma once

#include <string_view>

namespace fp4_gemm {

// Element format and block scale of an operand: E4M3/UE8M0 per 32, E2M1/UE8M0 per 32,
// E2M1/UE4M3 per 16, E0M3/UE4M3 per 16; or plain bf16 values without scales (Bf16, the activations
// of the W4A16 tier: A only, its block size is B's).
enum class OperandFormat : int { Mxfp8 = 0, Mxfp4 = 1, Nvfp4 = 2, E0m3 = 3, Bf16 = 4 };
inline constexpr std::string_view kOperandFormatNames[] = {"mxfp8", "mxfp4", "nvfp4", "e0m3", "bf16"};

// Elements per scale block; a Bf16 operand has none (0), so callers take B's.
inline constexpr int block_size(OperandFormat f) {
  return f == OperandFormat::Bf16 ? 0 : f == OperandFormat::Mxfp8 || f == OperandFormat::Mxfp4 ? 32 : 16;
}
inline constexpr int element_bits(OperandFormat f) {
  return f == OperandFormat::Bf16 ? 16 : f == OperandFormat::Mxfp8 ? 8 : 4;
}
inline constexpr bool block_scaled(OperandFormat f) { return f != OperandFormat::Bf16; }

// Floating-point types read or written by kernels.
enum class FloatType : int { Bf16 = 0, Fp16 = 1, Fp32 = 2 };

}  // namespace fp4_gemm
