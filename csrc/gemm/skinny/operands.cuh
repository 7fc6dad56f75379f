// How the skinny kernels turn stored operand words into mma fragments, with the shared codecs of
// csrc/common/dequant.cuh (docs/FORMATS.md).
//
// A 32-bit word holds 8 four-bit codes or 4 E4M3 bytes of one row. It decodes exactly into fp16
// pairs: a 4-bit word into four pairs of elements (j, j + 4) (the cheapest pairing), an E4M3 word
// into pairs (0, 1), (2, 3). An mma k16 step takes two pairs per lane and row. The order of the
// elements inside the 16 k-slots of a step does not matter to a dot product as long as both
// operands are decoded the same way, which they are: A and B of a problem always have the same
// element width.
//
// UE4M3 block scales (NVFP4, E0M3) are folded into the fp16 values: E2M1 x UE4M3 and E0M3 x UE4M3
// have at most 7 significant bits and lie in [2^-10, 3136], so the product is exact (and normal)
// in fp16. UE8M0 scales (MX) leave the fp16 range: MX words are decoded unscaled, and each
// 32-element block's partial sum is scaled in float32 by the kernel.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "csrc/common/dequant.cuh"
#include "csrc/gemm/problem.h"

namespace fp4_gemm::skinny {

template <OperandFormat F>
struct OperandWord {
  static constexpr bool kEightBit = element_bits(F) == 8;
  static constexpr int kElements = kEightBit ? 4 : 8;
  static constexpr int kPairs = kElements / 2;
  static constexpr int kSteps = kPairs / 2;  // mma k16 steps one word feeds
  static constexpr bool kScaleFolded = F == OperandFormat::Nvfp4 || F == OperandFormat::E0m3;

  // The word's elements, unscaled, as fp16 pair bit patterns (mma operand registers).
  __device__ __forceinline__ static void decode(uint32_t word, uint32_t (&pairs)[kPairs]) {
    __half2 values[kPairs];
    if constexpr (F == OperandFormat::Mxfp8) {
      dequant_e4m3x4<__half>(word, values);
    } else {
#pragma unroll
      for (int j = 0; j < kPairs; ++j) {
        const uint32_t codes = nibble_pair_stride4(word, j);
        values[j] = F == OperandFormat::E0m3 ? decode_e0m3_pair<__half>(codes) : decode_e2m1_pair<__half>(codes);
      }
    }
#pragma unroll
    for (int j = 0; j < kPairs; ++j) pairs[j] = *reinterpret_cast<const uint32_t*>(&values[j]);
  }
};

// Pairs times one block scale pair (s, s): exact (see above), NaN scales give NaN.
template <int kPairs>
__device__ __forceinline__ void fold_scale(uint32_t (&pairs)[kPairs], __half2 scale) {
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const __half2 scaled = __hmul2(*reinterpret_cast<const __half2*>(&pairs[j]), scale);
    pairs[j] = *reinterpret_cast<const uint32_t*>(&scaled);
  }
}

// Bytes i0 and i1 of a word of UE4M3 scale codes as (s0, s0) and (s1, s1): the E4M3 codec reads a
// UE4M3 code (sign bit included, as the reference does) exactly, 0x7F as NaN.
__device__ __forceinline__ void ue4m3_scale_pairs(uint32_t codes, uint32_t i0, uint32_t i1, __half2 (&out)[2]) {
  dequant_e4m3x4<__half>(__byte_perm(codes, 0, i0 * 0x11u | i1 * 0x1100u), out);
}

// A word of the scale codes of blocks first .. first + 3, with the codes of blocks at or beyond
// `blocks` (K padding of the SfAtom layout) zeroed: no data lies there, and a code that is not 0
// (the contract says 0, nothing checks it) must not turn 0 x scale into NaN.
__device__ __forceinline__ uint32_t valid_scale_codes(uint32_t codes, int64_t first, int64_t blocks) {
  const int64_t valid = blocks - first;
  if (valid >= 4) return codes;
  return valid <= 0 ? 0u : codes & ((1u << (8 * valid)) - 1u);
}

}  // namespace fp4_gemm::skinny
