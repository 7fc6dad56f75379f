// Kernel launch with optional programmatic dependent launch (PDL, sm_90+).
//
// With `pdl`, the kernel may start while the previous kernel on the stream is still running; it
// must call `griddep_wait()` before touching memory the previous kernel writes. Every kernel in
// this package calls `griddep_wait()` first and `griddep_launch_dependents()` right after, so the
// next kernel's launch overlaps this one's tail. All archs built here are sm_90+, where both are
// single instructions; without the PDL launch attribute they are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "csrc/common/check.h"
#include "csrc/common/sf_layout.cuh"

namespace fp4_gemm {

__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// A 2-D launch over a rows x cols work matrix (blocks of kMatrixThreads threads): x walks columns,
// y walks rows with a stride loop past the 65535-block limit of gridDim.y. Blocks are only as wide
// as the row (32 threads at least), so short rows leave no threads idle, and no thread divides a
// 64-bit index to find its row and column.
constexpr int kMatrixThreads = 256;

// Whether vector accesses of `bytes` bytes may start at ptr.
inline bool is_aligned(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

struct MatrixLaunch {
  dim3 grid;
  dim3 block;
};

inline MatrixLaunch matrix_launch(int64_t rows, int64_t cols) {
  int width = 32;
  while (width < kMatrixThreads && width < cols) width *= 2;
  const int height = kMatrixThreads / width;
  const int64_t row_blocks = ceil_div(rows, height);
  return {dim3(unsigned(ceil_div(cols, width)), unsigned(row_blocks < 65535 ? row_blocks : 65535)),
          dim3(unsigned(width), unsigned(height))};
}

__device__ __forceinline__ int64_t matrix_col() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t matrix_first_row() { return int64_t(blockIdx.y) * blockDim.y + threadIdx.y; }
__device__ __forceinline__ int64_t matrix_row_stride() { return int64_t(gridDim.y) * blockDim.y; }

template <class... KernelArgs, class... Args>
void launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  FP4_GEMM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace fp4_gemm
