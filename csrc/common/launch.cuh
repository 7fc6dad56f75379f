// Kernel launch with optional programmatic dependent launch (PDL, sm_90+) and thread-block
// clusters, and the occupancy questions a launch plan asks.
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
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

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

// The launch attribute of one-dimensional clusters of `cluster` CTAs.
inline cudaLaunchAttribute cluster_dimension(int cluster) {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(cluster);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// A launch in clusters of `cluster` CTAs (none for 1: a plain launch), with programmatic dependent
// launch where asked.
template <class... KernelArgs, class... Args>
void launch_kernel_in_clusters(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                               cudaStream_t stream, bool pdl, int cluster, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  int count = 0;
  if (cluster > 1) attribute[count++] = cluster_dimension(cluster);
  if (pdl) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attribute;
  config.numAttrs = count;
  FP4_GEMM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

template <class... KernelArgs, class... Args>
void launch_kernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  launch_kernel_in_clusters(kernel, grid, block, smem_bytes, stream, pdl, 1, std::forward<Args>(args)...);
}

// A device attribute, asked once per (device, attribute).
inline int device_attribute(int device, cudaDeviceAttr attribute) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, int> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device, int(attribute));
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  int value = 0;
  FP4_GEMM_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  cache.emplace(key, value);
  return value;
}

// CTAs of a kernel resident at once on the whole device, in clusters of `cluster` (a cluster's CTAs
// on SMs of one GPC); asked once per (device, kernel, block, shared memory, cluster).
inline int64_t resident_ctas(int device, const void* kernel, int threads, size_t smem, int cluster) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, size_t, int>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, threads, smem, cluster);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  int64_t ctas = 0;
  if (cluster == 1) {
    int blocks = 0;
    FP4_GEMM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
    ctas = int64_t(blocks) * device_attribute(device, cudaDevAttrMultiProcessorCount);
  } else {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(cluster));
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attribute[1] = {cluster_dimension(cluster)};
    config.attrs = attribute;
    config.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // this cluster size does not fit: not a failure of the call
      clusters = 0;
    }
    ctas = int64_t(clusters) * cluster;
  }
  cache.emplace(key, ctas);
  return ctas;
}

}  // namespace fp4_gemm
