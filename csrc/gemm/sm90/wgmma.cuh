// The sm_90a instructions of the Hopper engine, one thin wrapper each: register reallocation, the
// wgmma group protocol and shared-memory matrix descriptors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <cute/arch/mma_sm90.hpp>

#include "csrc/common/ptx.cuh"

namespace fp4_gemm::sm90 {

template <int kRegisters>
__device__ __forceinline__ void raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

template <int kRegisters>
__device__ __forceinline__ void lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving or reusing registers that an in-flight wgmma reads or writes.
template <class T, int N>
__device__ __forceinline__ void pin_registers(T (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if constexpr (sizeof(T) == 4 && std::is_floating_point_v<T>) {
      asm volatile("" : "+f"(regs[i])::"memory");
    } else {
      asm volatile("" : "+r"(regs[i])::"memory");
    }
  }
}

// Shared-memory matrix descriptor of a K-major bf16 tile in the 128-byte swizzle: rows of 128 bytes
// (64 elements), 8-row atoms of 1024 bytes stacked along N. The tile must start 1024-byte aligned.
__device__ __forceinline__ uint64_t sw128_descriptor(const void* tile) {
  const uint64_t start = (ptx::smem_addr(tile) & 0x3FFFF) >> 4;
  constexpr uint64_t kLeadingOffset = 1;          // unused by swizzled K-major layouts
  constexpr uint64_t kStrideOffset = 1024 >> 4;   // between 8-row atoms
  constexpr uint64_t kSwizzle128B = 1;
  return start | (kLeadingOffset << 16) | (kStrideOffset << 32) | (kSwizzle128B << 62);
}

// The m64 x kN x k16 bf16 wgmma with float32 accumulators and K-major operands, A from registers
// (Op) or from shared memory (OpShared), as CUTLASS's GMMA selectors name it.
template <int kN>
struct Wgmma {
  using Shape = cute::Shape<cute::_64, cute::Int<kN>, cute::_16>;
  using Op = decltype(cute::SM90::GMMA::rs_op_selector<cute::bfloat16_t, cute::bfloat16_t, float, Shape>());
  using OpShared = decltype(cute::SM90::GMMA::ss_op_selector<cute::bfloat16_t, cute::bfloat16_t, float, Shape>());
};

// An m64 x kN x k16 wgmma into accumulators kFirst .. kFirst + kN / 2 - 1 (the fragment layout of
// an n256 wgmma's columns 2 kFirst .., so two n128 halves fill the same registers as one n256).
template <int kN, int kFirst, int kAll, size_t... I>
__device__ __forceinline__ void wgmma_rs(const uint32_t (&a)[4], uint64_t desc_b, float (&acc)[kAll],
                                         std::index_sequence<I...>) {
  Wgmma<kN>::Op::fma(a[0], a[1], a[2], a[3], desc_b, acc[kFirst + I]..., cute::SM90::GMMA::ScaleOut::One);
}

template <int kN, size_t... I>
__device__ __forceinline__ void wgmma_ss(uint64_t desc_a, uint64_t desc_b, float (&acc)[kN / 2],
                                         std::index_sequence<I...>) {
  Wgmma<kN>::OpShared::fma(desc_a, desc_b, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}

}  // namespace fp4_gemm::sm90
