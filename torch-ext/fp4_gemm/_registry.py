"""CPU (reference) and fake implementations of the registered ops.

The schemas and the CUDA implementations live in torch_binding.cpp. Here every op gets its CPU
implementation, which is the reference, and its fake implementation, which gives torch.compile and
FakeTensor tracing the output metadata (the ops write caller-allocated outputs, so the fakes only
check and return nothing).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import reference
from ._ops import add_op_namespace_prefix

FORMATS = {fmt.name: fmt for fmt in reference.MODES.values()}


def _register_cpu(name: str, fn: Callable[..., None]) -> None:
    qualname = add_op_namespace_prefix(name)
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "CPU"):
        torch.library.impl(qualname, "CPU")(fn)


def _register_fake(name: str, fn: Callable[..., None]) -> None:
    qualname = add_op_namespace_prefix(name)
    if torch._library.simple_registry.singleton.find(qualname).fake_impl.kernel is None:
        torch.library.register_fake(qualname)(fn)


def _quantize_reference(
    input: torch.Tensor, recipe: str, swizzle: bool, pdl: bool, values: torch.Tensor, scales: torch.Tensor
) -> None:
    fmt = FORMATS[recipe]
    out_rows = values.shape[0]
    out_cols = values.shape[1] * (8 // fmt.element_bits)
    padded = F.pad(input.float(), (0, out_cols - input.shape[1], 0, out_rows - input.shape[0]))
    stored, stored_scales = reference.quantize(padded, fmt, swizzle)
    values.copy_(stored)
    scales.copy_(stored_scales.reshape(scales.shape))


def _quantize_fake(
    input: torch.Tensor, recipe: str, swizzle: bool, pdl: bool, values: torch.Tensor, scales: torch.Tensor
) -> None:
    return None


_register_cpu("quantize", _quantize_reference)
_register_fake("quantize", _quantize_fake)
