// MoE permutation into the padded layout of the masked grouped GEMM (docs/FORMATS.md, "MoE
// permutation"). Reference: reference.permute_into.
//
// Slot (t, s) of topk_ids [tokens, topk] with id e in [0, experts) has position p = the number of
// earlier slots, in (token, slot) row-major order, with the same id. Then
//   counts[e]        = number of slots with id e (the true count, above max_token_num too)
//   index_map[t, s]  = p if p < max_token_num, else -1; -1 for ids outside [0, experts)
//   permute_x[e * max_token_num + p]  = x[t]                       (placed slots only)
//   out_scale row e * max_token_num + p, block kb = the token's UE8M0 byte of block kb
// with out_scale swizzled (sf_offset) over experts * max_token_num rows and hidden / 32 blocks. The
// token's scale bytes: broadcast mode (int32 [tokens, hidden / 512]) byte j of int32 column i,
// little-endian, scales 128-element group 4i + j, so block kb reads byte kb / 4 of the row; direct
// mode (uint8 [tokens, hidden / 32]) byte kb. Rows no slot lands on are zero (values and scales):
// every byte of permute_x and out_scale is written.
//
// Positions never depend on the order of atomics: per-chunk per-expert counts, an exclusive scan
// over chunks, then each slot's stable rank inside its chunk.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4_gemm {

// Slots per chunk of the position computation, and the largest supported number of experts (one
// int32 counter per expert lives in shared memory).
constexpr int64_t kPermuteChunkSlots = 1024;
constexpr int64_t kPermuteMaxExperts = 8192;

struct PermuteProblem {
  const void* x;             // [tokens, hidden] bf16 or E4M3, row-major; copied as bytes
  int64_t tokens;
  int64_t row_bytes;         // hidden * element size
  int64_t hidden;            // multiple of 128 (32-blocks fill whole 4-block scale columns)
  const uint8_t* scale;      // the token scales as bytes, row-major
  bool broadcast_scale;      // true: int32 [tokens, hidden / 512]; false: uint8 [tokens, hidden / 32]
  const int64_t* topk_ids;   // [tokens, topk]
  int64_t topk;              // >= 1
  int64_t experts;           // 1 .. kPermuteMaxExperts
  int64_t max_token_num;     // >= 1
  void* permute_x;           // [experts * max_token_num, hidden], x's type
  uint8_t* out_scale;        // swizzled over experts * max_token_num rows x hidden / 32 blocks
  int32_t* index_map;        // [tokens, topk]
  int32_t* counts;           // [experts]
  int32_t* workspace;        // permute_workspace_elements(tokens * topk, experts) int32, any content
};

// int32 elements of scratch the op needs: one counter per (chunk of slots, expert).
constexpr int64_t permute_workspace_elements(int64_t slots, int64_t experts) {
  return (slots + kPermuteChunkSlots - 1) / kPermuteChunkSlots * experts;
}

void permute_to_masked(const PermuteProblem& problem, cudaStream_t stream);

}  // namespace fp4_gemm
