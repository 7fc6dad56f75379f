"""A real client: a transformers Llama (2 layers, hidden size 1024, random weights) whose decoder Linear
layers are quantized through fp4_gemm.layers and kernelized with kernels' LocalLayerRepository, as
examples/kernelize_llama.py does (its functions are used here).

Two tolerances, on the relative L2 error of the logits over a 16-token prompt:
- against the reference emulation of the same quantized model (the model class's own forward:
  quantize-dequantize the activation, float64 GEMM): KERNEL_TOLERANCE. On the CPU the layers run that
  reference, so the error is 0; on a GPU it measures the kernels (float32 accumulation order, and bf16
  roundings that then move a few activation codes across a rounding boundary in later layers).
- against the bf16 model: the quantization error itself, QUANTIZATION_TOLERANCE per recipe. With
  random weights each W4A4 Linear is off by 13-17% (MXFP8: 4%), and two decoder layers compound that
  about 2.7-fold: measured 0.36 (NVFP4), 0.43 (MXFP4), 0.10 (MXFP8) on the CPU reference at seed 0.
  The bound leaves room for other seeds and summation orders; a wrong scale or layout gives O(1).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DEVICES, KERNEL_PATH, load_module, requires_arch, requires_repo_file

pytest.importorskip("transformers", reason="the client test needs transformers (requirements.txt)")

KERNEL_TOLERANCE = 0.02
QUANTIZATION_TOLERANCE = {"nvfp4": 0.45, "mxfp4": 0.55, "mxfp8": 0.15}
PROMPT_TOKENS = 16


example = load_module("kernelize_llama", requires_repo_file("examples/kernelize_llama.py"))


@pytest.fixture(scope="module")
def llama():
    """The bf16 model (CPU) and the prompt; each test moves copies where it runs."""
    model = example.small_llama(layers=2)
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1))
    return model, prompt


def quantized_pair(fp4, llama, recipe: str, device: str):
    """(bf16 model, emulated quantized model, kernelized copy, prompt) on `device`."""
    model, prompt = llama
    model, prompt = copy.deepcopy(model).to(device), prompt.to(device)
    emulated = example.quantize_model(model, fp4, recipe, prompt)
    kernelized = example.kernelize_model(copy.deepcopy(emulated), recipe, KERNEL_PATH, device)
    return model, emulated, kernelized, prompt


def test_kernelize_replaces_every_decoder_linear(fp4, llama):
    _, emulated, kernelized, _ = quantized_pair(fp4, llama, "nvfp4", "cpu")
    layer_forward = fp4.layers.NVFP4Linear.forward
    swapped = [name for name, m in kernelized.named_modules() if getattr(m.forward, "__func__", None) is layer_forward]
    assert len(swapped) == 2 * 7 and all(".layers." in name for name in swapped), swapped
    assert not any(getattr(m.forward, "__func__", None) is layer_forward for m in emulated.modules())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "mxfp8"])
def test_kernelized_llama_matches_its_reference_emulation(fp4, llama, recipe, device):
    _, emulated, kernelized, prompt = quantized_pair(fp4, llama, recipe, device)
    error, _ = example.compare(example.logits(kernelized, prompt), example.logits(emulated, prompt))
    assert error <= KERNEL_TOLERANCE, f"{recipe} on {device}: logits {error:.3g} from the reference emulation"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "mxfp8"])
def test_kernelized_llama_logits_stay_near_the_bf16_model(fp4, llama, recipe, device):
    model, _, kernelized, prompt = quantized_pair(fp4, llama, recipe, device)
    error, _ = example.compare(example.logits(kernelized, prompt), example.logits(model, prompt))
    bound = QUANTIZATION_TOLERANCE[recipe]
    assert error <= bound, f"{recipe} on {device}: logits {error:.3g} from bf16 (bound {bound})"


@requires_arch()  # torch.compile of the kernelized model runs the CUDA kernels
def test_compiled_kernelized_llama_stays_near_the_bf16_model(fp4):
    """One decoder layer (inductor's compile time grows with the graph); the kernels of every Linear.
    The compiled model is held to the bf16 model's bound, not to the eager kernelized model: inductor
    fuses the ops between the Linears (norms, rotary, softmax) in another float order, and the
    activation quantizer turns those last-bit differences into whole code steps (on the H200 the
    compiled logits were 0.13 from eager)."""
    model = example.small_llama(layers=1).to("cuda")
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(2))
    prompt = prompt.to("cuda")
    bf16 = example.logits(model, prompt)
    quantized = example.quantize_model(copy.deepcopy(model), fp4, "nvfp4", prompt)
    kernelized = example.kernelize_model(quantized, "nvfp4", KERNEL_PATH, "cuda", compile=True)
    compiled = example.logits(torch.compile(kernelized), prompt)
    assert bool(compiled.isfinite().all()), "compiled logits are not finite"
    error, _ = example.compare(compiled, bf16)
    bound = QUANTIZATION_TOLERANCE["nvfp4"]
    assert error <= bound, f"compiled logits {error:.3g} from bf16 (bound {bound})"
