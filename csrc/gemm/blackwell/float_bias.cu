// widen_to_float (float_bias.h): one thread per element, a grid-stride loop past the grid limit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/blackwell/float_bias.h"

namespace fp4_gemm {
namespace {

constexpr int kWidenThreads = 256;
constexpr int64_t kMaxWidenBlocks = 4096;

__global__ void __launch_bounds__(kWidenThreads)
    widen_kernel(const void* bias, FloatType type, int64_t count, float* out) {
  griddep_wait();  // the bias may come from the previous kernel
  griddep_launch_dependents();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    out[i] = load_as_float(bias, type, i);
  }
}

}  // namespace

void widen_to_float(const void* bias, FloatType type, int64_t count, float* out, bool pdl, cudaStream_t stream) {
  if (count <= 0) return;
  const int64_t blocks = std::min(ceil_div(count, int64_t(kWidenThreads)), kMaxWidenBlocks);
  launch_kernel(widen_kernel, dim3(unsigned(blocks)), dim3(kWidenThreads), 0, stream, pdl, bias, type, count, out);
}

}  // namespace fp4_gemm
