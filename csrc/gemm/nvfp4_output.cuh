// The encoding of an NVFP4 GEMM output (docs/FORMATS.md, "GEMM result"), shared by the kernels
// that write one: the staged backend's encode kernel (staged.cu) and the register-streaming skinny
// kernel's epilogue. A block is 16 consecutive output columns of one row, finished by
// epilogue.cuh's epilogue_sum and nvfp4_output_value and encoded by formats.cuh's quantize_block,
// bit-exact with reference.quantize_blocks; the swizzled scale grid is written whole, its padding
// as zeros.
#pragma once

#include <cstdint>

#include "csrc/common/formats.cuh"
#include "csrc/common/sf_layout.cuh"
#include "csrc/quant/block_io.cuh"

namespace fp4_gemm {

constexpr int kNvfp4OutGroup = Nvfp4Recipe::kGroup;
constexpr int kNvfp4OutBlockBytes = kStoredBytes<Nvfp4Recipe::kElement, kNvfp4OutGroup>;

// Encodes the block x into its packed codes at dst (one 8-byte store where `vector`), returns its
// scale code.
__device__ __forceinline__ uint8_t encode_nvfp4_block(const float (&x)[kNvfp4OutGroup], uint8_t* dst, bool vector) {
  uint32_t signs[kNvfp4OutGroup / 8], stored[kNvfp4OutBlockBytes / 4];
  nibble_signs<kNvfp4OutGroup>(x, signs);
  const uint8_t scale = quantize_block<Nvfp4Recipe>(x, amax_bits<kNvfp4OutGroup>(x), signs, stored);
  store_words<kNvfp4OutBlockBytes>(dst, stored, vector);
  return scale;
}

}  // namespace fp4_gemm
