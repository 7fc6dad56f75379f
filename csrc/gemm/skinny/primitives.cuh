// The instructions of the skinny kernel beyond those it shares with the Hopper engine (mbarriers,
// TMA and bulk copies, named barriers: sm90/ptx.cuh, which are sm_90 instructions every later arch
// has too), one thin wrapper each: the bf16 tensor-core MMA (mma.sync m16n8k16), mbarrier waits and
// arrivals across the CTAs of a cluster, cluster barriers and distributed shared memory loads, and
// the streaming global load of the register-streaming kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/gemm/sm90/ptx.cuh"

namespace fp4_gemm::skinny {

using sm90::smem_addr;

// d += a * b for a 16 x 16 bf16 tile a (four pairs per lane), a 16 x 8 bf16 tile b (two pairs per
// lane) and a 16 x 8 float32 accumulator. Lane (g = lane / 4, t = lane % 4) holds
//   a: {row g, k 2t..2t+1}, {row g+8, k 2t..2t+1}, {row g, k 2t+8..2t+9}, {row g+8, k 2t+8..2t+9}
//   b: {k 2t..2t+1, column g}, {k 2t+8..2t+9, column g}
//   d: {row g, columns 2t, 2t+1}, {row g+8, columns 2t, 2t+1}
// Products of bf16 values are exact in float32.
__device__ __forceinline__ void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// 16 bytes of data that no thread writes while the kernel runs, not kept in L1 (each byte is read
// once), with a hint that L2 fetch the 256-byte segment around it (the next step of the same row).
__device__ __forceinline__ uint4 load_streaming(const void* ptr) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(ptr));
  return v;
}

// ---- the cluster -----------------------------------------------------------------------------------

// Every thread of every CTA of the cluster: arrive, then wait for all of them (release / acquire).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The address of the same shared variable in the CTA of cluster rank `rank`.
__device__ __forceinline__ uint32_t cluster_address(const void* ptr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(ptr)), "r"(rank));
  return remote;
}

// As sm90::mbar_wait, acquiring at cluster scope what the arriving CTAs released.
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// An arrival on the mbarrier at `remote` (a cluster_address), releasing this thread's (and what it
// observed of its CTA's) earlier writes at cluster scope.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

__device__ __forceinline__ float2 load_cluster_float2(uint32_t remote) {
  float2 v;
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}

__device__ __forceinline__ void fence_cluster() { asm volatile("fence.acq_rel.cluster;" ::: "memory"); }

}  // namespace fp4_gemm::skinny
