// Kernel launch with optional programmatic dependent launch (PDL, sm_90+).
//
// With `pdl`, the kernel may start while the previous kernel on the stream is still running; it
// must call `griddep_wait()` before touching memory the previous kernel writes. Every kernel in
// this package calls `griddep_wait()` first and `griddep_launch_dependents()` right after, so the
// next kernel's launch overlaps this one's tail. All archs built here are sm_90+, where both are
// single instructions; without the PDL launch attribute they are no-ops.
#pragma once

#include <cuda_runtime.h>

#include "csrc/common/check.h"

namespace fp4_gemm {

__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

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
