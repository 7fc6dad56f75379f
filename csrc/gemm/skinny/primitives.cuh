// The warp-level instructions of the skinny kernels, one thin wrapper each: Ampere-style
// asynchronous copies (cp.async) and the fp16 tensor-core MMA (mma.sync m16n8k16). Both exist on
// every arch of the build (sm_80 and later), which is what keeps these kernels portable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fp4_gemm::skinny {

__device__ __forceinline__ uint32_t shared_address(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// 16 bytes global -> shared, bypassing L1 (the weight streams once). When !valid nothing is read
// and the 16 bytes are zero-filled.
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes global -> shared (cp.async.cg only moves 16); zero-filled when !valid.
__device__ __forceinline__ void copy_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most `pending` of this thread's committed groups are still in flight. The count
// is an immediate in PTX, hence the switch (pipelines here are at most 8 deep).
__device__ __forceinline__ void copy_async_wait(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
  }
}

// d += a * b for a 16 x 16 fp16 tile a (four pairs per lane), a 16 x 8 fp16 tile b (two pairs per
// lane) and a 16 x 8 float32 accumulator. Lane (g = lane / 4, t = lane % 4) holds
//   a: {row g, k 2t..2t+1}, {row g+8, k 2t..2t+1}, {row g, k 2t+8..2t+9}, {row g+8, k 2t+8..2t+9}
//   b: {k 2t..2t+1, column g}, {k 2t+8..2t+9, column g}
//   d: {row g, columns 2t, 2t+1}, {row g+8, columns 2t, 2t+1}
// Products of fp16 values are exact in float32.
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace fp4_gemm::skinny
