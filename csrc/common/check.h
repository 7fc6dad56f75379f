// Checked CUDA calls for host code in csrc/. Errors become C++ exceptions, which the torch
// dispatcher turns into Python RuntimeErrors; user-facing rules are checked earlier, in Python.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fp4_gemm {

inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw std::runtime_error(std::string("fp4_gemm: CUDA error '") + cudaGetErrorString(err) + "' from " +
                           expr + " at " + file + ":" + std::to_string(line));
}

}  // namespace fp4_gemm

#define FP4_GEMM_CUDA_CHECK(expr)                                              \
  do {                                                                         \
    const cudaError_t fp4_gemm_err_ = (expr);                                  \
    if (fp4_gemm_err_ != cudaSuccess) {                                        \
      ::fp4_gemm::throw_cuda_error(fp4_gemm_err_, #expr, __FILE__, __LINE__);  \
    }                                                                          \
  } while (0)
