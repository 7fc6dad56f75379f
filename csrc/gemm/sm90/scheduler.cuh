// The Hopper engine's tile scheduler: which work each persistent CTA takes, as a sequence of
// WorkTiles (group, row tile, column tile, K range). The producer and the consumers of a CTA run
// the same scheduler and see the same sequence. One type per Grouping (problem.h), as DeepGEMM's
// Scheduler<kGemmType>:
//
//   Dense       units are (output tile, K tile) pairs, tile-major. The first W tiles go whole:
//               CTA c of G takes tiles c, c + G, c + 2G, ... below W (persistent, a wave's CTAs on
//               neighbouring tiles; the next tile's loads overlap the previous one's epilogue). The
//               U' units past them are split: CTA c then takes the contiguous units
//               [W K + c U' / G, W K + (c + 1) U' / G) (stream-K: no wave is left part-empty, and a
//               tile may be split between neighbouring CTAs). Then the CTA holding the tile's first K
//               tiles (its last piece of work) owns the tile: the others, for which the tile is
//               their first split piece, leave float partials and raise a flag; the owner adds them
//               in CTA order (a fixed order: results are bitwise reproducible) and runs the epilogue.
//               Owners wait only for pieces that were their contributors' first split work, so no
//               wait chains form.
//   Batched,    whole tiles, persistent: CTA c takes units c, c + G, c + 2G, ... of the groups'
//   Masked,     tiles laid end to end (group by group; inside a group row tile by row tile, the
//   Contiguous  column tiles of one row tile adjacent, so a wave shares A's row tiles and each
//               group's weight in L2). Each group's rows come from the device (grouping.cuh: the
//               masked counts, the contiguous spans: global or, for few rows, the block spans in
//               shared memory), so the tile count is known only there; a group without rows has no
//               tiles and costs one read of its span.
#pragma once

#include <cstdint>

#include "csrc/gemm/grouping.cuh"
#include "csrc/gemm/problem.h"

namespace fp4_gemm::sm90 {

// What the scheduler needs (part of the kernel's parameters; plain values, captured by CUDA graphs).
struct ScheduleParams {
  int64_t k_tiles;   // K tiles of every output tile
  int64_t n_tiles;   // column tiles of one group's output
  int64_t m_tiles;   // Dense: row tiles
  int64_t units;     // Dense: output tiles x k_tiles, the work the CTAs share
  int64_t whole_tiles;  // Dense: tiles 0 .. whole_tiles - 1 go whole; the units past them are split
  GroupRows groups;  // grouped: each group's rows
};

struct WorkTile {
  int64_t group;   // weight matrix
  int64_t m0;      // first row of A (all groups' rows) in the tile
  int64_t m_end;   // the group's rows end here: rows >= m_end of the tile are not its own
  int64_t n0;      // first column of the group's output (= row of its weight matrix)
  int64_t tile;    // Dense: the output tile (stream-K bookkeeping)
  int64_t k_begin, k_end;  // K tiles of this piece
};

template <Grouping kGrouping, int kBlockM, int kBlockN>
struct Scheduler {
  static_assert(kGrouping != Grouping::Dense, "Dense has its own specialization");
  const ScheduleParams& p;
  GroupCursor cursor;
  int64_t unit;
  const int32_t* block_spans;  // Contiguous: the block's own spans (grouping.cuh), or null

  __device__ Scheduler(const ScheduleParams& params, const int32_t* spans)
      : p(params), unit(blockIdx.x), block_spans(kGrouping == Grouping::Contiguous ? spans : nullptr) {}

  __device__ __forceinline__ bool next(WorkTile& t) {
    const int64_t n_tiles = p.n_tiles;
    const GroupRows& groups = p.groups;
    const int32_t* spans = block_spans;
    const auto span_of = [&groups, spans](int64_t g) { return groups.span<kGrouping>(g, spans); };
    const auto units = [n_tiles](const GroupSpan& span) { return (span.rows + kBlockM - 1) / kBlockM * n_tiles; };
    if (!cursor.seek(groups.groups, unit, span_of, units)) return false;
    // 32-bit division (a 64-bit one is a call the producer's 40 registers cannot hold): a group has
    // fewer than 2^31 tiles (the backend's supports()).
    const uint32_t local = uint32_t(unit - cursor.base), row_tile = local / uint32_t(n_tiles);
    t.group = cursor.group;
    t.m0 = cursor.span.first + int64_t(row_tile) * kBlockM;
    t.m_end = cursor.span.first + cursor.span.rows;
    t.n0 = int64_t(local - row_tile * uint32_t(n_tiles)) * kBlockN;
    t.tile = -1;
    t.k_begin = 0;
    t.k_end = p.k_tiles;
    unit += gridDim.x;
    return true;
  }
};

template <int kBlockM, int kBlockN>
struct Scheduler<Grouping::Dense, kBlockM, kBlockN> {
  const ScheduleParams& p;
  int64_t unit, end;  // the next unit; the end of the CTA's split units

  __device__ Scheduler(const ScheduleParams& params, const int32_t* /* block spans: grouped only */)
      : p(params),
        unit(blockIdx.x < params.whole_tiles ? blockIdx.x * params.k_tiles : first_unit(blockIdx.x)),
        end(first_unit(blockIdx.x + 1)) {}

  __device__ __forceinline__ int64_t split_base() const { return p.whole_tiles * p.k_tiles; }
  __device__ __forceinline__ int64_t first_unit(int64_t cta) const {
    return split_base() + cta * (p.units - split_base()) / int64_t(gridDim.x);
  }

  __device__ __forceinline__ bool next(WorkTile& t) {
    if (unit >= end) return false;
    t.tile = unit / p.k_tiles;
    t.k_begin = unit % p.k_tiles;
    t.group = 0;
    t.m0 = (t.tile % p.m_tiles) * kBlockM;
    t.m_end = p.groups.m;
    t.n0 = (t.tile / p.m_tiles) * kBlockN;
    if (t.tile < p.whole_tiles) {  // whole; the CTA's next whole tile, or its first split unit
      t.k_end = p.k_tiles;
      unit += int64_t(gridDim.x) * p.k_tiles;
      if (unit >= split_base()) unit = first_unit(blockIdx.x);
    } else {
      t.k_end = end - unit < p.k_tiles - t.k_begin ? t.k_begin + (end - unit) : p.k_tiles;
      unit += t.k_end - t.k_begin;
    }
    return true;
  }

  // Stream-K bookkeeping. A CTA publishes at most two partial tiles: as a contributor, its first
  // piece's (slot blockIdx.x), and, as the owner of a 64-row tile whose fix-up is spread
  // (engine.cuh, spread_fixup), its last piece's (slot gridDim.x + blockIdx.x). The CTAs sharing
  // a split tile are its owner (the tile's first K tiles) and the contributors after it, up to the
  // CTA holding its last K tiles.
  __device__ __forceinline__ int64_t slot() const { return blockIdx.x; }
  __device__ __forceinline__ int64_t owner_slot(int64_t owner) const { return gridDim.x + owner; }
  __device__ __forceinline__ int64_t cta_of(int64_t unit) const {  // first_unit's inverse over the split units
    return ((unit - split_base() + 1) * int64_t(gridDim.x) - 1) / (p.units - split_base());
  }
  __device__ __forceinline__ int64_t owner(const WorkTile& t) const { return cta_of(t.tile * p.k_tiles); }
  __device__ __forceinline__ int64_t last_contributor(const WorkTile& t) const {
    return cta_of((t.tile + 1) * p.k_tiles - 1);
  }
  // Whether the CTA's work ends inside tile t: t is then its last piece, and it is free to take a
  // share of t's fix-up (the owner always is; of the contributors, all but possibly the last).
  __device__ __forceinline__ bool ends_in(int64_t cta, const WorkTile& t) const {
    return first_unit(cta + 1) <= (t.tile + 1) * p.k_tiles;
  }
};

}  // namespace fp4_gemm::sm90
