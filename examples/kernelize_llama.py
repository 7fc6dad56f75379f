"""A real client: a small transformers Llama with random weights, its decoder Linear layers quantized
through fp4_gemm.layers and kernelized with kernels' LocalLayerRepository, against the bf16 model.

    python examples/kernelize_llama.py                       # NVFP4, on the GPU if there is one
    python examples/kernelize_llama.py --recipe mxfp8 --layers 4 --new-tokens 64

What it does, as an inference engine would:
1. builds LlamaForCausalLM (hidden size 1024, a few layers, random weights) in bf16;
2. calibrates: runs the bf16 model once and records the amax of every decoder Linear's input;
3. replaces each decoder nn.Linear by a module of the model's own class, marked with
   `use_kernel_forward_from_hub("<Recipe>Linear")`, holding the weight quantized by
   `fp4_gemm.layers.quantize_linear` (lm_head and embeddings stay bf16; `--recipe w4a16` is
   W4A16NVFP4Linear: the NVFP4 weight, bf16 activations as they are); that class's own forward
   emulates the recipe with the package's reference (float64 math on dequantized operands), which is
   what runs where no kernel is mapped;
4. kernelizes with a mapping to `LocalLayerRepository(<this build>, layer_name="<Recipe>Linear")`;
5. prints the logits' relative error and top-1 agreement against the bf16 model, then the tokens/s of a
   greedy decode loop (KV cache, batch 1) of both models.
On the CPU the layers run the package's exact reference (slow: use few tokens).
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path
from types import ModuleType

import torch
from kernels import LocalLayerRepository, Mode, get_local_kernel, kernelize, use_kernel_forward_from_hub
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
LAYER_NAMES = {"nvfp4": "NVFP4Linear", "mxfp4": "MXFP4Linear", "mxfp8": "MXFP8Linear", "w4a16": "W4A16NVFP4Linear"}
# the block format of each recipe's weight; w4a16 alone leaves the activations unquantized
WEIGHT_FORMATS = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "mxfp8": "mxfp8", "w4a16": "nvfp4"}


def kernel_path() -> Path:
    """What get_local_kernel loads: FP4_GEMM_BUILD_DIR (a --build-dir of tools/build.py) or this checkout."""
    return Path(os.environ["FP4_GEMM_BUILD_DIR"]) if os.environ.get("FP4_GEMM_BUILD_DIR") else ROOT


def small_llama(layers: int = 2, hidden: int = 1024, vocab: int = 2048, seed: int = 0) -> nn.Module:
    """LlamaForCausalLM with random weights (transformers' default initialization), bf16, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(2.75 * hidden), num_hidden_layers=layers,
        num_attention_heads=hidden // 128, num_key_value_heads=hidden // 256, max_position_embeddings=4096,
    )  # fmt: skip
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def client_class(recipe: str, ref: ModuleType) -> type[nn.Module]:
    """The model's quantized linear, holding fp4_gemm.layers' attributes. Its own forward emulates the
    layer with the reference (`ref`: fp4_gemm.reference): quantize-dequantize the activation (w4a16:
    as it is), float64 GEMM on the dequantized weight; kernelize replaces it with the kernel layer's forward."""
    fmt, weight_only = ref.FORMATS[WEIGHT_FORMATS[recipe]], recipe == "w4a16"

    def forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float() * getattr(self, "input_global_scale", 1.0)
        a = rows.double() if weight_only else ref.dequantize(*ref.quantize(rows, fmt, swizzle=True), fmt).double()
        y = a @ ref.dequantize(self.weight, self.weight_scale, fmt).double().T
        # the one float32 multiplier: NVFP4's alpha, or W4A16's weight_global_scale
        scale = getattr(self, "alpha", None) if not weight_only else self.weight_global_scale
        y = y * (scale.double() if scale is not None else 1.0)
        y = y if self.bias is None else y + self.bias.double()
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])

    name = LAYER_NAMES[recipe]
    return use_kernel_forward_from_hub(name)(type(f"Client{name}", (nn.Module,), {"forward": forward}))


def decoder_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and ".layers." in name}


def linear_attributes(
    fp4: ModuleType, weight: torch.Tensor, recipe: str, bias: torch.Tensor | None, input_amax: float | None
) -> dict:
    """The attributes of `recipe`'s layer. W4A16NVFP4Linear takes quantize_linear's NVFP4 weight as it is:
    with no activation scale, NVFP4's alpha is the weight's global scale as a multiplier."""
    if recipe != "w4a16":
        return fp4.layers.quantize_linear(weight, recipe, bias, input_amax)
    nvfp4 = fp4.layers.quantize_linear(weight, "nvfp4", bias)
    return {
        "weight": nvfp4["weight"],
        "weight_scale": nvfp4["weight_scale"].reshape(-1),
        "weight_global_scale": nvfp4["alpha"],
        "bias": nvfp4["bias"],
    }


@torch.no_grad()
def input_amax(model: nn.Module, input_ids: torch.Tensor) -> dict[str, float]:
    """max |input| of every decoder Linear on one forward pass (static activation calibration)."""
    amax: dict[str, float] = {}
    hooks = [
        linear.register_forward_pre_hook(lambda _, args, name=name: amax.__setitem__(name, float(args[0].abs().max())))
        for name, linear in decoder_linears(model).items()
    ]
    try:
        model(input_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return amax


def quantize_model(model: nn.Module, fp4: ModuleType, recipe: str, calibration_ids: torch.Tensor) -> nn.Module:
    """A copy of `model` whose decoder Linear layers hold `recipe`-quantized weights (client_class)."""
    amax = input_amax(model, calibration_ids) if recipe == "nvfp4" else {}
    quantized = copy.deepcopy(model)
    cls = client_class(recipe, fp4.reference)
    for name, linear in decoder_linears(quantized).items():
        bias = None if linear.bias is None else linear.bias.detach()
        attributes = linear_attributes(fp4, linear.weight.detach(), recipe, bias, amax.get(name))
        module = fp4.layers.load_linear(cls(), attributes)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        parent, _, child = name.rpartition(".")
        setattr(quantized.get_submodule(parent), child, module)
    return quantized


def kernelize_model(model: nn.Module, recipe: str, repo_path: Path, device: str, compile: bool = False) -> nn.Module:
    """kernelize with the recipe's layer from the local build (no fallback: a layer that cannot be
    mapped or loaded raises)."""
    from kernels import use_kernel_mapping

    repo = LocalLayerRepository(repo_path, layer_name=LAYER_NAMES[recipe])
    mode = Mode.INFERENCE | Mode.TORCH_COMPILE if compile else Mode.INFERENCE
    with use_kernel_mapping({LAYER_NAMES[recipe]: {device: repo}}, inherit_mapping=False):
        return kernelize(model, mode=mode, device=device, use_fallback=False)


@torch.no_grad()
def logits(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids).logits.float()


def compare(got: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(relative L2 error, fraction of positions whose argmax agrees) of two logits tensors."""
    error = float((got - expected).norm() / expected.norm())
    agreement = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
    return error, agreement


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def decode_tokens_per_s(model: nn.Module, prompt: torch.Tensor, new_tokens: int, device: str) -> float:
    """Greedy decode with the KV cache, batch 1, after one warm-up run: new tokens per second."""

    def run() -> torch.Tensor:
        return model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)

    run()
    synchronize(device)
    started = time.perf_counter()
    run()
    synchronize(device)
    return new_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=LAYER_NAMES, default="nvfp4")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=None, help="default 64 on the GPU, 4 on the CPU")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    new_tokens = args.new_tokens or (64 if device == "cuda" else 4)
    fp4 = get_local_kernel(kernel_path())

    model = small_llama(args.layers).to(device)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_tokens), generator=generator).to(device)
    emulated = quantize_model(model, fp4, args.recipe, prompt)
    quantized = kernelize_model(copy.deepcopy(emulated), args.recipe, kernel_path(), device)
    error, agreement = compare(logits(quantized, prompt), logits(model, prompt))
    kernel_error, _ = compare(logits(quantized, prompt), logits(emulated, prompt))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (the package's reference)"
    print(f"{name}: Llama, {args.layers} layers, hidden 1024, random weights; decoder Linear layers {args.recipe}")
    print(f"logits vs bf16, {args.prompt_tokens} tokens: relative L2 error {error:.4f}, top-1 agrees {agreement:.3f}")
    print(f"logits vs the reference emulation of the same quantized model: relative L2 error {kernel_error:.2e}")
    for label, m in (("bf16", model), (f"{args.recipe} kernelized", quantized)):
        rate = decode_tokens_per_s(m, prompt, new_tokens, device)
        print(f"decode, batch 1, {new_tokens} new tokens after {args.prompt_tokens}: {label} {rate:.1f} tokens/s")


if __name__ == "__main__":
    main()
