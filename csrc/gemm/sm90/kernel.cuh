// The Hopper GEMM engine: block-scaled A [M, K] x B [N, K]^T with exact in-kernel dequantization
// to bf16 and wgmma with float32 accumulation.
//
// One CTA computes a kBlockM x kBlockN tile with three or four warpgroups:
//   warpgroup 0  producer: one thread streams packed A, packed B and both scale tiles through a
//                ring of kStages shared-memory stages with TMA (mbarrier "full"/"empty" pairs);
//   warpgroups 1, 2  consumers. A 128-row tile gives each 64 rows of A and all kBlockN columns; a
//                64-row tile (small M: no padding rows, twice the tiles) gives both the same 64 rows
//                and each half of the columns. Per 64-wide K tile they
//                - dequantize their A rows straight into wgmma register fragments,
//                - together dequantize the B tile into a bf16 tile in the 128-byte swizzle
//                  (three buffers rotate, so one barrier per K tile keeps them safe),
//                - issue four m64 x kWarpgroupN x k16 wgmmas (A from registers, B from shared
//                  memory: a 64-row tile's second warpgroup starts kBlockN / 2 rows into the bf16
//                  tile) and decode the next K tile while those run;
//   warpgroup 3  for dense 256-wide tiles (kDecodeWarps), the decoders: they dequantize each
//                stage's B tile instead of the consumers, ahead of them (the bf16 tiles handed
//                over and back by mbarriers); the consumers then decode only A, and issue their
//                wgmmas as m64 x 128 pieces (a 128-row tile's warpgroup two of them per k16 step,
//                a 64-row tile's one, on its half of the columns).
//
// K order inside a tile. Summation order is free, so wgmma's K slots need not hold the elements
// in order, only the same element for A and B. wgmma's register fragment gives thread
// q (= lane % 4) the slots 16s + 8h + 2q + b (k-step s, half h, b = 0, 1) as pair P = 2s + h of
// registers; the thread's elements of a row are the 16 consecutive ones 16q .. 16q + 15 (one 8- or
// 16-byte load, one block scale), and pair P holds the two of them a single decode produces:
//   FP4 (two codes per byte): elements i and i + 4 of the 8-element word P / 4, i = P % 4 (one
//       shift and one mask separate them);
//   FP8: elements 2P and 2P + 1.
// The bf16 B tile holds, at slot 16s + 8h + 2q + b of each row, that same element 16q + ... of the
// packed row, so a 16-byte swizzle chunk c (= P) of a row gathers one pair from each q.
//
// Exactness: every element times its block scale (NVFP4: times 2^-7 as well, which the epilogue
// multiplies back; see "operand decoding") is exact in bf16 (docs/FORMATS.md), so the result
// differs from the float64 reference only by float32 accumulation order.
#pragma once

#include <cuda.h>

#include "csrc/common/launch.cuh"
#include "csrc/common/ptx.cuh"
#include "csrc/gemm/sm90/config.cuh"
#include "csrc/gemm/sm90/decoder.cuh"
#include "csrc/gemm/sm90/mainloop.cuh"
#include "csrc/gemm/sm90/wgmma.cuh"

namespace fp4_gemm::sm90 {

template <class Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    engine_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                  const EngineParams p) {
  extern __shared__ uint8_t smem_raw[];
  const SharedStorage<Config> smem(smem_raw);

  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&map_a);
    ptx::prefetch_tensor_map(&map_b);
    for (int s = 0; s < Config::kStages; ++s) {
      ptx::mbar_init(&smem.full[s], 1);
      ptx::mbar_init(&smem.empty[s], Config::kStageReaders * kStageArrivalsPerWarp);
    }
    for (int b = 0; Config::kDecodeWarps && b < Config::kBf16Tiles; ++b) {
      ptx::mbar_init(&smem.decoded[b], Config::kDecoderThreads / 32);
      ptx::mbar_init(&smem.drained[b], Config::kConsumerThreads / 32);
    }
    ptx::mbar_init_fence();
  }
  __syncthreads();
  griddep_wait();  // the group spans (contiguous) and the operands may come from the previous kernel
  griddep_launch_dependents();
  if constexpr (Config::kGrouping == Grouping::Contiguous) {
    const GroupRows& groups = p.schedule.groups;
    if (smem.block_spans(p) != nullptr) {
      find_spans(groups.ids, int(groups.m), int(groups.groups), smem.spans(), smem.spans() + groups.groups);
    }
  }

  if (threadIdx.x < 128) {
    lower_registers<Config::kProducerRegisters>();
    if (threadIdx.x == 0) produce<Config>(smem, &map_a, &map_b, p);
  } else if (!Config::kDecodeWarps || threadIdx.x < 128 + Config::kConsumerThreads) {
    raise_registers<Config::kConsumerRegisters>();
    consume<Config>(smem, p);
  } else if constexpr (Config::kDecodeWarps) {
    lower_registers<Config::kDecoderRegisters>();
    decode<Config>(smem, p);
  }
}

}  // namespace fp4_gemm::sm90
