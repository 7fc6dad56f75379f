// How the skinny kernel stages activations for its codec (operand_codec.cuh): bf16 activations
// gathered into B's element order (Bf16Gather), block-scaled ones decoded by A's codec
// (ActivationChunk). The mma contracts its 16 k-slots in any order as long as both operands put
// the same element in the same slot.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "csrc/common/sf_layout.cuh"
#include "csrc/gemm/operand_codec.cuh"
#include "csrc/gemm/problem.h"

namespace fp4_gemm::skinny {

// bf16 activations (W4A16), gathered into the element order of B's codec: word w of a chunk is
// elements [w * E, (w + 1) * E) of the chunk's K range (E elements per word of B).
template <OperandFormat B>
struct Bf16Gather {
  static constexpr int kElements = WordShape<B>::kElements;
  static constexpr int kChunkBytes = WordShape<B>::kChunkElements * 2;
  static constexpr int kVectors = kChunkBytes / 16;

  // values: the chunk's bf16 elements as 16-byte vectors, in K order.
  __device__ __forceinline__ static void gather(const uint4 (&values)[kVectors], int w,
                                                uint32_t (&pairs)[WordShape<B>::kPairs]) {
    if constexpr (kElements == 8) {
      // 4-bit B: the word's 8 elements are one vector (e0 e1 | e2 e3 | e4 e5 | e6 e7), pair j = (j, j + 4)
      const uint32_t x[4] = {values[w].x, values[w].y, values[w].z, values[w].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) pairs[j] = __byte_perm(x[j / 2], x[j / 2 + 2], j % 2 ? 0x7632 : 0x5410);
    } else {
      // 8-bit B: the word's 4 elements are half a vector (e0 e1 | e2 e3), pairs (0, 2) and (1, 3)
      const uint4 v = values[w / 2];
      const uint32_t lo = w % 2 ? v.z : v.x;
      const uint32_t hi = w % 2 ? v.w : v.y;
      pairs[0] = __byte_perm(lo, hi, 0x5410);
      pairs[1] = __byte_perm(lo, hi, 0x7632);
    }
  }
};

// One 16-byte chunk of B's K range (chunk c: B's elements [c E, (c + 1) E), E = kChunkElements)
// read from an activation row in A's format, and its four words as B fragments in B's element
// order: what both skinny kernels stage in shared memory before their weight loops.
template <OperandFormat kA, OperandFormat kB>
struct ActivationChunk {
  static constexpr bool kBf16 = kA == OperandFormat::Bf16;
  static constexpr int kChunkElements = WordShape<kB>::kChunkElements;
  static constexpr int kPairs = WordShape<kB>::kPairs;
  static constexpr int kRawBytes = kBf16 ? kChunkElements * 2 : 16;  // bytes of A per chunk
  static constexpr int kVectors = kRawBytes / 16;

  uint4 values[kVectors];
  uint32_t codes;  // scale codes of the chunk's blocks from bit 0 (block-scaled A)

  // Chunk `chunk` of row `row` of A ([rows, a_row_bytes], SfAtom scales sfa of sfa_k_tiles K tiles).
  __device__ __forceinline__ void load(const uint8_t* a, const uint8_t* sfa, int64_t a_row_bytes, int64_t sfa_k_tiles,
                                       int64_t row, int64_t chunk) {
    const uint4* src = reinterpret_cast<const uint4*>(a + row * a_row_bytes + chunk * kRawBytes);
#pragma unroll
    for (int i = 0; i < kVectors; ++i) values[i] = __ldg(src + i);
    if constexpr (!kBf16) {
      const int64_t block = chunk * kChunkElements / OperandCodec<kA>::kBlock;
      const uint8_t* word = sfa + sf_offset(row, block & ~int64_t{3}, sfa_k_tiles);
      codes = __ldg(reinterpret_cast<const uint32_t*>(word)) >> (8 * (block & 3));
    }
  }

  // pairs[w]: word w's B fragments (kPairs bf16 pairs), decoded (block-scaled A) or gathered (bf16).
  __device__ __forceinline__ void fragments(uint32_t (&pairs)[kChunkWords][kPairs]) const {
    if constexpr (kBf16) {
#pragma unroll
      for (int w = 0; w < kChunkWords; ++w) Bf16Gather<kB>::gather(values, w, pairs[w]);
    } else {
      using CodecA = OperandCodec<kA>;
      const typename CodecA::Factors factors = CodecA::factors(codes);
      const uint32_t words[kChunkWords] = {values[0].x, values[0].y, values[0].z, values[0].w};
#pragma unroll
      for (int w = 0; w < kChunkWords; ++w) CodecA::template decode<true>(words[w], factors, w, pairs[w]);
    }
  }
};

}  // namespace fp4_gemm::skinny
