"""CPU, CUDA-fallback and fake implementations of the registered ops.

The schemas, and the CUDA implementations that have native kernels, live in torch_binding.cpp.
Here every op gets its CPU implementation (the reference, `reference.*_into`), its fake
implementation (output metadata for torch.compile and FakeTensor tracing: the ops write
caller-allocated outputs, so the fakes return nothing), and, when the extension has no CUDA kernel
for it, the reference as its CUDA implementation (exact, slow; capabilities() says "reference").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import reference
from ._gemm import GemmCall
from ._ops import add_op_namespace_prefix, ops


def gemm_into(*op_arguments: object) -> None:
    """reference.gemm_into of the call a `gemm` op's packed arguments describe."""
    reference.gemm_into(*GemmCall.from_op_arguments(*op_arguments))


NATIVE_CUDA_OPS = frozenset(ops.native_cuda_ops())

# registered op -> its reference implementation
REFERENCE_IMPLS: dict[str, Callable[..., None]] = {
    "quantize": reference.quantize_into,
    "dequantize": reference.dequantize_into,
    "gemm": gemm_into,
    "swiglu_quant": reference.swiglu_quant_into,
    "permute_to_masked": reference.permute_into,
    "repack": reference.repack_into,
    "tile_group_scales": reference.tile_group_scales_into,
}
# `<op>_reference`, the same schema: what a native op runs on a GPU this build has no code for (and
# `gemm` on a problem no kernel serves).
REFERENCE_IMPLS |= {f"{op}_reference": REFERENCE_IMPLS[op] for op in NATIVE_CUDA_OPS}


def _no_outputs(*args: object) -> None:
    return None


def _register(op: str, impl: Callable[..., None]) -> None:
    """Registers the CPU and fake implementations, and the reference as the CUDA implementation when
    the extension has no CUDA kernel. Idempotent: loading the package twice in one process is harmless."""
    qualname = add_op_namespace_prefix(op)
    for key in ("CPU",) if op in NATIVE_CUDA_OPS else ("CPU", "CUDA"):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key):
            torch.library.impl(qualname, key)(impl)
    if torch._library.simple_registry.singleton.find(qualname).fake_impl.kernel is None:
        torch.library.register_fake(qualname)(_no_outputs)


for _op, _impl in REFERENCE_IMPLS.items():
    _register(_op, _impl)
