"""fp4_gemm.layers: kernels-hub linear layers and the conversion of weights into their attributes.

A layer's result is the package's own quantizer and GEMM on x * input_global_scale (a power of two, so
exact), which the reference reproduces: the tests compare against float64 math on the reference's
quantized operands, within the GEMM bound of docs/FORMATS.md. Checkpoint conversions are checked by
dequantizing: the layer's operands must give back the checkpoint's values exactly.
"""

from __future__ import annotations

import pytest
import torch
from cases import make_random
from checks import assert_bitwise_equal, assert_within_bound
from conftest import DEVICES, KERNEL_PATH
from torch import nn

pytestmark = pytest.mark.kernels_ci

LAYERS = {"nvfp4": "NVFP4Linear", "mxfp4": "MXFP4Linear", "mxfp8": "MXFP8Linear"}
MODES = {"nvfp4": "w4a4-nvfp4", "mxfp4": "w4a4-mxfp4", "mxfp8": "w8a8-mxfp8"}


class QuantizedLinear(nn.Module):
    """What a model carries in place of nn.Linear: the attributes only; its forward is the kernel's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("kernelize the model: fp4_gemm.layers provides this forward")


def make_linear(
    fp4, recipe: str, n: int, k: int, device: str, input_amax: float | None = None, cls: type = QuantizedLinear
) -> nn.Module:
    """A `cls` module holding a random weight (std 0.02) and bias, quantized by quantize_linear."""
    g = torch.Generator().manual_seed(n * 7 + k)
    weight = (0.02 * torch.randn(n, k, generator=g)).to(torch.bfloat16).to(device)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).to(device)
    return fp4.layers.load_linear(cls(), fp4.layers.quantize_linear(weight, recipe, bias, input_amax))


def expected_output(ref, module: nn.Module, x: torch.Tensor, recipe: str) -> tuple[torch.Tensor, ...]:
    """(float64 result, A and B as the bound sees them) from the reference's quantized operands."""
    fmt = ref.FORMATS[recipe]
    rows = x.reshape(-1, x.shape[-1]).cpu().float() * getattr(module, "input_global_scale", 1.0)
    a = ref.dequantize(*ref.quantize(rows, fmt, swizzle=True), fmt).double()
    b = ref.dequantize(module.weight.cpu(), module.weight_scale.cpu(), fmt).double()
    alpha = float(module.alpha) if getattr(module, "alpha", None) is not None else 1.0
    y = alpha * (a @ b.T)
    if module.bias is not None:
        y = y + module.bias.cpu().double()
    return y, alpha * a, b


@pytest.mark.parametrize("name", [*LAYERS.values(), "W4A16NVFP4Linear"])
def test_kernelize_accepts_the_layer(fp4, name):
    """kernelize validates every layer it loads (stateless, forward only, the client's signature)."""
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    client = use_kernel_forward_from_hub(name)(type(f"Client{name}", (QuantizedLinear,), {}))
    model = nn.Sequential(client())
    mapping = {name: {"cpu": LocalLayerRepository(KERNEL_PATH, layer_name=name)}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cpu", use_fallback=False)
    layer = getattr(fp4.layers, name)
    assert layer.can_torch_compile and not layer.has_backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", LAYERS)
@pytest.mark.parametrize("m", [1, 5, 130])
def test_linear_layer_matches_the_reference(fp4, ref, recipe, m, device):
    n, k = 96, 256
    module = make_linear(fp4, recipe, n, k, device, input_amax=40.0)
    x = make_random(m, k, torch.bfloat16, device, seed=m, spread=3).reshape(m, 1, k)
    out = getattr(fp4.layers, LAYERS[recipe]).forward(module, x)
    assert out.shape == (m, 1, n) and out.dtype == torch.bfloat16, f"{m=} {n=} {k=}: {out.shape} {out.dtype}"
    expected, a, b = expected_output(ref, module, x, recipe)
    assert_within_bound(out.reshape(m, n).cpu(), expected, a, b, f"{LAYERS[recipe]} {m=} {n=} {k=}")


def test_linear_layer_keeps_the_input_dtype(fp4):
    module = make_linear(fp4, "mxfp8", 32, 64, "cpu")
    x = make_random(3, 64, torch.float16, "cpu", seed=0, spread=2)
    assert fp4.layers.MXFP8Linear.forward(module, x).dtype == torch.float16


def test_nvfp4_activation_scale_is_a_power_of_two_at_most_the_calibrated_one(fp4):
    module = make_linear(fp4, "nvfp4", 32, 64, "cpu", input_amax=40.0)
    scale = module.input_global_scale
    assert scale == 2.0**6 and scale <= 6 * 448 / 40.0 < 2 * scale


def test_quantize_linear_nvfp4_maps_the_weight_amax_into_the_top_octave(fp4, ref):
    weight = (0.02 * torch.randn(64, 128, generator=torch.Generator().manual_seed(3))).to(torch.bfloat16)
    attributes = fp4.layers.quantize_linear(weight, "nvfp4")
    gs_w = 1.0 / float(attributes["alpha"])
    assert 6 * 448 / 2 < float(weight.abs().max()) * gs_w <= 6 * 448
    deq = ref.dequantize(attributes["weight"], attributes["weight_scale"], ref.NVFP4) / gs_w
    assert (deq - weight.float()).abs().max() <= 0.25 * weight.float().abs().max()


def modelopt_checkpoint(ref, weight: torch.Tensor, input_amax: float) -> dict[str, torch.Tensor]:
    """An NVFP4 layer as ModelOpt exports it, made with the reference quantizer: uint8 codes, row-major
    E4M3 scales, weight_scale_2 = amax / (6 * 448) and input_scale = input amax / (6 * 448)."""
    weight_scale_2 = weight.abs().max().float() / (6 * 448)
    values, plain = ref.quantize(weight.float() / weight_scale_2, ref.NVFP4, swizzle=False)
    return {
        "weight": values,
        "weight_scale": plain.view(torch.float8_e4m3fn),
        "weight_scale_2": weight_scale_2.reshape(()),
        "input_scale": torch.tensor(input_amax / (6 * 448)),
    }


def test_from_modelopt_nvfp4_gives_back_the_checkpoint_weight(fp4, ref):
    weight = 0.05 * torch.randn(130, 96, generator=torch.Generator().manual_seed(5))
    ckpt = modelopt_checkpoint(ref, weight, input_amax=12.0)
    attributes = fp4.layers.from_modelopt_nvfp4(**ckpt)
    codes = ref.unpack_nibbles(ckpt["weight"])
    checkpoint_values = ref.dequantize_blocks(codes, ckpt["weight_scale"].view(torch.uint8), ref.NVFP4).double()
    checkpoint_values *= float(ckpt["weight_scale_2"])
    ours = ref.dequantize(attributes["weight"], attributes["weight_scale"], ref.NVFP4).double()
    ours *= float(attributes["alpha"]) * attributes["input_global_scale"]
    assert torch.equal(ours, checkpoint_values), "the swizzled scales or alpha do not reproduce the checkpoint"
    assert attributes["input_global_scale"] == 128.0  # 2^floor(log2(6 * 448 / 12))


def test_from_compressed_tensors_nvfp4_agrees_with_modelopt(fp4, ref):
    weight = 0.05 * torch.randn(64, 128, generator=torch.Generator().manual_seed(6))
    ckpt = modelopt_checkpoint(ref, weight, input_amax=3.0)
    modelopt = fp4.layers.from_modelopt_nvfp4(**ckpt)
    compressed = fp4.layers.from_compressed_tensors_nvfp4(
        weight_packed=ckpt["weight"],
        weight_scale=ckpt["weight_scale"],
        weight_global_scale=1.0 / ckpt["weight_scale_2"].reshape(1),
        input_global_scale=1.0 / ckpt["input_scale"].reshape(1),
    )
    assert_bitwise_equal(compressed["weight_scale"], modelopt["weight_scale"], "swizzled scales")
    assert compressed["input_global_scale"] == modelopt["input_global_scale"]
    assert torch.allclose(compressed["alpha"], modelopt["alpha"], rtol=1e-6, atol=0)


def test_nvfp4_checkpoint_scales_of_the_wrong_shape_raise(fp4):
    with pytest.raises(ValueError, match=r"weight_scale must have shape \(64, 8\)"):
        fp4.layers.nvfp4_linear(torch.zeros(64, 64, dtype=torch.uint8), torch.zeros(64, 4, dtype=torch.uint8), 1.0)


def test_nvfp4_checkpoint_global_scale_must_be_positive(fp4):
    weight, scales = torch.zeros(16, 8, dtype=torch.uint8), torch.zeros(16, 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="weight_scale_2 must be positive and finite"):
        fp4.layers.from_modelopt_nvfp4(weight, scales, torch.tensor(0.0))


def test_quantize_linear_rejects_an_unknown_recipe(fp4):
    with pytest.raises(ValueError, match="recipe must be one of mxfp8, mxfp4, nvfp4, got .int4."):
        fp4.layers.quantize_linear(torch.zeros(16, 32), "int4")


def test_load_linear_replaces_the_linear_parameters_with_buffers(fp4):
    linear = nn.Linear(64, 32, dtype=torch.bfloat16)
    fp4.layers.load_linear(linear, fp4.layers.quantize_linear(linear.weight.detach(), "mxfp4", linear.bias.detach()))
    assert dict(linear.named_parameters()) == {}
    assert linear.weight.dtype == torch.uint8 and linear.weight.shape == (32, 32)
    assert {name for name, _ in linear.named_buffers()} == {"weight", "weight_scale", "bias"}


def test_kernelize_swaps_the_layer_into_a_model(fp4, ref):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    client = use_kernel_forward_from_hub("NVFP4Linear")(type("ClientNVFP4Linear", (QuantizedLinear,), {}))
    model = nn.Sequential(make_linear(fp4, "nvfp4", 48, 64, "cpu", input_amax=5.0, cls=client))
    mapping = {"NVFP4Linear": {"cpu": LocalLayerRepository(KERNEL_PATH, layer_name="NVFP4Linear")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE, device="cpu", use_fallback=False)
    x = make_random(4, 64, torch.bfloat16, "cpu", seed=9, spread=2)
    expected, a, b = expected_output(ref, model[0], x, "nvfp4")
    assert_within_bound(model(x), expected, a, b, "kernelized NVFP4Linear m=4 n=48 k=64")


def test_linear_layer_compiles_fullgraph(fp4):
    module = make_linear(fp4, "nvfp4", 32, 64, "cpu", input_amax=8.0)
    x = make_random(6, 64, torch.bfloat16, "cpu", seed=2, spread=2)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return fp4.layers.NVFP4Linear.forward(module, x)

    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")
    assert_bitwise_equal(compiled(x), forward(x), "compiled NVFP4Linear")


# ---- the W4A16 layer ----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", [1, 5, 130])
def test_w4a16_layer_is_x_times_the_checkpoint_weight_plus_bias(fp4, ref, m, device):
    weight = 0.05 * torch.randn(96, 256, generator=torch.Generator().manual_seed(7))
    ckpt = modelopt_checkpoint(ref, weight, input_amax=12.0)
    bias = torch.randn(96, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    tensors = (ckpt["weight"], ckpt["weight_scale"], ckpt["weight_scale_2"].reshape(1))
    attributes = fp4.layers.from_modelopt_nvfp4_w4a16(*(t.to(device) for t in tensors), bias)
    module = fp4.layers.load_linear(torch.nn.Module(), attributes)
    x = make_random(m, 256, torch.bfloat16, device, seed=m, spread=3)
    out = fp4.layers.W4A16NVFP4Linear.forward(module, x)
    assert out.shape == (m, 96) and out.dtype == torch.bfloat16
    codes = ref.unpack_nibbles(ckpt["weight"])
    w = ref.dequantize_blocks(codes, ckpt["weight_scale"].view(torch.uint8), ref.NVFP4).double()
    w = w * float(ckpt["weight_scale_2"])
    a = x.cpu().double()
    assert_within_bound(out.cpu(), a @ w.T + bias.double(), a, w, f"W4A16NVFP4Linear {m=}")
