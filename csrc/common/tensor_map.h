// TMA tensor maps of byte matrices, encoded through the driver entry point the runtime exposes (the
// extension does not link libcuda itself).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "csrc/common/check.h"

namespace fp4_gemm {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    FP4_GEMM_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw std::runtime_error("fp4_gemm: the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A rows x row_bytes uint8 matrix (row pitch row_bytes, a multiple of 16) read in boxes of
// box_rows x box_bytes; reads past either edge return zeros. With swizzle_128b, boxes of 128-byte
// rows land in shared memory in the 128-byte swizzle wgmma reads (the box must start 1024-aligned).
inline CUtensorMap byte_matrix_map(const void* base, int64_t rows, int64_t row_bytes, int box_bytes, int box_rows,
                                   bool swizzle_128b = false) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(row_bytes), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_bytes)};
  const cuuint32_t box[2] = {cuuint32_t(box_bytes), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_128b ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error("fp4_gemm: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(result)));
  }
  return map;
}

}  // namespace fp4_gemm
