// Blackwell CUTLASS block-scaled kernels for this arch section land here (issue 7). Until then
// this section registers no GEMM backend, and GEMM ops on this arch run the reference.
#include "csrc/gemm/backends.h"
