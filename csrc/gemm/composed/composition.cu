// The composition backend: a dense GEMM as "dequantize both operands once, then a 16-bit cuBLASLt
// matmul" (docs/FORMATS.md, "GEMM result"; reference: reference.gemm_into):
//
//   A16 = A dequantized, B16 = B dequantized    (one launch for both, dequantize_operands; a bf16
//                                               operand is read as it is)
//   out = round(alpha_scale * alpha[0] * (A16 @ B16^T) + bias[n] + residual[m, n])
//
// The copies are bf16, where every dequantized value is exact as in the Hopper engine (MX values
// outside bf16's range excepted, as there); for an fp16 output they are fp16 (cuBLASLt has no
// bf16 x bf16 -> fp16 matmul), which holds NVFP4 and E0M3 values exactly (UE4M3 scales) but not MX
// ones. Products of 16-bit values are exact in float32; cuBLASLt accumulates in float32
// (CUBLAS_COMPUTE_32F; split-K partial sums in float32 only, never in the output type) and applies
// the epilogue in float32 before the one rounding to the output:
// - alpha: alpha_scale * alpha[0] (epilogue_alpha), and beta, are device scalars a one-thread kernel
//   writes into the scratch (pointer mode device: stream-ordered, no host sync);
// - bias: cuBLASLt's bias epilogue, which reads the bias in the output's type: served only there;
// - residual: C with beta = 1; without one, beta = 0 and C is the output (not read).
// Row-major out[M, N] = A[M, K] B[N, K]^T is the column-major out^T = B A^T: cuBLASLt's A is B16 (K x N,
// transposed), its B is A16 (K x M), D is N x M with leading dimension N, and the bias is one value
// per row of D.
//
// Served: dense problems, A and B of any format, bf16 output, fp16 output of NVFP4/E0M3 operands,
// float32 output (the staged backend's stage), a bias [N] of the output's type, a residual; no
// activation (cuBLASLt's GELU is the tanh form, the contract's the erf form), no GeGLU, no NVFP4
// output, no grouping; only when the libcublasLt that torch loaded has every function used. Scratch: the device scalars, the 16-bit
// copies and cuBLASLt's workspace. Portable CUDA: built for every arch of the common section.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "csrc/common/launch.cuh"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/dequantize_operand.h"
#include "csrc/gemm/dispatch.h"
#include "csrc/gemm/epilogue.cuh"

namespace fp4_gemm {
namespace {

constexpr const char* kName = "composition";

// ---- cuBLASLt, bound at run time ---------------------------------------------------------------

// The functions used, from the libcublasLt of this CUDA major that torch has loaded (loaded here
// only if nobody has), bound once. No link-time dependency: without the library or one of these
// functions the backend serves nothing.
struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoCapGetAttribute) algo_capability = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool loaded = false;
};

template <class Function>
bool bind(void* library, const char* name, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, name));
  return function != nullptr;
}

CublasLt load_cublaslt() {
  const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  CublasLt lt;
  if (library == nullptr) return lt;
  lt.loaded = bind(library, "cublasLtCreate", lt.create) &&
              bind(library, "cublasLtMatmulDescCreate", lt.desc_create) &&
              bind(library, "cublasLtMatmulDescDestroy", lt.desc_destroy) &&
              bind(library, "cublasLtMatmulDescSetAttribute", lt.desc_set) &&
              bind(library, "cublasLtMatrixLayoutCreate", lt.layout_create) &&
              bind(library, "cublasLtMatrixLayoutDestroy", lt.layout_destroy) &&
              bind(library, "cublasLtMatmulPreferenceCreate", lt.preference_create) &&
              bind(library, "cublasLtMatmulPreferenceDestroy", lt.preference_destroy) &&
              bind(library, "cublasLtMatmulPreferenceSetAttribute", lt.preference_set) &&
              bind(library, "cublasLtMatmulAlgoGetHeuristic", lt.heuristic) &&
              bind(library, "cublasLtMatmulAlgoCapGetAttribute", lt.algo_capability) &&
              bind(library, "cublasLtMatmul", lt.matmul);
  return lt;
}

const CublasLt& cublaslt() {
  static const CublasLt lt = load_cublaslt();  // initialized once, thread-safe
  return lt;
}

void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("fp4_gemm composition: ") + call + " failed with cuBLAS status " +
                             std::to_string(static_cast<int>(status)));
  }
}

using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, decltype(CublasLt::desc_destroy)>;
using MatrixLayout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, decltype(CublasLt::layout_destroy)>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(CublasLt::preference_destroy)>;

template <class T>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value) {
  check(cublaslt().desc_set(desc, attribute, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

template <class T>
void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    const T& value) {
  check(cublaslt().preference_set(preference, attribute, &value, sizeof(value)),
        "cublasLtMatmulPreferenceSetAttribute");
}

constexpr int kMaxDevices = 64;

// One handle per device, created on its first call there.
cublasLtHandle_t device_handle(int device) {
  static std::mutex mutex;
  static cublasLtHandle_t handles[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) throw std::runtime_error("fp4_gemm composition: device index out of range");
  const std::lock_guard<std::mutex> lock(mutex);
  if (handles[device] == nullptr) check(cublaslt().create(&handles[device]), "cublasLtCreate");
  return handles[device];
}

// ---- the problem as cuBLASLt's -------------------------------------------------------------------

bool ue4m3_scaled(OperandFormat f) { return f == OperandFormat::Nvfp4 || f == OperandFormat::E0m3; }

bool output_served(const GemmProblem& p) {
  switch (p.epilogue.out_format) {
    case OutFormat::Bf16:
    case OutFormat::Fp32:
      return true;
    case OutFormat::Fp16:
      return ue4m3_scaled(p.a.format) && ue4m3_scaled(p.b.format);
    default:
      return false;
  }
}

FloatType out_type(const GemmEpilogue& e) {
  return e.out_format == OutFormat::Fp32 ? FloatType::Fp32 : e.out_format == OutFormat::Fp16 ? FloatType::Fp16
                                                                                             : FloatType::Bf16;
}

// The 16-bit type both operands reach cuBLASLt in.
FloatType operand_type(const GemmProblem& p) {
  return p.epilogue.out_format == OutFormat::Fp16 ? FloatType::Fp16 : FloatType::Bf16;
}

cudaDataType_t cuda_type(FloatType type) {
  return type == FloatType::Fp32 ? CUDA_R_32F : type == FloatType::Fp16 ? CUDA_R_16F : CUDA_R_16BF;
}

constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

// The scratch: alpha and beta, then the 16-bit copies (2 bytes an element) of the block-scaled
// operands, then the workspace; every part 256-byte aligned.
struct Scratch {
  int64_t a_copy, b_copy, workspace, bytes;
};

Scratch scratch_layout(const GemmProblem& p) {
  const auto copy_bytes = [&](OperandFormat f, int64_t rows) {
    return block_scaled(f) ? scratch_part_bytes(rows * p.k * 2) : 0;
  };
  Scratch s;
  s.a_copy = kScratchAlignment;
  s.b_copy = s.a_copy + copy_bytes(p.a.format, p.m);
  s.workspace = s.b_copy + copy_bytes(p.b.format, p.n);
  s.bytes = s.workspace + kWorkspaceBytes;
  return s;
}

int64_t scratch_bytes(const GemmProblem& p) { return scratch_layout(p).bytes; }

// The pointers cuBLASLt reads and writes, in its column-major view.
struct MatmulOperands {
  const void* b16;  // cuBLASLt's A
  const void* a16;  // cuBLASLt's B
  const void* c;
  void* d;
  const float* alpha;  // alpha, then beta
  void* workspace;
};

uint32_t alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  return address % kScratchAlignment == 0 ? uint32_t(kScratchAlignment) : uint32_t(address & (~address + 1));
}

// What the algorithm choice depends on: the device, the shapes, the types, the epilogue, the
// pointers' alignment and whether C is D.
struct PlanKey {
  int device;
  int64_t m, n, k;
  FloatType operands, out;
  bool bias, residual, in_place;
  int sm_count;
  uint32_t align_b16, align_a16, align_c, align_d, align_bias;

  auto fields() const {
    return std::tie(device, m, n, k, operands, out, bias, residual, in_place, sm_count, align_b16, align_a16, align_c,
                    align_d, align_bias);
  }
  bool operator<(const PlanKey& other) const { return fields() < other.fields(); }
};

// The operation and the layouts of one call (cheap host objects, made per call).
struct Matmul {
  MatmulDesc desc{nullptr, nullptr};
  MatrixLayout b16{nullptr, nullptr}, a16{nullptr, nullptr}, out{nullptr, nullptr};
};

MatrixLayout matrix_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  const CublasLt& lt = cublaslt();
  cublasLtMatrixLayout_t layout = nullptr;
  check(lt.layout_create(&layout, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
  return MatrixLayout(layout, lt.layout_destroy);
}

Matmul describe(const GemmProblem& p) {
  const CublasLt& lt = cublaslt();
  const GemmEpilogue& e = p.epilogue;
  Matmul call;
  cublasLtMatmulDesc_t desc = nullptr;
  check(lt.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  call.desc = MatmulDesc(desc, lt.desc_destroy);
  set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t{CUBLAS_OP_T});
  set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t{CUBLAS_OP_N});
  set_attribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t{CUBLASLT_POINTER_MODE_DEVICE});
  if (e.bias != nullptr) {
    set_attribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t{CUBLASLT_EPILOGUE_BIAS});
    set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, e.bias);
    set_attribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(out_type(e))));
  }
  if (p.sm_count > 0) set_attribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, int32_t{p.sm_count});
  const cudaDataType_t operands = cuda_type(operand_type(p));
  call.b16 = matrix_layout(operands, p.k, p.n, p.k);
  call.a16 = matrix_layout(operands, p.k, p.m, p.k);
  call.out = matrix_layout(cuda_type(out_type(e)), p.n, p.m, p.n);
  return call;
}

constexpr int kHeuristicResults = 8;

// cuBLASLt's first choice for the call that also writes D out of place when C is not D.
cublasLtMatmulAlgo_t query_algo(const Matmul& call, const PlanKey& key, cublasLtHandle_t handle) {
  const CublasLt& lt = cublaslt();
  cublasLtMatmulPreference_t raw = nullptr;
  check(lt.preference_create(&raw), "cublasLtMatmulPreferenceCreate");
  const Preference preference(raw, lt.preference_destroy);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  // Split-K partial sums in float32 only: reducing them in the output type would round more than once.
  set_preference(raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE});
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b16);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a16);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_preference(raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d);
  cublasLtMatmulHeuristicResult_t results[kHeuristicResults] = {};
  int found = 0;
  check(lt.heuristic(handle, call.desc.get(), call.b16.get(), call.a16.get(), call.out.get(), call.out.get(), raw,
                     kHeuristicResults, results, &found),
        "cublasLtMatmulAlgoGetHeuristic");
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    int32_t out_of_place = 0;
    size_t written = 0;
    check(lt.algo_capability(&results[i].algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT, &out_of_place,
                             sizeof(out_of_place), &written),
          "cublasLtMatmulAlgoCapGetAttribute");
    if (key.in_place || out_of_place != 0) return results[i].algo;
  }
  throw std::runtime_error("fp4_gemm composition: cuBLASLt offers no algorithm for a " + std::to_string(key.m) + " x " +
                           std::to_string(key.n) + " x " + std::to_string(key.k) + " GEMM of these types");
}

// The algorithm of a key: asked once, then reused (no heuristic query on later calls, and the same
// algorithm, so the same bits, on every call).
cublasLtMatmulAlgo_t cached_algo(const Matmul& call, const PlanKey& key, cublasLtHandle_t handle) {
  static std::mutex mutex;
  static std::map<PlanKey, cublasLtMatmulAlgo_t> algos;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = algos.find(key);
  if (found != algos.end()) return found->second;
  return algos.emplace(key, query_algo(call, key, handle)).first->second;
}

// alpha_scale * alpha[0] and beta (1 adds the residual, C), for cuBLASLt's device pointer mode.
__global__ void epilogue_scalars_kernel(const GemmEpilogue e, float* scalars) {
  griddep_wait();
  griddep_launch_dependents();
  scalars[0] = epilogue_alpha(e, 0);
  scalars[1] = e.residual != nullptr ? 1.0f : 0.0f;
}

// The scalars and the 16-bit copies, into the scratch, stream-ordered before the matmul.
MatmulOperands prepare(const GemmProblem& p, const Scratch& s, cudaStream_t stream) {
  uint8_t* scratch = static_cast<uint8_t*>(p.scratch);
  auto* scalars = reinterpret_cast<float*>(scratch);
  launch_kernel(epilogue_scalars_kernel, dim3(1), dim3(1), 0, stream, p.pdl, p.epilogue, scalars);
  const FloatType type = operand_type(p);
  dequantize_operands(p.a, p.m, scratch + s.a_copy, p.b, p.n, scratch + s.b_copy, p.k, type, stream);
  MatmulOperands operands;
  operands.a16 = block_scaled(p.a.format) ? scratch + s.a_copy : p.a.values;
  operands.b16 = block_scaled(p.b.format) ? scratch + s.b_copy : p.b.values;
  const GemmEpilogue& e = p.epilogue;
  operands.c = e.residual != nullptr ? e.residual : e.out;
  operands.d = e.out;
  operands.alpha = scalars;
  operands.workspace = scratch + s.workspace;
  return operands;
}

PlanKey plan_key(const GemmProblem& p, const MatmulOperands& operands, int device) {
  const GemmEpilogue& e = p.epilogue;
  return {device,
          p.m,
          p.n,
          p.k,
          operand_type(p),
          out_type(e),
          e.bias != nullptr,
          e.residual != nullptr,
          operands.c == operands.d,
          p.sm_count > 0 ? p.sm_count : 0,
          alignment(operands.b16),
          alignment(operands.a16),
          alignment(operands.c),
          alignment(operands.d),
          e.bias != nullptr ? alignment(e.bias) : uint32_t(kScratchAlignment)};
}

bool supports(const GemmProblem& p) {
  const GemmEpilogue& e = p.epilogue;
  if (p.grouping != Grouping::Dense || p.groups != 1 || p.b_interleaved) return false;
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) return false;
  if (e.activation != Activation::None || e.alpha_count > 1 || e.bias_per_group || !output_served(p)) return false;
  if (e.bias != nullptr && e.bias_type != out_type(e)) return false;
  // The dequantize kernel reads whole blocks of each row.
  for (const OperandFormat f : {p.a.format, p.b.format}) {
    if (block_scaled(f) && p.k % block_size(f) != 0) return false;
  }
  return cublaslt().loaded;
}

void run(const GemmProblem& p, cudaStream_t stream) {
  const Scratch s = scratch_layout(p);
  if (p.scratch == nullptr || p.scratch_bytes < s.bytes) {
    throw std::runtime_error("fp4_gemm composition: the GEMM needs " + std::to_string(s.bytes) + " bytes of scratch");
  }
  int device = 0;
  FP4_GEMM_CUDA_CHECK(cudaGetDevice(&device));
  const cublasLtHandle_t handle = device_handle(device);
  const MatmulOperands operands = prepare(p, s, stream);
  const Matmul call = describe(p);
  const cublasLtMatmulAlgo_t algo = cached_algo(call, plan_key(p, operands, device), handle);
  check(cublaslt().matmul(handle, call.desc.get(), operands.alpha, operands.b16, call.b16.get(), operands.a16,
                          call.a16.get(), operands.alpha + 1, operands.c, call.out.get(), operands.d, call.out.get(),
                          &algo, operands.workspace, size_t(kWorkspaceBytes), stream),
        "cublasLtMatmul");
}

const GemmBackendRegistrar kRegistrar({kName, GemmArch::Portable, &supports, &run, &scratch_bytes});

}  // namespace
}  // namespace fp4_gemm
