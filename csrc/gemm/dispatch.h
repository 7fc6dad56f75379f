// Which backend runs a GEMM: the dispatch policy, one table (dispatch.cpp) of
//   arch x grouping x rows per group x operands -> backend,
// each row with the reason and the measurement behind it. A problem runs on the backend of the first
// row that matches it and whose backend is built for the device and can serve it (supports()); no
// row: the reference. Backends say only what they can serve; every threshold lives here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "csrc/gemm/backends.h"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// Whether a backend of `arch` has code for compute capability `cc`, as build.toml compiles them:
// sm90 and sm110 for their own capability (9.0a, 11.0a), sm100 and sm120 for their family (10.0f:
// B200 and B300; 12.0f: the RTX 50 series and DGX Spark), portable backends for all of those.
bool arch_runs_on(GemmArch arch, int cc);

// The rows of A each weight matrix multiplies: M (dense), group_rows (batched, masked), M over the
// groups, rounded up (contiguous).
int64_t rows_per_group(const GemmProblem& problem);

enum class ArchRule : int { Any = 0, Hopper = 1 };  // Any: every arch the backend's code runs on
enum class GroupingRule : int { Any = 0, Dense = 1, Grouped = 2 };
enum class OperandRule : int {
  Any = 0,
  SameBlockScaled = 1,     // MXFP8, MXFP4 or NVFP4 on both sides
  OtherBlockScaledB = 2,   // a block-scaled B under any other A (bf16 included)
  Bf16Activations = 3,     // a bf16 A (the W4A16 modes)
  E0m3 = 4,                // an E0M3 operand
  Nvfp4OutputOrGeglu = 5,  // an NVFP4 output (GeGLU has only those)
};

struct DispatchRow {
  const char* backend;
  ArchRule arch;
  GroupingRule grouping;
  int64_t min_rows;  // rows per group (rows_per_group)
  int64_t max_rows;
  OperandRule operands;
  // A measured condition on the shape beyond the columns above (nullptr: none), and its name.
  bool (*condition)(const GemmProblem& problem);
  const char* condition_name;
  const char* reason;
  const char* evidence;  // benchmarks/results/<file>, or "" for a row no measurement decides
};

// The policy, in the order dispatch reads it.
const std::vector<DispatchRow>& dispatch_table();

// The backend dispatch picks for `problem` on compute capability `cc` (supports() sees the problem
// with GemmProblem::cc = cc); nullptr when no row's backend serves it (the op then runs the reference).
const GemmBackend* find_gemm_backend(const GemmProblem& problem, int cc);

// For backends that hand a rewritten problem on (staged, e0m3_split): the backend serving it on
// problem.cc, and the scratch that one asks for (0: none). Throws when no backend serves it.
const GemmBackend& delegate_backend(const GemmProblem& problem, const char* delegator);
int64_t delegate_scratch_bytes(const GemmProblem& problem, const char* delegator);

// The delegator keeps the first `own_bytes` of outer's scratch; the delegated problem gets the rest
// (none before the scratch exists).
void pass_scratch_past(const GemmProblem& outer, int64_t own_bytes, GemmProblem& inner);

}  // namespace fp4_gemm
