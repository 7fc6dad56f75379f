"""Serving speed: a Llama-3-8B-shaped model with its decoder Linear layers kernelized from this package,
decoding under CUDA graphs on a static KV cache, against the same model in bf16.

    python examples/llama_serving.py                          # NVFP4, 4 layers, on the GPU
    python examples/llama_serving.py --recipe w4a16 --json llama-serving.json
    python examples/llama_serving.py --hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --layers 1 \\
        --vocab 512 --prefill-tokens 16 --decode-steps 2 --batches 1,2     # a tiny run on the CPU

The model is LlamaForCausalLM in Llama-3-8B's shape (hidden 4096, intermediate 14336, 32 heads, 8 KV
heads, rope theta 500000) with a few layers (`--layers`, default 4) and random weights, in bf16. The
vocabulary is 32768 (`--vocab`), not Llama-3's 128256: in a few-layer model that bf16 lm_head (1 GiB)
would dominate each decode step and hide the decoder layers, which are what the recipe changes. The
embeddings and lm_head stay bf16 in both models.

The quantized model is built as examples/kernelize_llama.py builds it (its functions are used here):
calibrated on a short prompt, each decoder nn.Linear replaced by `--recipe`'s layer (nvfp4, mxfp4,
mxfp8: W4A4/W8A8; w4a16: NVFP4 weights, bf16 activations), then kernelized from the local build.

What it measures, on both models:
- decode: a prompt is prefilled into a transformers StaticCache, then one greedy decode step (input
  ids [B, 1] and positions read from static tensors, the next token and position written back into them,
  the KV cache written in place) is captured in a torch.cuda.CUDAGraph and replayed `--decode-steps`
  times; tokens/s = B * steps / time, at each batch of `--batches`. Without CUDA the same step runs
  eagerly (the output says so);
- prefill: one forward of `--prefill-tokens` tokens at batch 1 (median of `--prefill-runs`);
- the logits' relative error against bf16 on the prompt (a broken kernel gives O(1)), and a decode
  check: the last decode step's logits against one forward over the same tokens (a replay that read a
  stale token or position, or a cache slot left unwritten, shows up there).
It prints a table and, with `--json PATH`, writes the same numbers with the GPU, versions and shape.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType

import torch
from kernels import get_local_kernel
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # kernelize_llama sits beside this file
from kernelize_llama import LAYER_NAMES, compare, kernel_path, kernelize_model, logits, quantize_model  # noqa: E402

WARMUP = 3  # eager decode steps before the capture, replays before the timing, prefills before the runs
CHECK_STEPS = 4  # decode steps of the decode check


@dataclass(frozen=True)
class Shape:
    """The model's dimensions: Llama-3-8B's but for the layer count and the vocabulary (see above)."""

    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    layers: int = 4
    vocab: int = 32768
    rope_theta: float = 500000.0

    def is_llama3_8b(self) -> bool:
        """Whether the layers have Llama-3-8B's dimensions (the default), not a tiny run's."""
        return replace(self, layers=Shape.layers, vocab=Shape.vocab) == Shape()

    def describe(self) -> str:
        return (
            f"hidden {self.hidden}, intermediate {self.intermediate}, {self.heads} heads / {self.kv_heads} KV heads, "
            f"{self.layers} layers, vocab {self.vocab}, rope theta {self.rope_theta:g}"
        )


def llama(shape: Shape, device: str, seed: int = 0) -> nn.Module:
    """LlamaForCausalLM of `shape`, random weights (transformers' initialization), bf16, eval mode;
    built on `device` so the 8B-shaped layers are initialized there rather than on the host."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        rope_theta=shape.rope_theta, max_position_embeddings=8192,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def accepts(model: nn.Module, argument: str) -> bool:
    """Whether the model's forward names `argument` (transformers 4.5x takes cache_position, 5.x not)."""
    return argument in inspect.signature(model.forward).parameters


def static_cache(model: nn.Module, batch: int, max_len: int, device: str) -> object:
    """A transformers StaticCache. Keywords only: 5.x takes (config, max_cache_len) and swallows the rest
    (it sizes itself on the first update); 4.5x also needs the batch, device and dtype."""
    from transformers import StaticCache

    return StaticCache(
        config=model.config, max_cache_len=max_len, max_batch_size=batch, device=device, dtype=torch.bfloat16
    )


class Decoder:
    """Greedy decode of B sequences on a static KV cache, one token per step.

    A step reads its token and position from static tensors and writes the next token (the argmax) and
    position back into them, so a CUDA graph of one step, replayed, decodes: each replay continues where
    the last one left off. The cache is written in place at the step's position (transformers 4.5x: at
    the static cache_position; 5.x: at the cache's own length counter, a tensor the step advances in
    place). With `record`, each step also writes its token into `tokens`, for the decode check."""

    def __init__(self, model: nn.Module, batch: int, max_len: int, device: str, record: bool = False) -> None:
        self.model, self.device = model, device
        self.cache = static_cache(model, batch, max_len, device)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, max_len, dtype=torch.long, device=device) if record else None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the captured step's output, rewritten by each replay
        self.takes_cache_position = accepts(model, "cache_position")
        self.logits_kwargs = {"logits_to_keep": 1} if accepts(model, "logits_to_keep") else {}

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
        """The logits of the last position [B, vocab] (the prefill computes no others)."""
        kwargs = {"cache_position": cache_position} if self.takes_cache_position else {}
        kwargs.update(self.logits_kwargs)
        out = self.model(ids, position_ids=positions, past_key_values=self.cache, use_cache=True, **kwargs)
        return out.logits[:, -1]

    def prefill(self, prompt: torch.Tensor) -> None:
        length = prompt.shape[1]
        cache_position = torch.arange(length, device=self.device)
        last = self._forward(prompt, cache_position.expand(prompt.shape[0], -1), cache_position)
        if self.tokens is not None:
            self.tokens[:, :length] = prompt
        self.ids.copy_(last.argmax(-1, keepdim=True))
        self.position_ids.fill_(length)
        self.cache_position.fill_(length)

    def step(self) -> torch.Tensor:
        """One decode step: the logits [B, vocab] of the current token. The advance is in place, inside
        the step, so that a replay loop launches nothing but the graph."""
        if self.tokens is not None:
            self.tokens.index_copy_(1, self.cache_position, self.ids)
        last = self._forward(self.ids, self.position_ids, self.cache_position)
        self.ids.copy_(last.argmax(-1, keepdim=True))
        self.position_ids.add_(1)
        self.cache_position.add_(1)
        return last

    def capture(self) -> None:
        """Capture one step in a CUDA graph, after WARMUP eager steps on a side stream (as torch.cuda.graphs
        asks: lazy initializations and library workspaces happen outside the capture). Capturing runs
        nothing: the cache and positions are where the warm-up left them."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.step()

    def advance(self) -> torch.Tensor:
        if self.graph is None:
            return self.step()
        self.graph.replay()
        return self.logits


def random_ids(batch: int, length: int, vocab: int, device: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=generator).to(device)


def elapsed_s(run: Callable[[], object], device: str) -> float:
    """Seconds of `run`: CUDA events around it on the GPU (its kernels, not its launch), else the clock."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def started_decoder(model: nn.Module, prompt: torch.Tensor, steps: int, device: str, record: bool = False) -> Decoder:
    """A Decoder with `prompt` prefilled and, on the GPU, its step captured; room for `steps` more."""
    decoder = Decoder(model, prompt.shape[0], prompt.shape[1] + 2 * WARMUP + steps, device, record)
    decoder.prefill(prompt)
    if device == "cuda":
        decoder.capture()
    return decoder


@torch.no_grad()
def decode_tokens_per_s(model: nn.Module, batch: int, prompt_tokens: int, steps: int, device: str) -> float:
    """Decoded tokens per second at batch `batch`: B * steps over the time of `steps` replays (eager
    steps without CUDA), after WARMUP replays."""
    prompt = random_ids(batch, prompt_tokens, model.config.vocab_size, device, seed=2)
    decoder = started_decoder(model, prompt, steps, device)
    for _ in range(WARMUP):
        decoder.advance()

    def replays() -> None:
        for _ in range(steps):
            decoder.advance()

    return batch * steps / elapsed_s(replays, device)


@torch.no_grad()
def decode_check(model: nn.Module, prompt: torch.Tensor, device: str) -> float:
    """Relative L2 error of the last decode step's logits against one forward (no cache) over the same
    tokens: the prompt, then every token the steps fed, as the steps recorded them."""
    decoder = started_decoder(model, prompt, CHECK_STEPS, device, record=True)
    for _ in range(CHECK_STEPS):
        last = decoder.advance()
    length = int(decoder.cache_position)  # the tokens fed so far
    expected = model(decoder.tokens[:, :length], use_cache=False, **decoder.logits_kwargs).logits[:, -1]
    return compare(last.float(), expected.float())[0]


@torch.no_grad()
def prefill_ms(model: nn.Module, tokens: int, runs: int, device: str) -> float:
    """Median milliseconds of one forward over `tokens` tokens at batch 1, logits of the last token only
    (as generate asks); no cache, so the time is the layers' (a static cache's copy would add little)."""
    ids = random_ids(1, tokens, model.config.vocab_size, device, seed=3)
    kwargs = {"logits_to_keep": 1} if accepts(model, "logits_to_keep") else {}

    def run() -> None:
        model(ids, use_cache=False, **kwargs)

    for _ in range(WARMUP):
        run()
    return 1e3 * statistics.median(elapsed_s(run, device) for _ in range(runs))


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return "CPU (the package's reference; eager decode steps, no CUDA graph)"


def measure(args: argparse.Namespace, fp4: ModuleType, repo_path: Path) -> dict:
    """Every number the example reports, as the JSON it writes."""
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = Shape(
        hidden=args.hidden,
        intermediate=args.intermediate,
        heads=args.heads,
        kv_heads=args.kv_heads,
        layers=args.layers,
        vocab=args.vocab,
    )
    steps = args.decode_steps or (128 if device == "cuda" else 4)
    prompt_tokens = args.prompt_tokens or (128 if device == "cuda" else 8)
    bf16 = llama(shape, device)
    prompt = random_ids(1, prompt_tokens, shape.vocab, device, seed=1)
    emulated = quantize_model(bf16, fp4, args.recipe, prompt)
    # the same quantized model through the package's reference: what the kernels must reproduce
    reference = logits(emulated, prompt)
    # kernelize binds the layer's forward to the quantized modules in place: no second copy is kept
    quantized = kernelize_model(emulated, args.recipe, repo_path, device)
    kernel_logits = logits(quantized, prompt)
    error, agreement = compare(kernel_logits, logits(bf16, prompt))
    kernel_error, _ = compare(kernel_logits, reference)
    models = {"bf16": bf16, args.recipe: quantized}
    check_prompt = random_ids(max(args.batches), prompt_tokens, shape.vocab, device, seed=4)

    decode = []
    for batch in args.batches:
        rates = {name: decode_tokens_per_s(m, batch, prompt_tokens, steps, device) for name, m in models.items()}
        decode.append({"batch": batch, **{f"{name}_tokens_per_s": rate for name, rate in rates.items()}})
        decode[-1]["speedup"] = rates[args.recipe] / rates["bf16"]
    prefill = {
        f"{name}_ms": prefill_ms(m, args.prefill_tokens, args.prefill_runs, device) for name, m in models.items()
    }
    return {
        "gpu": device_name(device),
        "device": device,
        "cuda_graph": device == "cuda",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "recipe": args.recipe,
        "layer": LAYER_NAMES[args.recipe],
        "shape": asdict(shape),
        "prompt_tokens": prompt_tokens,
        "decode_steps": steps,
        "decode": decode,
        "prefill": {
            "tokens": args.prefill_tokens,
            **prefill,
            "speedup": prefill["bf16_ms"] / prefill[f"{args.recipe}_ms"],
        },
        "logits_error": error,
        "top1_agreement": agreement,
        "kernel_error": kernel_error,
        "decode_check_error": {name: decode_check(m, check_prompt, device) for name, m in models.items()},
    }


def report(results: dict) -> str:
    """The printed summary: the setup, the accuracy lines, and a Markdown table of the speeds."""
    recipe, prefill, shape = results["recipe"], results["prefill"], Shape(**results["shape"])
    model = "Llama-3-8B-shaped LlamaForCausalLM" if shape.is_llama3_8b() else "LlamaForCausalLM"
    mode = "one step in a CUDA graph, replayed" if results["cuda_graph"] else "eager steps (no CUDA here)"
    lines = [
        f"{results['gpu']}: {model}, random weights; {shape.describe()}",
        f"decoder Linear layers {recipe} ({results['layer']}, kernelized); embeddings and lm_head bf16 in both models",
        f"torch {results['torch']}, transformers {results['transformers']}",
        f"decode: static KV cache, {mode}: {results['decode_steps']} steps after a {results['prompt_tokens']}-token "
        "prompt; prefill: one forward at batch 1, median",
        f"logits vs bf16, {results['prompt_tokens']} tokens: relative L2 error {results['logits_error']:.4f}, "
        f"top-1 agrees {results['top1_agreement']:.3f} (random weights: the quantization error of a model "
        "with no structure)",
        f"logits vs the package's reference on the same quantized model: relative L2 error "
        f"{results['kernel_error']:.2e}",
        "decode check, last step vs one forward over the same tokens, relative L2 error: "
        + ", ".join(f"{name} {error:.2e}" for name, error in results["decode_check_error"].items()),
        "",
        f"| | bf16 | {recipe} | speedup |",
        "|---|---:|---:|---:|",
    ]
    for row in results["decode"]:
        bf16, ours = row["bf16_tokens_per_s"], row[f"{recipe}_tokens_per_s"]
        lines.append(f"| decode tokens/s, batch {row['batch']} | {bf16:.1f} | {ours:.1f} | {row['speedup']:.2f}x |")
    bf16, ours = prefill["bf16_ms"], prefill[f"{recipe}_ms"]
    lines.append(f"| prefill ms, {prefill['tokens']} tokens | {bf16:.2f} | {ours:.2f} | {prefill['speedup']:.2f}x |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    shape = Shape()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", choices=LAYER_NAMES, default="nvfp4")
    parser.add_argument("--layers", type=int, default=shape.layers)
    parser.add_argument("--vocab", type=int, default=shape.vocab, help="Llama-3's is 128256 (see the docstring)")
    parser.add_argument("--hidden", type=int, default=shape.hidden, help="smaller for a tiny CPU run")
    parser.add_argument("--intermediate", type=int, default=shape.intermediate)
    parser.add_argument("--heads", type=int, default=shape.heads)
    parser.add_argument("--kv-heads", type=int, default=shape.kv_heads)
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 16])
    parser.add_argument("--decode-steps", type=int, default=None, help="default 128 on the GPU, 4 on the CPU")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="default 128 on the GPU, 8 on the CPU")
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--prefill-runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results = measure(args, get_local_kernel(kernel_path()), kernel_path())
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
