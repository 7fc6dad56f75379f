// The epilogue of the Blackwell CUTLASS GEMMs as one visitor tree (docs/FORMATS.md, "GEMM result"):
//
//   D = act(beta * C + (alpha_scale * alpha[l] * acc + bias[l][n]))      beta = 1 with a residual C, else 0
//
// in float32, rounded once to bf16/fp16. The bias is read as float32 (float_bias.h widens a bf16 or
// fp16 one into scratch first), so every bias dtype runs on the same kernel. Every feature is a runtime argument of the same tree, so one
// kernel per (format, output type, tile) serves all epilogues: a null bias pointer reads as zeros, beta
// = 0 skips the load of C altogether (CUTLASS's beta * C + Z node), and the activation is a uniform
// switch. The nodes are the sm90 ones that the sm100 and sm120 epilogues reuse.
#pragma once

#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/functional.h"
#include "csrc/gemm/backends.h"
#include "csrc/gemm/epilogue.cuh"
#include "csrc/gemm/problem.h"

namespace fp4_gemm {

struct ActivationArguments {
  Activation activation = Activation::None;
};

// act(y) elementwise (epilogue.cuh's activate, shared with every backend), chosen at run time.
//
// `Arch` only makes the type, and so every kernel built on it, distinct per arch section: sm_100f
// and sm_110a compile the same recipe in two translation units, and identical kernel types would
// share one host stub, so one section's launches could resolve to the other section's cubin.
template <GemmArch Arch>
struct BlackwellActivation {
  // T is a cutlass::Array of float (Sm90Compute instantiates Fn<float> only for its Arguments).
  template <class T>
  struct Fn {
    using Arguments = ActivationArguments;

    CUTLASS_DEVICE T operator()(T const& y, Arguments const& args) const {
      T out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < T::kElements; ++i) out[i] = activate(args.activation, y[i]);
      return out;
    }
  };
};

namespace blackwell_evt {

using namespace cutlass::epilogue::fusion;
using cute::_0;
using cute::_1;
using cute::Stride;

constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// alpha_scale * alpha[l]: a product of two broadcast scalars, the device one optionally per batch.
using Alpha = Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>, 2>;

// bias[l][n] in float32; a null pointer reads as zeros.
template <class CtaTileShapeMNK>
using Bias = Sm90RowBroadcast<0, CtaTileShapeMNK, float, float, Stride<_0, _1, int64_t>>;

template <GemmArch Arch, class CtaTileShapeMNK, class ElementD>
using Tree =
    Sm90EVT<Sm90Compute<BlackwellActivation<Arch>::template Fn, ElementD, float, kRound>,  // act(.)
             Sm90EVT<Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,  // beta * C + z
                      Sm90ScalarBroadcast<float>,                                          // beta
                      Sm90SrcFetch<ElementD>,                                              // C: residual
                      Sm90EVT<Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,  // z
                              Alpha, Sm90AccFetch, Bias<CtaTileShapeMNK>>>>;

}  // namespace blackwell_evt

template <GemmArch Arch, class CtaTileShapeMNK, class ElementD>
using BlackwellEpilogue = blackwell_evt::Tree<Arch, CtaTileShapeMNK, ElementD>;

// The tree's arguments from the problem's epilogue; `alpha_batch` / `bias_batch` are the L strides
// (0: shared by every batch).
template <class Arguments>
Arguments blackwell_epilogue_arguments(const GemmEpilogue& e, int64_t alpha_batch, int64_t bias_batch) {
  using cute::_0;
  using cute::_1;
  Arguments args{};
  auto& z = args.op_0.op_2;  // alpha * acc + bias
  z.op_0.scalars[0] = 1.0f;  // alpha[l] when there is no device alpha
  z.op_0.scalar_ptrs[0] = e.alpha;
  z.op_0.dScalar[0] = {_0{}, _0{}, alpha_batch};
  z.op_0.scalars[1] = e.alpha_scale;
  z.op_2.ptr_row = static_cast<const float*>(e.bias);  // float32: with_float_bias
  z.op_2.dRow = {_0{}, _1{}, bias_batch};
  args.op_0.op_0.scalars[0] = e.residual != nullptr ? 1.0f : 0.0f;  // beta
  args.op_1 = ActivationArguments{e.activation};
  return args;
}

}  // namespace fp4_gemm
