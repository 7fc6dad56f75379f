"""kernels-hub layers: the forwards `kernels.kernelize` swaps into a model's quantized linear layers.

    y = alpha * (Q(input_global_scale * x) @ W^T) + bias     (Q: the recipe's activation quantizer)

Each layer follows kernels' layer rules: no __init__ and no members besides `forward` and the
`can_torch_compile` / `has_backward` flags, so kernelize binds `forward` to the module it replaces
(a class of the model marked with `use_kernel_forward_from_hub("NVFP4Linear")`, ...). That module
carries these attributes:

| attribute | NVFP4Linear | MXFP4Linear | MXFP8Linear |
|---|---|---|---|
| `weight` | uint8 [N, K/2], E2M1 codes, element 2i in the low nibble | the same | float8_e4m3fn [N, K] |
| `weight_scale` | uint8 SfAtom bytes of N rows x K/16 UE4M3 scales | N x K/32 UE8M0 | N x K/32 UE8M0 |
| `alpha` | float32 [1]: 1 / (input_global_scale * weight global scale) | - | - |
| `input_global_scale` | Python float, a power of two (1.0: none) | - | - |
| `bias` | bfloat16 [N] or None | the same | the same |

W4A16NVFP4Linear (bf16 activations as they are, NVFP4 weights: the W4A16 tier) reads `weight` (uint8
[N, K/2]), `weight_scale` (SfAtom bytes, flat), `weight_global_scale` (float32 [1], a multiplier:
weight = code * scale * weight_global_scale) and `bias`: forward(x) = x @ W^T * weight_global_scale +
bias, one GEMM (dense_gemm's "w4a16-nvfp4" mode: the bias in its epilogue, one rounding), every M.

forward(x): x [..., K] bfloat16 or float16 -> [..., N] in x's dtype: the rows of x are quantized with
the recipe's quantizer (group_wise_quant), multiplied by dense_gemm, bias added in its epilogue. The
activation scale is a power of two, so multiplying by it is exact and the result is the package's own
quantizer and GEMM on x * 2^k (docs/FORMATS.md). Shapes and dtypes are checked by those functions.

Converting weights into these attributes: `from_modelopt_nvfp4` and `from_compressed_tensors_nvfp4`
(and `from_modelopt_nvfp4_w4a16` for the W4A16 layer)
(NVFP4 checkpoints: row-major E4M3 scales, swizzled here), `quantize_linear` (a dense weight, with the
package's quantizers), and `load_linear` to register them as buffers of a module.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import _validate, reference
from ._halops import dense_gemm, group_wise_quant
from ._nvfp4 import adopt_nvfp4_w4a16_marlin

# largest |value| NVFP4 represents with scale 448 (E2M1 max 6 x E4M3 max 448): the global scales map
# the tensor's amax at most there, so no block scale saturates
NVFP4_RANGE = 6.0 * 448.0
NVFP4_GROUP = reference.NVFP4.group


def _quantized_linear(module: nn.Module, x: torch.Tensor, mode: str) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).contiguous()  # a no-op for the usual contiguous activations
    scale = getattr(module, "input_global_scale", 1.0)
    if scale != 1.0:
        rows = rows * scale
    values, scales = group_wise_quant(rows, mode)
    out = torch.empty(rows.shape[0], module.weight.shape[0], dtype=torch.bfloat16, device=x.device)
    bias, alpha = getattr(module, "bias", None), getattr(module, "alpha", None)
    dense_gemm(values, module.weight, scales, module.weight_scale, out, bias, alpha, mode=mode)
    return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[1])


class NVFP4Linear(nn.Module):
    """W4A4 NVFP4 linear: E2M1 weight with UE4M3 scales per 16, two-level (alpha) scaling."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _quantized_linear(self, x, "w4a4-nvfp4")


class MXFP4Linear(nn.Module):
    """W4A4 MXFP4 linear: E2M1 weight with UE8M0 scales per 32."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _quantized_linear(self, x, "w4a4-mxfp4")


class MXFP8Linear(nn.Module):
    """W8A8 MXFP8 linear: E4M3 weight with UE8M0 scales per 32."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _quantized_linear(self, x, "w8a8-mxfp8")


class W4A16NVFP4Linear(nn.Module):
    """W4A16 linear: bf16 activations as they are, NVFP4 weight (E2M1, UE4M3 per 16, global scale)."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        out = torch.empty(rows.shape[0], self.weight.shape[0], dtype=torch.bfloat16, device=x.device)
        bias = getattr(self, "bias", None)
        dense_gemm(rows, self.weight, None, self.weight_scale, out, bias, self.weight_global_scale, mode="w4a16-nvfp4")
        return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[1])


# ---- weights into layer attributes ------------------------------------------------------------

RECIPES = {fmt.name: mode for mode, fmt in reference.MODES.items()}  # "nvfp4" -> "w4a4-nvfp4", ...
Attributes = dict[str, torch.Tensor | float | None]


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        _validate.fail(f"{name} must be positive and finite, got {value}")
    return value


def _scalar(name: str, t: object) -> float:
    """A global scale given as a one-element float tensor (read on the host: a bind-time step)."""
    _validate.tensor(name, t, dtypes=(torch.float32, torch.bfloat16, torch.float16))
    if t.numel() != 1:
        _validate.fail(f"{name} must hold one value, got shape {tuple(t.shape)}")
    return _positive(name, float(t.reshape(()).item()))


def _power_of_two_at_most(value: float) -> float:
    """2^floor(log2 value), within float32's normal range: multiplies bf16/fp16 values exactly."""
    return 2.0 ** min(max(math.floor(math.log2(value)), -126), 127)


def _bias(bias: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor | None:
    if bias is None:
        return None
    _validate.tensor("bias", bias, dtypes=(torch.bfloat16, torch.float16, torch.float32), shape=(n,))
    return bias.to(device=device, dtype=torch.bfloat16)


def _nvfp4_attributes(
    weight: torch.Tensor, swizzled: torch.Tensor, gs_w: float, gs_a: float | None, bias: torch.Tensor | None
) -> Attributes:
    activation_scale = 1.0 if gs_a is None else _power_of_two_at_most(_positive("input_global_scale", gs_a))
    return {
        "weight": weight,
        "weight_scale": swizzled,
        "alpha": torch.tensor([1.0 / (activation_scale * gs_w)], dtype=torch.float32, device=weight.device),
        "input_global_scale": activation_scale,
        "bias": _bias(bias, weight.shape[0], weight.device),
    }


def nvfp4_linear(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_global_scale: float,
    input_global_scale: float | None = None,
    bias: torch.Tensor | None = None,
) -> Attributes:
    """NVFP4Linear's attributes from a checkpoint's NVFP4 weight (global scales as multipliers).

    Parameters
    ----------
    weight : uint8 [N, K/2], E2M1 codes, element 2i in the low nibble.
    weight_scale : float8_e4m3fn or uint8 [N, K/16], row-major UE4M3 block scales; swizzled here into
        SfAtom bytes (reference.swizzle_scales, with torch ops on the weight's device).
    weight_global_scale : gs_w: the weight was quantized as weight * gs_w (value = code * scale / gs_w).
    input_global_scale : gs_a of the activations (None: 1), rounded down to a power of two.
    bias : [N] or None, stored as bfloat16.
    """
    _validate.tensor("weight", weight, dtypes=(torch.uint8,), ndim=2)
    n, k = weight.shape[0], 2 * weight.shape[1]
    _validate.multiple("K", k, NVFP4_GROUP, "NVFP4 blocks are 16 elements along K")
    plain = _validate.tensor(
        "weight_scale", weight_scale, dtypes=(torch.float8_e4m3fn, torch.uint8), shape=(n, k // NVFP4_GROUP)
    ).view(torch.uint8)
    _validate.same_device(weight=weight, weight_scale=weight_scale)
    swizzled = reference.swizzle_scales(plain).reshape(reference.swizzled_scale_shape(n, k // NVFP4_GROUP))
    return _nvfp4_attributes(weight, swizzled, _positive("weight_global_scale", weight_global_scale),
                             input_global_scale, bias)  # fmt: skip


def from_modelopt_nvfp4(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    input_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> Attributes:
    """NVFP4Linear's attributes from a ModelOpt (TensorRT Model Optimizer) NVFP4 layer.

    ModelOpt stores `weight` uint8 [N, K/2], `weight_scale` float8_e4m3fn [N, K/16] (row-major), and
    the global scales as divisors: weight = code * weight_scale * weight_scale_2, and activations are
    quantized as x / input_scale. Both are one-element float32 tensors.
    """
    gs_a = None if input_scale is None else 1.0 / _scalar("input_scale", input_scale)
    return nvfp4_linear(weight, weight_scale, 1.0 / _scalar("weight_scale_2", weight_scale_2), gs_a, bias)


def from_modelopt_nvfp4_w4a16(
    weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, bias: torch.Tensor | None = None
) -> Attributes:
    """W4A16NVFP4Linear's attributes from a ModelOpt NVFP4 layer (adopt_nvfp4_w4a16_marlin: the packed
    weight as stored, its scales swizzled, weight_scale_2 as the global scale)."""
    packed, scales, global_scale, _ = adopt_nvfp4_w4a16_marlin(weight, weight_scale, weight_scale_2)
    return {
        "weight": packed,
        "weight_scale": scales,
        "weight_global_scale": global_scale,
        "bias": _bias(bias, packed.shape[0], packed.device),
    }


def from_compressed_tensors_nvfp4(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_global_scale: torch.Tensor,
    input_global_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> Attributes:
    """NVFP4Linear's attributes from a compressed-tensors (llm-compressor) NVFP4 layer.

    compressed-tensors stores `weight_packed` uint8 [N, K/2], `weight_scale` float8_e4m3fn [N, K/16]
    (row-major), and the global scales as multipliers: weight = code * weight_scale / weight_global_scale,
    activations quantized as x * input_global_scale. Both are one-element float32 tensors.
    """
    gs_a = None if input_global_scale is None else _scalar("input_global_scale", input_global_scale)
    return nvfp4_linear(weight_packed, weight_scale, _scalar("weight_global_scale", weight_global_scale), gs_a, bias)


def quantize_linear(
    weight: torch.Tensor, recipe: str, bias: torch.Tensor | None = None, input_amax: float | None = None
) -> Attributes:
    """The attributes of `recipe`'s layer ("nvfp4", "mxfp4", "mxfp8") from a dense [N, K] weight.

    The weight is quantized by group_wise_quant (on its device). For NVFP4 it is first multiplied by
    the power of two that brings its amax closest to 6 * 448 from below (exact: the block scales then use
    E4M3's normal range); `input_amax` (the calibrated activation amax, optional) sets the activation's
    global scale the same way.
    """
    if recipe not in RECIPES:
        _validate.fail(f"recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    _validate.tensor("weight", weight, dtypes=(torch.bfloat16, torch.float16, torch.float32), ndim=2)
    dense = weight.to(torch.bfloat16)
    if recipe != "nvfp4":
        values, scales = group_wise_quant(dense, RECIPES[recipe])
        return {"weight": values, "weight_scale": scales, "bias": _bias(bias, weight.shape[0], weight.device)}
    amax = float(dense.abs().amax())
    gs_w = _power_of_two_at_most(NVFP4_RANGE / amax) if math.isfinite(amax) and amax > 0 else 1.0
    gs_a = None if input_amax is None else NVFP4_RANGE / _positive("input_amax", input_amax)
    values, scales = group_wise_quant(dense * gs_w, "w4a4-nvfp4")
    return _nvfp4_attributes(values, scales, gs_w, gs_a, bias)


def load_linear(module: nn.Module, attributes: Attributes) -> nn.Module:
    """Set the attributes on `module`: tensors as buffers (replacing parameters of the same name, such
    as an nn.Linear's weight and bias), floats and None as plain attributes."""
    for name, value in attributes.items():
        if name in module._parameters:
            del module._parameters[name]
        if isinstance(value, torch.Tensor):
            module.register_buffer(name, value)
        else:
            setattr(module, name, value)
    return module
