"""Every backend that can serve a GEMM, held to the reference: one harness over a small grid of cases,
the symmetric formats (NVFP4, MXFP4, MXFP8), NVFP4 x E0M3 and W4A16 (bf16 x NVFP4) at M = 1, 16, 64
and 300, N = 256, K = 1024, bf16 output, and one case each with a bias, GELU and an NVFP4 output.

On the GPU (sm_90): the operands are quantized by the reference on the CPU; every backend of
GemmCall.backends(90) (dispatch's choice first, then every other that can serve the call) runs the
call by name (GemmCall.run_on) into a NaN-poisoned output, also where dispatch would pick another.
Each result is within the docs/FORMATS.md bound of float64 math on the exactly dequantized operands:
K float32 additions (the E0M3 split: K' = S K), the epilogue bound of decode_cases for bias and GELU,
an NVFP4 output after dequantization plus one code step.

Host-side (no GPU): for the same grid, the backends that can serve each call on sm_90 are distinct,
start with dispatch's choice and include the Hopper engine (for the NVFP4 output, the staged backend
that encodes the engine's float32 result)."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from cases import dispatched, require_built
from checks import assert_nvfp4_output_within_bound, assert_within_bound, poisoned_like
from conftest import requires_arch
from decode_cases import Operands, assert_epilogue_within_bound, random_bf16

N, K = 256, 1024
PAIRS = [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("mxfp8", "mxfp8"), ("nvfp4", "e0m3"), ("bf16", "nvfp4")]
MS = (1, 16, 64, 300)
EPILOGUE_M = 64  # rows both the skinny tier (register-streaming kernel) and the engine serve


class Case(NamedTuple):
    a_format: str
    b_format: str
    m: int
    bias: bool = False
    activation: str = "none"
    out_format: str = "bf16"

    def __str__(self) -> str:
        name = f"{self.a_format}x{self.b_format}-m{self.m}"
        name += "-bias" if self.bias else ""
        name += f"-{self.activation}" if self.activation != "none" else ""
        return name + (f"-{self.out_format}-out" if self.out_format != "bf16" else "")

    def kind(self) -> dict:
        """The call's epilogue as _gemm.described_call's fields (a bias is bf16)."""
        bias = torch.bfloat16 if self.bias else None
        return {"bias": bias, "activation": self.activation, "out_format": self.out_format}


CASES = [Case(a, b, m) for a, b in PAIRS for m in MS] + [
    Case("nvfp4", "nvfp4", EPILOGUE_M, bias=True),
    Case("nvfp4", "nvfp4", EPILOGUE_M, activation="gelu"),
    Case("nvfp4", "nvfp4", EPILOGUE_M, out_format="nvfp4"),
]


def full_tile_backend(case: Case) -> str:
    """The sm_90 backend that serves every M of the case: the engine, or the staged backend over its
    float32 result where the output is NVFP4."""
    return "staged" if case.out_format == "nvfp4" else "sm90_engine"


def additions(backend: str, case: Case) -> int:
    """float32 additions per result: K, or S K for the E0M3 split (S = 2 parts per E0M3 operand)."""
    if backend != "e0m3_split":
        return K
    return K * (2 if case.a_format == "e0m3" else 1) * (2 if case.b_format == "e0m3" else 1)


# ---- which backends can serve each case (host-side: runs without a GPU) --------------------------


@pytest.mark.kernels_ci
@pytest.mark.parametrize("case", CASES, ids=str)
def test_capable_backends_on_sm90_include_dispatchs_choice_and_the_engine(fp4, case):
    m, n, k = case.m, N, K
    chosen = dispatched(fp4, 90, case.a_format, case.b_format, m=m, n=n, k=k, **case.kind())
    served = fp4._gemm.described_call(case.a_format, case.b_format, m=m, n=n, k=k, **case.kind()).backends(90)
    what = f"{case} {m=} {n=} {k=}"
    assert len(set(served)) == len(served), f"{what}: {served} names a backend twice"
    assert chosen and served[0] == chosen, f"{what}: dispatch picks {chosen!r}, capable backends {served}"
    assert full_tile_backend(case) in served, f"{what}: {full_tile_backend(case)} not among {served}"


# ---- every capable backend against the reference (on the H100/H200) ------------------------------


def gemm_call(fp4, case: Case, ops: Operands, bias: torch.Tensor | None):
    """The call on CUDA copies of the operands, into fresh outputs: bf16 filled with NaN (an element a
    backend leaves unwritten fails the bound's NaN check), NVFP4 codes and scales with poison bytes."""
    a, b, sfa, sfb = ops.cuda()
    out, out_scales = fp4._gemm.gemm_outputs(case.m, N, case.out_format, torch.device("cuda"))
    if out_scales is None:
        out.fill_(float("nan"))
    else:
        out, out_scales = poisoned_like(out), poisoned_like(out_scales)
    return fp4._gemm.GemmCall(
        a, b, None if case.a_format == "bf16" else sfa, sfb, case.a_format, case.b_format,
        bias=None if bias is None else bias.cuda(), activation=case.activation, out=out, out_scales=out_scales,
        out_format=case.out_format, pdl=False,
    )  # fmt: skip


@requires_arch(90)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_capable_backend_is_within_the_bound(fp4, ref, case):
    require_built(fp4, 90)
    m, n, k = case.m, N, K
    ops = Operands(ref, case.a_format, case.b_format, m, n, k, seed=m)
    bias = random_bf16(1, n, seed=m + 1).reshape(n) if case.bias else None
    served = gemm_call(fp4, case, ops, bias).backends(90)
    assert served, f"{case} {m=} {n=} {k=}: no backend of this build serves it on sm_90"
    for backend in served:
        call = gemm_call(fp4, case, ops, bias)
        call.run_on(backend)
        what = f"{backend}: {case} {m=} {n=} {k=}"
        if case.out_format == "nvfp4":
            assert_nvfp4_output_within_bound(ref, call.out, call.out_scales, ops.product(), what)
        elif case.bias or case.activation != "none":
            assert_epilogue_within_bound(call.out, ops, bias=bias, activation=case.activation, what=what)
        else:
            assert_within_bound(call.out.cpu(), ops.product(), ops.a_dq, ops.b_dq, what, additions(backend, case))
