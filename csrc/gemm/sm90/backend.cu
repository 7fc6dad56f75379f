// Hopper engine (sm_90a). Its kernels land here with the GEMM engine; until then GEMM ops run the reference.
#include "csrc/gemm/backends.h"
