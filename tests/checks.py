"""Assertions shared by the tests: bitwise equality with a first-mismatch report, poisoned outputs, the
GEMM error bound of docs/FORMATS.md."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

POISON_BYTE = 0xA5


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A buffer of t's shape, dtype and device filled with a byte pattern no op writes by accident."""
    out = torch.empty_like(t)
    out.view(torch.uint8).fill_(POISON_BYTE)
    return out


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8).cpu()


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a, e = as_bytes(actual), as_bytes(expected)
    differs = a != e
    if actual.dtype.is_floating_point and actual.dtype.itemsize > 1:
        # NaN is NaN: its sign and payload bits differ between CPU and GPU arithmetic
        both_nan = (actual.detach().cpu().isnan() & expected.detach().cpu().isnan()).reshape(actual.shape)
        differs = differs.reshape(*actual.shape, actual.dtype.itemsize) & ~both_nan[..., None]
    mismatch = differs.nonzero()
    if len(mismatch):
        first = tuple(mismatch[0].tolist())
        raise AssertionError(
            f"{what}: {len(mismatch)} of {a.numel()} bytes differ; first at {first}: "
            f"got 0x{int(a.reshape(differs.shape)[first]):02x}, expected 0x{int(e.reshape(differs.shape)[first]):02x}"
        )


def assert_same_results(actual: object, expected: object, what: str) -> None:
    """Tensors bit for bit (on the CPU), tuples item by item, anything else by equality."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}, expected a tensor"
        assert_bitwise_equal(actual, expected, what)
    elif isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), f"{what}: {actual!r} vs {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same_results(a, e, f"{what}[{i}]")
    else:
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"


class OpRecorder(TorchDispatchMode):
    """Records the package's ops dispatched while active (fp4-gemm's namespace only): their names, and
    their arguments."""

    def __init__(self, namespace: str) -> None:
        super().__init__()
        self.namespace = namespace
        self.called: list[str] = []
        self.arguments: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == self.namespace:
            self.called.append(func._opname)
            self.arguments.append(tuple(args))
        return func(*args, **(kwargs or {}))


def gelu64(y: torch.Tensor) -> torch.Tensor:
    """The exact (erf) GELU in float64, the expectation of every GELU and GeGLU epilogue."""
    return torch.nn.functional.gelu(y, approximate="none")


def ulp(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at each value of ref (float64), subnormals included."""
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(ref.abs().clamp(min=info.tiny)))
    return torch.exp2(exponent - {torch.bfloat16: 7, torch.float16: 10}[dtype]).clamp(min=info.tiny * info.eps)


def assert_within_bound(
    out: torch.Tensor, ref: torch.Tensor, a: torch.Tensor, b: torch.Tensor, what: str, terms: int | None = None
) -> None:
    """|out - ref| <= ulp_out(ref) + K * 2^-24 * (|A| @ |B|^T): out (any float dtype) against the float64
    ref of A @ B^T-based math (a: [M, K], b: [N, K] dequantized). NaN must match NaN. `terms`: the
    number of float32 additions per result where a backend splits the K products (else K)."""
    if ref.numel() == 0:
        return
    nan = ref.isnan()
    assert torch.equal(out.isnan(), nan), f"{what}: NaN where the reference has none, or the reverse"
    k = a.shape[1] if terms is None else terms
    bound = ulp(ref, out.dtype) + k * 2.0**-24 * (a.abs().double() @ b.abs().double().T)
    err = torch.where(nan, 0.0, (out.double() - ref).abs())
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: error exceeds the bound by {worst:.3g} (max err {err.max().item():.3g})"


def nvfp4_block_scales(ref, scales: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """The float64 scale of every element of an [m, n] NVFP4 output (each block's, repeated 16 times)."""
    return ref.decode_ue4m3(ref.unswizzle_scales(scales.cpu(), m, n // 16)).double().repeat_interleave(16, dim=1)


def assert_nvfp4_output_within_bound(ref, packed, scales, expected: torch.Tensor, what: str) -> None:
    """A dequantized NVFP4 output against float64 expectations: one code step of slack per block
    (docs/FORMATS.md: quantized outputs are compared after dequantization, plus one code step)."""
    m, n = expected.shape
    got = ref.dequantize(packed.cpu(), scales.cpu(), ref.NVFP4).reshape(m, n).double()
    step = 2.0 * nvfp4_block_scales(ref, scales, m, n)  # the widest E2M1 step (4 -> 6) times the block scale
    err = (got - expected).abs()
    assert (err <= step + 1e-6 * expected.abs()).all(), f"{what}: max error {err.max().item():.3g}"


def assert_nvfp4_outputs_close(ref, got: tuple, expected: tuple, what: str) -> None:
    """Two NVFP4 results of one GEMM whose float32 results differ by summation order: dequantized,
    within one code step at the larger of their block scales, NaN where and only where expected."""
    (got_packed, got_scales), (packed, scales) = got, expected
    m, n = packed.shape[0], packed.shape[1] * 2
    a = ref.dequantize(got_packed.cpu(), got_scales.cpu(), ref.NVFP4).reshape(m, n).double()
    b = ref.dequantize(packed.cpu(), scales.cpu(), ref.NVFP4).reshape(m, n).double()
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN positions differ"
    step = 2.0 * torch.maximum(nvfp4_block_scales(ref, got_scales, m, n), nvfp4_block_scales(ref, scales, m, n))
    finite = ~b.isnan()
    assert bool(((a - b).abs() <= step)[finite].all()), f"{what}: more than one code step apart"
