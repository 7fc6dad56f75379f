// Arch + problem -> the one backend that computes it.
#pragma once

#include <cuda_runtime.h>

#include "csrc/gemm/backends.h"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

// The first registered backend (by priority) that runs on compute capability `cc` and serves the
// problem; nullptr when none does (the op then runs the reference). supports() sees the problem
// with GemmProblem::cc = cc.
const GemmBackend* find_gemm_backend(const GemmProblem& problem, int cc);

// For backends that hand a rewritten problem on (staged, e0m3_split): the backend serving it on
// problem.cc, and the scratch that one asks for (0: none). Throws when no backend serves it.
const GemmBackend& delegate_backend(const GemmProblem& problem, const char* delegator);
int64_t delegate_scratch_bytes(const GemmProblem& problem, const char* delegator);

// The delegator keeps the first `own_bytes` of outer's scratch; the delegated problem gets the rest
// (none before the scratch exists).
void pass_scratch_past(const GemmProblem& outer, int64_t own_bytes, GemmProblem& inner);

// Whether a backend of `arch` has code for compute capability `cc`, as build.toml compiles them:
// sm90 and sm110 for their own capability (9.0a, 11.0a), sm100 and sm120 for their family (10.0f:
// B200 and B300; 12.0f: the RTX 50 series and DGX Spark), portable backends for all of those.
bool arch_runs_on(GemmArch arch, int cc);

}  // namespace fp4_gemm
