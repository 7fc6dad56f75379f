// Which rows of A (and of the output) each group owns, read on the device, for every kernel that
// runs a grouped GemmProblem (problem.h, Grouping): the Hopper engine's scheduler
// (sm90/scheduler.cuh) and the portable skinny kernels. Plain CUDA, every arch.
//
//   Dense:      one group, rows [0, m).
//   Batched:    group g owns rows [g R, (g + 1) R), R = group_rows.
//   Masked:     group g owns rows [g R, g R + clamp(counts[g], 0, R)).
//   Contiguous: group g's rows lie in its span [first[g], first[g] + rows[g]), from its first to its
//               last row with id g (find_group_spans, group_scales.h, writes the spans from the ids);
//               inside the span it owns the rows whose id is g. Valid ids (docs/API.md) make every
//               span hold only its own rows; other ids still never cause an access out of bounds.
//
// Nothing here synchronizes with the host, so a kernel built on it is CUDA-graph capturable and a
// replay reads the counts and ids of the moment.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// Rows [first, first + rows) of A hold group g's rows (and, outside Contiguous, only them).
struct GroupSpan {
  int64_t first;
  int64_t rows;
};

struct GroupRows {
  Grouping grouping = Grouping::Dense;
  int64_t groups = 1;
  int64_t m = 0;           // rows of A, all groups
  int64_t group_rows = 0;  // R of Batched and Masked
  const int32_t* counts = nullptr;  // Masked: [groups] valid rows per group
  const int32_t* ids = nullptr;     // Contiguous: [m] expert id per row
  const int32_t* first = nullptr;   // Contiguous: [groups] spans (find_group_spans)
  const int32_t* rows = nullptr;

  template <Grouping kGrouping>
  __device__ __forceinline__ GroupSpan span(int64_t g) const {
    if constexpr (kGrouping == Grouping::Batched) {
      return {g * group_rows, group_rows};
    } else if constexpr (kGrouping == Grouping::Masked) {
      const int64_t count = counts[g];
      return {g * group_rows, count < 0 ? 0 : count > group_rows ? group_rows : count};
    } else if constexpr (kGrouping == Grouping::Contiguous) {
      return {first[g], rows[g]};
    } else {
      return {0, m};
    }
  }

  __device__ __forceinline__ GroupSpan span(int64_t g) const {
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

  template <class Units>
  __device__ __forceinline__ bool seek(const GroupRows& rows, int64_t unit, const Units& units) {
    return seek(rows.groups, unit, [&rows](int64_t g) { return rows.span(g); }, units);
  }
};

// The GroupRows of a problem, for a kernel launched next on `stream`. A contiguous problem's spans
// are found first (find_group_spans, stream-ordered) into spans[0, 2 * groups): int32 device memory,
// the caller's scratch. Defined in group_scales.cu.
GroupRows device_group_rows(const GemmProblem& p, int32_t* spans, cudaStream_t stream);

}  // namespace fp4_gemm
