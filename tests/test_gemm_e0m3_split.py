"""The E0M3 split backend (csrc/gemm/composed/e0m3_split.cu): E0M3 operands as one NVFP4 GEMM over
K' = S K, every E0M3 integer being the sum of two E2M1 values with its sign.

Host-side: the identity, the reference GEMM of the split operands (the layout the kernel writes:
block kb becomes blocks kb * S + s), and which backend serves E0M3 on each built arch. On the H200
the backend runs by name (ops.gemm_on) on the Hopper engine's NVFP4 GEMM: within the
docs/FORMATS.md bound over K' terms, into poisoned outputs, bitwise equal across runs."""

from __future__ import annotations

import pytest
import torch
from cases import dispatched
from checks import assert_bitwise_equal, assert_within_bound, poisoned_like
from conftest import requires_arch

pytestmark = pytest.mark.kernels_ci

E2M1_CODE = {0: 0, 1: 2, 2: 4, 4: 6, 6: 7}  # E2M1 code of each value the parts take


def split_codes(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """E0M3 codes -> the E2M1 codes of 2 floor(v / 2) and v mod 2, both with the code's sign."""
    sign, v = codes & 8, codes & 7
    even = torch.tensor([E2M1_CODE[2 * (i // 2)] for i in range(8)], dtype=codes.dtype)[v.long()]
    odd = torch.tensor([E2M1_CODE[i % 2] for i in range(8)], dtype=codes.dtype)[v.long()]
    return even | sign, odd | sign


def split_operand(ref, values, scales, fmt: str, rows: int, k: int, parts_other: int, is_a: bool):
    """The operand the kernel writes: codes and plain scales over K' = S K, block kb * S + s holding
    part (s // P_B) % P of A's block kb (is_a) or part s % P of B's, under kb's scale."""
    nkb = k // 16
    parts = 2 if fmt == "e0m3" else 1
    s_total = parts * parts_other
    codes = ref.unpack_nibbles(values).reshape(rows, nkb, 16)
    pieces = split_codes(codes) if parts == 2 else (codes,)
    plain = ref.unswizzle_scales(scales, rows, nkb)
    blocks = []
    for s in range(s_total):
        part = (s // parts_other) % parts if is_a else s % parts
        blocks.append(pieces[part])
    out_codes = torch.stack(blocks, dim=2).reshape(rows, nkb * s_total * 16)
    out_scales = plain.repeat_interleave(s_total, dim=1)
    return ref.pack_nibbles(out_codes), ref.swizzle_scales(out_scales)


def operand(ref, fmt: str, rows: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-6, 6, (rows, 1), generator=g).float())
    return ref.quantize(x, ref.FORMATS[fmt], swizzle=True)


def e0m3_call(fp4, a, b, sfa, sfb, a_format: str, out: torch.Tensor, alpha_scale=1.0, b_format="e0m3"):
    """A dense GEMM with an fp16 output and no epilogue but alpha_scale."""
    return fp4._gemm.GemmCall(
        a, b, sfa, sfb, a_format, b_format, alpha_scale=alpha_scale, out=out, out_format="fp16", pdl=False
    )


# ---- host-side --------------------------------------------------------------------------------


def test_every_e0m3_code_is_the_sum_of_two_e2m1_codes_with_its_sign(ref):
    codes = torch.arange(16, dtype=torch.uint8)
    even, odd = split_codes(codes)
    assert torch.equal(ref.decode_e2m1(even) + ref.decode_e2m1(odd), ref.decode_e0m3(codes))
    assert torch.equal(even & 8, codes & 8) and torch.equal(odd & 8, codes & 8)


@pytest.mark.parametrize("a_format", ["nvfp4", "e0m3"])
def test_reference_gemm_of_the_split_operands_is_the_e0m3_gemm(ref, a_format):
    m, n, k = 70, 48, 80  # 5 blocks: the split grid pads its last 4-block scale tile
    a, sfa = operand(ref, a_format, m, k, seed=1)
    b, sfb = operand(ref, "e0m3", n, k, seed=2)
    parts_a, parts_b = (2 if a_format == "e0m3" else 1), 2
    a2, sfa2 = split_operand(ref, a, sfa, a_format, m, k, parts_b, is_a=True)
    b2, sfb2 = split_operand(ref, b, sfb, "e0m3", n, k, parts_a, is_a=False)
    expected = ref.dequantize(a, sfa, ref.FORMATS[a_format]).double() @ ref.dequantize(b, sfb, ref.E0M3).double().T
    split = ref.dequantize(a2, sfa2, ref.NVFP4).double() @ ref.dequantize(b2, sfb2, ref.NVFP4).double().T
    torch.testing.assert_close(split, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("cc", [100, 110, 120])
@pytest.mark.parametrize("a_format", ["nvfp4", "e0m3"])
def test_blackwell_runs_e0m3_through_the_split_above_the_skinny_tiers(fp4, cc, a_format):
    for m, served in [(256, "e0m3_split"), (17, "e0m3_split"), (16, "skinny")]:
        assert dispatched(fp4, cc, a_format, "e0m3", m=m, out_format="fp16") == served, f"sm_{cc} {m=}"


@pytest.mark.parametrize("a_format", ["nvfp4", "e0m3"])
def test_hopper_keeps_e0m3_on_its_engine(fp4, a_format):
    assert dispatched(fp4, 90, a_format, "e0m3", m=256, out_format="fp16") == "sm90_engine"


# ---- results on the H200: the backend by name, on the Hopper engine's NVFP4 GEMM --------------


@requires_arch(90)
@pytest.mark.parametrize("a_format", ["nvfp4", "e0m3"])
@pytest.mark.parametrize("mnk", [(130, 256, 512), (17, 64, 48), (300, 136, 272), (40, 24, 16)], ids=str)
def test_split_backend_is_within_the_bound_over_k_prime_terms(fp4, ref, a_format, mnk):
    m, n, k = mnk
    a, sfa = operand(ref, a_format, m, k, seed=m + k)
    b, sfb = operand(ref, "e0m3", n, k, seed=n)
    a_dq = ref.dequantize(a, sfa, ref.FORMATS[a_format]).double()
    b_dq = ref.dequantize(b, sfb, ref.E0M3).double()
    operands = tuple(t.cuda() for t in (a, b, sfa, sfb))
    outs = []
    for _ in range(2):
        out = poisoned_like(torch.empty(m, n, dtype=torch.float16, device="cuda"))
        e0m3_call(fp4, *operands, a_format, out, alpha_scale=0.5).run_on("e0m3_split")
        outs.append(out.cpu())
    split = (2 if a_format == "e0m3" else 1) * 2
    assert_within_bound(outs[0], 0.5 * a_dq @ b_dq.T, 0.5 * a_dq, b_dq, f"split {a_format} {mnk}", terms=split * k)
    assert_bitwise_equal(outs[1], outs[0], "second run")


@requires_arch(90)
def test_gemm_on_refuses_a_backend_that_does_not_serve_the_problem(fp4, ref):
    a, sfa = (t.cuda() for t in operand(ref, "nvfp4", 32, 64, seed=3))
    out = torch.empty(32, 32, dtype=torch.float16, device="cuda")
    with pytest.raises(RuntimeError, match="does not serve this problem"):
        e0m3_call(fp4, a, a, sfa, sfa, "nvfp4", out, b_format="nvfp4").run_on("e0m3_split")  # no E0M3 operand
    with pytest.raises(RuntimeError, match="no backend named"):
        e0m3_call(fp4, a, a, sfa, sfa, "nvfp4", out).run_on("no_such_backend")
