// Runs one CUTLASS block-scaled GEMM (a GemmUniversalAdapter built by an arch recipe, sm100/recipe.cuh
// or sm120/recipe.cuh) on a GemmProblem: packs the problem into CUTLASS's arguments, then
// can_implement, initialize (with CUTLASS's workspace in problem.scratch, which the binding
// allocates from the stream-ordered caching allocator after asking blackwell_scratch_bytes) and run.
// Each failure is a std::runtime_error that names the kernel and the step (the op surfaces it as a
// Python RuntimeError); nothing is launched after a failed step.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "csrc/common/check.h"
#include "csrc/gemm/blackwell/args.h"
#include "csrc/gemm/blackwell/epilogue.cuh"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "cutlass/util/packed_stride.hpp"

namespace fp4_gemm {

template <OutFormat Out>
using BlackwellOutElement =
    std::conditional_t<Out == OutFormat::Fp32, float,
                       std::conditional_t<Out == OutFormat::Fp16, cutlass::half_t, cutlass::bfloat16_t>>;

// GemmUniversal's tile scheduler for a tile: CUTLASS's stream-K scheduler for the stream-K tile, else
// its persistent data-parallel default (void).
template <BlackwellTile Tile>
using BlackwellTileScheduler =
    std::conditional_t<Tile == BlackwellTile::StreamK, cutlass::gemm::StreamKScheduler, void>;

inline void check_cutlass(cutlass::Status status, const char* step, const BlackwellKernelId& kernel) {
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error("fp4_gemm: " + describe(kernel) + " GEMM: CUTLASS " + step + " failed (" +
                             cutlassGetStatusString(status) + ")");
  }
}

// SMs of `device`, asked once per device (the persistent grids cover at most that many).
inline int blackwell_sm_count(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) throw std::runtime_error("fp4_gemm: device index out of range");
  int count = counts[device].load(std::memory_order_relaxed);
  if (count == 0) {
    FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// Whether CUTLASS's scale layouts (its SfAtom tiled over rows, K and L, for A and for B) put every
// scale where sf_offset does in the flattened buffer of batches padded to whole 128-row tiles each;
// true makes the package's buffers (and those blackwell_tiled_scales re-lays, whose groups start on
// tiles of their own) CUTLASS's own, passed through unchanged. Checked on 2 batches of 200 rows
// (2 tiles each, the second part padding) x 10 blocks (a padded last K tile): every position inside
// the first 128 x 4 atom, and the atom corners of every tile and batch (the rest is the same atom
// translated, constexpr evaluation cannot afford all of it).
template <class ScaleConfig>
constexpr bool scale_layout_is_sf_offset() {
  constexpr int kRows = 200, kPaddedRows = 2 * kSfTileRows, kBlocks = 3 * kSfTileCols - 2, kBatches = 2;
  constexpr int kVec = ScaleConfig::SFVecSize;
  // Plain ints: a runtime-sized problem, padded by ceil_div as at run time.
  const auto sfa = ScaleConfig::tile_atom_to_shape_SFA(cute::make_shape(kRows, 1, kBlocks * kVec, kBatches));
  const auto sfb = ScaleConfig::tile_atom_to_shape_SFB(cute::make_shape(1, kRows, kBlocks * kVec, kBatches));
  const auto matches = [&](int m, int kb, int l) {
    const int64_t expected = sf_offset(l * kPaddedRows + m, kb, sf_k_tiles(kBlocks));
    return sfa(m, kb * kVec, l) == expected && sfb(m, kb * kVec, l) == expected;
  };
  for (int m = 0; m < kSfTileRows; ++m) {
    for (int kb = 0; kb < kSfTileCols; ++kb) {
      if (!matches(m, kb, 0)) return false;
    }
  }
  for (int l = 0; l < kBatches; ++l) {
    for (int m : {0, kSfTileRows - 1, kSfTileRows, kRows - 1}) {
      for (int kb = 0; kb < kBlocks; ++kb) {
        if (!matches(m, kb, l)) return false;
      }
    }
  }
  return true;
}

// CUTLASS's arguments for problem `p` (everything but the workspace).
template <class Gemm, class ElementD>
typename Gemm::Arguments blackwell_arguments(const GemmProblem& p) {
  using GemmKernel = typename Gemm::GemmKernel;
  using ScaleConfig = typename GemmKernel::CollectiveMainloop::Sm1xxBlkScaledConfig;
  using Arguments = typename Gemm::Arguments;
  using ElementA = std::remove_const_t<std::remove_pointer_t<decltype(Arguments{}.mainloop.ptr_A)>>;
  using ElementB = std::remove_const_t<std::remove_pointer_t<decltype(Arguments{}.mainloop.ptr_B)>>;
  using ElementSF = std::remove_const_t<std::remove_pointer_t<decltype(Arguments{}.mainloop.ptr_SFA)>>;

  const BlackwellBatch batch = blackwell_batch(p);
  const int m = static_cast<int>(batch.m), n = static_cast<int>(batch.n), k = static_cast<int>(batch.k);
  const int l = static_cast<int>(batch.l);
  const auto shape = cute::make_shape(m, n, k, l);

  Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {m, n, k, l};
  auto& mainloop = args.mainloop;
  mainloop.ptr_A = static_cast<const ElementA*>(p.a.values);
  mainloop.dA = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, cute::make_shape(m, k, l));
  mainloop.ptr_B = static_cast<const ElementB*>(p.b.values);
  mainloop.dB = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, cute::make_shape(n, k, l));
  mainloop.ptr_SFA = reinterpret_cast<const ElementSF*>(p.a.scales);
  mainloop.layout_SFA = ScaleConfig::tile_atom_to_shape_SFA(shape);
  mainloop.ptr_SFB = reinterpret_cast<const ElementSF*>(p.b.scales);
  mainloop.layout_SFB = ScaleConfig::tile_atom_to_shape_SFB(shape);

  const GemmEpilogue& e = p.epilogue;
  auto& epilogue = args.epilogue;
  epilogue.thread = blackwell_epilogue_arguments<decltype(epilogue.thread)>(e, batch.alpha_stride,
                                                                                      batch.bias_stride);
  // Without a residual beta is 0 and C is never read; D stands in so the TMA descriptor is valid.
  epilogue.ptr_C = static_cast<const ElementD*>(e.residual != nullptr ? e.residual : e.out);
  epilogue.dC = cutlass::make_cute_packed_stride(typename GemmKernel::StrideC{}, cute::make_shape(m, n, l));
  epilogue.ptr_D = static_cast<ElementD*>(e.out);
  epilogue.dD = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, cute::make_shape(m, n, l));

  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  // A caller's sm_count limits the persistent grid, down to one cluster.
  constexpr int kClusterSize = cute::size(typename GemmKernel::ClusterShape{});
  const int sm_count = blackwell_sm_count(device);
  args.hw_info.device_id = device;
  args.hw_info.sm_count = p.sm_count > 0 ? std::clamp(p.sm_count, kClusterSize, sm_count) : sm_count;
  if constexpr (std::is_same_v<typename GemmKernel::TileSchedulerTag, cutlass::gemm::StreamKScheduler>) {
    namespace detail = cutlass::gemm::kernel::detail;
    // StreamK, not CUTLASS's default Heuristic: the heuristic keeps whole tiles (data-parallel)
    // whenever the last wave is at least half full, so the streamk functions would mostly run the
    // default kernel's schedule. StreamK splits the (tile, K tile) work over the persistent CTAs
    // wherever the tile count leaves the last wave part-empty; CUTLASS still keeps whole tiles when
    // the waves are full or a tile has at most 8 K tiles (nothing worth splitting).
    args.scheduler.decomposition_mode = detail::DecompositionMode::StreamK;
    // Deterministic (CUTLASS's default, set here on purpose): the CTAs sharing a tile add their
    // float32 partials in K order (a turnstile in the workspace), so results are bitwise equal run
    // to run and under graph replay for a given SM count, as the package's tests require;
    // Nondeterministic adds them in arrival order. initialize() zeroes the turnstiles on the stream
    // (cudaMemsetAsync: no host sync, graph-safe); the partials need no zeroing (the first split stores).
    args.scheduler.reduction_mode = detail::ReductionMode::Deterministic;
  }
  return args;
}

template <class Gemm, class ElementD>
int64_t blackwell_workspace_bytes(const GemmProblem& p) {
  return static_cast<int64_t>(Gemm::get_workspace_size(blackwell_arguments<Gemm, ElementD>(p)));
}

// `pdl_ready`: whether the kernel's CUTLASS code waits on the previous grid (griddepcontrol) on this
// arch; only then may it launch early.
template <class Gemm, class ElementD>
void run_blackwell_gemm(const GemmProblem& p, cudaStream_t stream, const BlackwellKernelId& kernel, bool pdl_ready) {
  const typename Gemm::Arguments args = blackwell_arguments<Gemm, ElementD>(p);
  Gemm gemm;
  check_cutlass(gemm.can_implement(args), "can_implement", kernel);
  const int64_t workspace_bytes = static_cast<int64_t>(Gemm::get_workspace_size(args));
  if (p.scratch_bytes < workspace_bytes) {
    throw std::runtime_error("fp4_gemm: " + describe(kernel) + " GEMM needs " + std::to_string(workspace_bytes) +
                             " bytes of scratch, got " + std::to_string(p.scratch_bytes));
  }
  check_cutlass(gemm.initialize(args, workspace_bytes > 0 ? p.scratch : nullptr, stream), "initialize", kernel);
  check_cutlass(gemm.run(stream, nullptr, p.pdl && pdl_ready), "run", kernel);
  FP4_GEMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace fp4_gemm
