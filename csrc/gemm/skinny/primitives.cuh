// The instructions of the skinny kernels beyond the shared ones (csrc/common/ptx.cuh), one thin
// wrapper each: the bf16 tensor-core MMA (mma.sync m16n8k16) and the streaming global load of the
// register-streaming kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "csrc/common/ptx.cuh"

namespace fp4_gemm::skinny {

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

}  // namespace fp4_gemm::skinny
