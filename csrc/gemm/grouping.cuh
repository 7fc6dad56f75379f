// Which rows of A (and of the output) each group owns, read on the device, for every kernel that
// runs a grouped GemmProblem (problem.h, Grouping): the Hopper engine's scheduler
// (sm90/scheduler.cuh) and the portable skinny kernels. Plain CUDA, every arch.
//
//   Dense:      one group, rows [0, m).
//   Batched:    group g owns rows [g R, (g + 1) R), R = group_rows.
//   Masked:     group g owns rows [g R, g R + clamp(counts[g], 0, R)).
//   Contiguous: group g's rows lie in its span [first[g], first[g] + rows[g]), from its first to its
//               last row with id g (find_spans below: a kernel of its own, find_group_spans in
//               group_scales.h, writes them to global memory; for few rows (spans_in_block) every
//               block of the GEMM kernel writes them to its shared memory instead, the block spans);
//               inside the span it owns the rows whose id is g. Valid ids (docs/API.md) make every
//               span hold only its own rows; other ids still never cause an access out of bounds.
//
// Nothing here synchronizes with the host, so a kernel built on it is CUDA-graph capturable and a
// replay reads the counts and ids of the moment.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// Rows [first, first + rows) of A hold group g's rows (and, outside Contiguous, only them).
struct GroupSpan {
  int64_t first;
  int64_t rows;
};

// Contiguous problems of at most this many rows and groups: the GEMM kernel's blocks find the spans
// themselves (a memory round trip or two in their prologue, against a second launch and a scratch
// allocation), into 2 * groups int32 of their shared memory.
constexpr int64_t kBlockSpanLimit = 1024;

// The bytes of `groups` spans: first[groups], then rows[groups], int32.
constexpr int64_t span_table_bytes(int64_t groups) { return 2 * groups * int64_t(sizeof(int32_t)); }

inline bool spans_in_block(const GemmProblem& p) {
  return p.grouping == Grouping::Contiguous && p.m <= kBlockSpanLimit && p.groups <= kBlockSpanLimit;
}

struct GroupRows {
  Grouping grouping = Grouping::Dense;
  int64_t groups = 1;
  int64_t m = 0;           // rows of A, all groups
  int64_t group_rows = 0;  // R of Batched and Masked
  const int32_t* counts = nullptr;  // Masked: [groups] valid rows per group
  const int32_t* ids = nullptr;     // Contiguous: [m] expert id per row
  const int32_t* first = nullptr;   // Contiguous: [groups] spans (find_group_spans); null where the
  const int32_t* rows = nullptr;    // blocks find them, and span() is given those block spans

  template <Grouping kGrouping>
  __device__ __forceinline__ GroupSpan span(int64_t g, const int32_t* block_spans = nullptr) const {
    if constexpr (kGrouping == Grouping::Batched) {
      return {g * group_rows, group_rows};
    } else if constexpr (kGrouping == Grouping::Masked) {
      const int64_t count = counts[g];
      return {g * group_rows, count < 0 ? 0 : count > group_rows ? group_rows : count};
    } else if constexpr (kGrouping == Grouping::Contiguous) {
      if (block_spans != nullptr) return {block_spans[g], block_spans[groups + g]};
      return {first[g], rows[g]};
    } else {
      return {0, m};
    }
  }

  __device__ __forceinline__ GroupSpan span(int64_t g, const int32_t* block_spans = nullptr) const {
    if (block_spans != nullptr) return {block_spans[g], block_spans[groups + g]};  // only Contiguous has them
    switch (grouping) {
      case Grouping::Batched: return span<Grouping::Batched>(g);
      case Grouping::Masked: return span<Grouping::Masked>(g);
      case Grouping::Contiguous: return span<Grouping::Contiguous>(g);
      default: return span<Grouping::Dense>(g);
    }
  }

  // Whether group g writes row `row` of its span.
  __device__ __forceinline__ bool owns(int64_t g, int64_t row) const {
    return grouping != Grouping::Contiguous || ids[row] == g;
  }
};

// Run by a whole block (it synchronizes the block): group g's first and last row with id g into
// first[g] and last[g] (INT_MAX and -1 without any), global or shared memory. The rows where a run of
// ids starts or ends lower its first or raise its last: one atomic per group for valid ids. Each
// thread loads kBatch rows' ids before it compares, so a few hundred rows a thread cost one memory
// round trip rather than one per row (the ids are read-only while a kernel runs).
__device__ inline void find_first_last(const int32_t* ids, int m, int groups, int32_t* first, int32_t* last) {
  constexpr int kBatch = 4;
  for (int e = threadIdx.x; e < groups; e += blockDim.x) {
    first[e] = INT_MAX;
    last[e] = -1;
  }
  __syncthreads();
  const int stride = int(blockDim.x);
  for (int base = int(threadIdx.x); base < m; base += kBatch * stride) {
    int id[kBatch], before[kBatch], after[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = base + i * stride;
      id[i] = r < m ? __ldg(ids + r) : -1;
      before[i] = r > 0 && r < m ? __ldg(ids + r - 1) : -1;
      after[i] = r + 1 < m ? __ldg(ids + r + 1) : -1;
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = base + i * stride;
      if (id[i] < 0 || id[i] >= groups) continue;
      if (before[i] != id[i]) atomicMin(&first[id[i]], r);
      if (after[i] != id[i]) atomicMax(&last[id[i]], r);
    }
  }
  __syncthreads();
}

// Run by a whole block: the contiguous spans GroupRows reads, first[g] and rows[g] from group g's
// first to its last row (0 and 0 without any), global or shared memory.
__device__ inline void find_spans(const int32_t* ids, int m, int groups, int32_t* first, int32_t* rows) {
  find_first_last(ids, m, groups, first, rows);
  for (int e = threadIdx.x; e < groups; e += blockDim.x) {
    const int start = first[e], end = rows[e];
    first[e] = end >= start ? start : 0;
    rows[e] = end >= start ? end - start + 1 : 0;
  }
  __syncthreads();
}

// Walks the groups in order for a rising sequence of work-unit indices, where group g has
// units(span(g)) units: each call moves forward only, so a CTA's whole walk reads every group's
// span once (the masked counts, the contiguous spans).
struct GroupCursor {
  int64_t group = -1;  // the group of the last unit found
  int64_t base = 0;    // units of the groups before it
  int64_t count = 0;   // its units
  GroupSpan span{0, 0};

  // Moves to the group holding `unit` (>= every earlier argument); false past the last of `groups`
  // groups. span_of(g) gives group g's span (e.g. GroupRows::span), units(span) its units.
  template <class SpanOf, class Units>
  __device__ __forceinline__ bool seek(int64_t groups, int64_t unit, const SpanOf& span_of, const Units& units) {
    while (unit >= base + count) {
      base += count;
      if (++group >= groups) return false;
      span = span_of(group);
      count = units(span);
    }
    return true;
  }

  // block_spans: a contiguous problem's spans in the block's shared memory, if it found them.
  template <class Units>
  __device__ __forceinline__ bool seek(const GroupRows& rows, int64_t unit, const Units& units,
                                       const int32_t* block_spans = nullptr) {
    return seek(rows.groups, unit, [&rows, block_spans](int64_t g) { return rows.span(g, block_spans); }, units);
  }
};

// The GroupRows of a problem without a contiguous problem's spans (first and rows stay null): for a
// kernel whose blocks find them (spans_in_block). Defined in group_scales.cu, as the next.
GroupRows group_rows_without_spans(const GemmProblem& p);

// The GroupRows of a problem, for a kernel launched next on `stream`. A contiguous problem's spans
// are found first (find_group_spans, stream-ordered) into spans[0, 2 * groups): int32 device memory,
// the caller's scratch.
GroupRows device_group_rows(const GemmProblem& p, int32_t* spans, cudaStream_t stream);

}  // namespace fp4_gemm
