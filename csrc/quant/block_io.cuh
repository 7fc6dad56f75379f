// Moving blocks between memory and registers, shared by the quantizing kernels: 16-bit inputs
// widened to float32 (exact), and element codes stored as E4M3 bytes or packed nibbles (element 2i
// in the low nibble).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "csrc/common/formats.cuh"

namespace fp4_gemm {

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// G values from src: 16-byte loads when `vector` (src 16-byte aligned), else one by one.
template <int G, class T>
__device__ __forceinline__ void load_halves(const T* src, bool vector, float* x) {
  if (vector) {
#pragma unroll
    for (int v = 0; v < G / 8; ++v) {
      const uint4 chunk = __ldg(reinterpret_cast<const uint4*>(src) + v);
      const T* halves = reinterpret_cast<const T*>(&chunk);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[v * 8 + i] = to_float(halves[i]);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < G; ++i) x[i] = to_float(src[i]);
}

// Bytes a block of G codes takes in memory.
template <ElementCodec kCodec, int G>
constexpr int kStoredBytes = kCodec == ElementCodec::E4M3 ? G : G / 2;

// A block's codes at dst: whole 16-byte (or, for 8-byte blocks, 8-byte) stores when `vector`.
template <ElementCodec kCodec, int G>
__device__ __forceinline__ void store_codes(uint8_t* dst, const uint8_t* codes, bool vector) {
  constexpr int kBytes = kStoredBytes<kCodec, G>;
  alignas(16) uint8_t bytes[kBytes];
#pragma unroll
  for (int i = 0; i < kBytes; ++i) {
    bytes[i] = kCodec == ElementCodec::E4M3 ? codes[i] : uint8_t(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
  if (vector) {
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int v = 0; v < kBytes / 16; ++v) reinterpret_cast<uint4*>(dst)[v] = reinterpret_cast<const uint4*>(bytes)[v];
    } else {
      static_assert(kBytes == 8, "an MX block is 16 or 32 bytes, a UE4M3-scaled block 8");
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(bytes);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kBytes; ++i) dst[i] = bytes[i];
}

}  // namespace fp4_gemm
