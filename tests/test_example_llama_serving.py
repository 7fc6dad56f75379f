"""examples/llama_serving.py at a tiny size (hidden 256, one layer): its main, as a user runs it, writes
the JSON it promises with positive speeds, a quantized model near bf16, and a decode that matches one
forward over the same tokens; and that decode check catches a step that does not advance.

On the CPU the example runs eager decode steps on the package's reference; on a GPU the same test runs
the CUDA-graph path (the step captured and replayed) with the kernels.

Bounds:
- logits against bf16: test_transformers_client's QUANTIZATION_TOLERANCE (2 layers of hidden 1024;
  this one layer of hidden 256 measured 0.22 for NVFP4 and 0.15 for W4A16 on the CPU). W4A16 quantizes
  the weights as NVFP4 does and leaves the activations alone, so NVFP4's bound holds it too;
- the decode check (last decode step against one forward, relative L2 error of the logits):
  DECODE_TOLERANCE. On the CPU the bf16 model measured 0.0045 (bf16 GEMMs of 2 rows against 30 round
  differently) and the quantized ones 0 to 0.0045; a step that kept reading the prefill's position
  measured 0.046. On a GPU the quantized model gets QUANTIZED_DECODE_TOLERANCE_GPU: the decode GEMMs
  (M = 2) and the forward's (M = 30) may take different kernels, and the activation quantizer turns
  their last-bit differences into whole code steps (not measured yet).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from conftest import KERNEL_PATH, load_module, requires_repo_file

pytest.importorskip("transformers", reason="the serving example needs transformers (requirements.txt)")

requires_repo_file("examples/kernelize_llama.py")
serving = load_module("llama_serving", requires_repo_file("examples/llama_serving.py"))
from test_transformers_client import KERNEL_TOLERANCE, QUANTIZATION_TOLERANCE  # noqa: E402  (after the skips above)

DECODE_TOLERANCE = 0.02
QUANTIZED_DECODE_TOLERANCE_GPU = 0.1
TINY = ["--hidden", "256", "--intermediate", "512", "--heads", "4", "--kv-heads", "2", "--layers", "1"]
TINY += ["--vocab", "512", "--prefill-tokens", "16", "--decode-steps", "2", "--batches", "1,2"]
TINY_SHAPE = serving.Shape(hidden=256, intermediate=512, heads=4, kv_heads=2, layers=1, vocab=512)


@pytest.mark.parametrize("recipe", ["nvfp4", "w4a16"])
def test_tiny_run_writes_its_numbers_as_json(fp4, recipe, tmp_path, monkeypatch):
    # the example loads the build named by FP4_GEMM_BUILD_DIR (else this checkout): the one the tests load
    monkeypatch.setenv("FP4_GEMM_BUILD_DIR", str(KERNEL_PATH))
    path = tmp_path / "serving.json"
    returned = serving.main([*TINY, "--recipe", recipe, "--json", str(path)])
    results = json.loads(path.read_text())
    assert results == returned

    assert results["recipe"] == recipe and results["layer"] == serving.LAYER_NAMES[recipe]
    assert results["shape"] == asdict(TINY_SHAPE)
    assert results["cuda_graph"] == (results["device"] == "cuda")
    assert all(isinstance(results[key], str) and results[key] for key in ("gpu", "torch", "transformers"))
    assert results["decode_steps"] == 2 and results["prompt_tokens"] > 0

    assert [row["batch"] for row in results["decode"]] == [1, 2]
    for row in results["decode"]:
        bf16, ours = row["bf16_tokens_per_s"], row[f"{recipe}_tokens_per_s"]
        assert bf16 > 0 and ours > 0, row
        assert row["speedup"] == pytest.approx(ours / bf16)
    prefill = results["prefill"]
    assert prefill["tokens"] == 16 and prefill["bf16_ms"] > 0 and prefill[f"{recipe}_ms"] > 0, prefill
    assert prefill["speedup"] == pytest.approx(prefill["bf16_ms"] / prefill[f"{recipe}_ms"])

    bound = QUANTIZATION_TOLERANCE["nvfp4"]
    assert 0 < results["logits_error"] <= bound, f"{recipe}: logits {results['logits_error']:.3g} from bf16"
    assert 0 <= results["top1_agreement"] <= 1
    assert results["kernel_error"] <= KERNEL_TOLERANCE, f"{recipe}: {results['kernel_error']:.3g} from the reference"
    errors = results["decode_check_error"]
    assert set(errors) == {"bf16", recipe}
    assert errors["bf16"] <= DECODE_TOLERANCE, f"bf16 decode {errors['bf16']:.3g} from one forward"
    quantized_bound = QUANTIZED_DECODE_TOLERANCE_GPU if results["device"] == "cuda" else DECODE_TOLERANCE
    assert errors[recipe] <= quantized_bound, f"{recipe} decode {errors[recipe]:.3g} from one forward"


class StalePosition(serving.Decoder):
    """A broken decoder: every step reads the position the prefill left (the cache still advances)."""

    def step(self):
        logits = super().step()
        self.position_ids.sub_(1)
        return logits


def test_decode_check_catches_a_step_that_does_not_advance_its_position(monkeypatch):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = serving.llama(TINY_SHAPE, device)
    prompt = serving.random_ids(2, 8, TINY_SHAPE.vocab, device, seed=4)
    assert serving.decode_check(model, prompt, device) <= DECODE_TOLERANCE
    monkeypatch.setattr(serving, "Decoder", StalePosition)
    error = serving.decode_check(model, prompt, device)
    assert error > DECODE_TOLERANCE, f"a decode stuck at one position is only {error:.3g} from one forward"
