"""Inputs for the tests: `enumerate_*` yields cases, `make_*` builds the tensors of one case; which
backend dispatch picks for a kind of GEMM (`dispatched`), and the skip of a build without an arch's
code (`require_built`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
from conftest import build_config

MODES = ("w8a8-mxfp8", "w4a4-mxfp4", "w4a4-nvfp4")
HALF_DTYPES = (torch.bfloat16, torch.float16)
GROUP = {"w8a8-mxfp8": 32, "w4a4-mxfp4": 32, "w4a4-nvfp4": 16}
QMAX = {"w8a8-mxfp8": 448.0, "w4a4-mxfp4": 6.0, "w4a4-nvfp4": 6.0}


def require_built(fp4, *ccs: int) -> None:
    """Skips the test where this build has no backend code for one of the compute capabilities ccs
    (90, 100, ...: GemmCall.backends' numbers; a family member such as 103 is its base, 100)."""
    missing = sorted(set(ccs) - set(fp4.ops.gemm_backend_archs()))
    if missing:
        names = " or ".join(f"sm_{cc} ({CAPABILITIES[cc]})" if cc in CAPABILITIES else f"sm_{cc}" for cc in missing)
        pytest.skip(f"this build has no {names} code (built with --archs)")


def dispatched(fp4, cc: int, a_format: str = "nvfp4", b_format: str | None = None, *, m: int, n: int = 4096,
               k: int = 4096, unbuilt: bool = False, **kind) -> str:  # fmt: skip
    """The backend dispatch picks on compute capability cc for a GEMM of this kind ("" = the reference):
    A [m, k] in a_format, B [n, k] in b_format (default a_format); a grouped kind is 8 groups of m rows.
    `kind`: the other fields of _gemm.described_call (grouping, bias, activation, out_format, knobs).
    Skips where this build has no code for cc (require_built), unless `unbuilt`: the host-side
    predicates of the portable backends (the skinny tier) answer for every arch of build.toml."""
    if not unbuilt:
        require_built(fp4, cc)
    return fp4._gemm.described_call(a_format, b_format, m=m, n=n, k=k, **kind).backend(cc)


def build_capabilities() -> tuple[str, ...]:
    """Every CUDA capability of build.toml's kernel sections, in order ("9.0a", "10.0f", ...): the one
    list of archs; the package's SUPPORTED_CUDA_CAPABILITIES and every test's archs come from it."""
    caps = {cap for kernel in build_config()["kernel"].values() for cap in kernel["cuda-capabilities"]}
    return tuple(sorted(caps, key=compute_capability))


def compute_capability(cap: str) -> int:
    """The number GemmCall.backends and the backends' archs use: 100 for "10.0f", 90 for "9.0a"."""
    major, minor = cap.rstrip("af").split(".")
    return 10 * int(major) + int(minor)


# The GPUs a family (`f`) target runs on besides its base: B300 (10.3) and DGX Spark's GB10 (12.1).
FAMILY_MEMBERS = {100: (100, 103), 120: (120, 121)}
# "sm_90": "9.0a", "sm_100": "10.0f", "sm_103": "10.0f", ...: every GPU arch the build has code for
ARCH_CAPABILITIES = {
    f"sm_{member}": cap
    for cap in build_capabilities()
    for member in FAMILY_MEMBERS.get(compute_capability(cap), (compute_capability(cap),))
}
# cc -> capability of each cubin: 90 -> "9.0a", 100 -> "10.0f", 110 -> "11.0a", 120 -> "12.0f"
CAPABILITIES = {compute_capability(c): c for c in build_capabilities()}
BLACKWELL_CAPABILITIES = {cc: c for cc, c in CAPABILITIES.items() if cc >= 100}

# The kinds of GEMM the staged backend serves (csrc/gemm/composed/staged.cu): NVFP4 outputs with each
# finishing step, and GeGLU.
STAGED_KINDS = (
    {"out_format": "nvfp4"},
    {"out_format": "nvfp4", "activation": "relu2"},
    {"out_format": "nvfp4", "activation": "gelu"},
    {"out_format": "nvfp4_from_fp16", "activation": "gelu"},
    {"out_format": "nvfp4_from_fp16", "activation": "geglu"},
)

# Rows around the 128-row scale tile and columns around the 4-block scale tile.
QUANT_SHAPES = ((1, 32), (7, 64), (127, 96), (128, 128), (129, 160), (300, 512), (1000, 2048))
LARGE_QUANT_SHAPE = (8192, 7168)


def enumerate_quant_cases() -> Iterator[tuple[str, torch.dtype, bool]]:
    yield from itertools.product(MODES, HALF_DTYPES, (True, False))


def make_random(rows: int, cols: int, dtype: torch.dtype, device: str, seed: int, spread: int = 12) -> torch.Tensor:
    """Normal data; each row is scaled by 2^k, k uniform in [-spread, spread), so block scales cover
    many exponents (NVFP4 scales of the smallest rows reach E4M3 subnormals and zero)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    exponents = torch.randint(-spread, spread + 1, (rows, 1), generator=g).float()
    x = torch.randn(rows, cols, generator=g) * torch.exp2(exponents)
    return x.to(dtype).to(device)


def _next_up(value: float, dtype: torch.dtype) -> float:
    t = torch.tensor(value, dtype=dtype)
    return float(torch.nextafter(t, torch.tensor(float("inf"), dtype=dtype)))


def adversarial_blocks(mode: str, dtype: torch.dtype) -> list[list[float]]:
    """One block (g values) per hazard of docs/FORMATS.md: scale edges, ties, saturation, zeros,
    NaN/Inf, tiny and extreme values of the input dtype."""
    g, qmax = GROUP[mode], QMAX[mode]
    info = torch.finfo(dtype)
    e2m1_ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]

    def block(*values: float) -> list[float]:
        return (list(values) * g)[:g]

    blocks = [
        block(0.0),
        block(-0.0, 0.0),
        block(float("nan"), 1.0),
        block(float("inf"), 1.0),
        block(-float("inf"), -2.0),
        block(info.max, -info.max, 1.0),
        block(info.tiny, -info.tiny),
        block(info.tiny / 4, 0.0, -info.tiny / 8),  # subnormals of the input dtype
        block(info.eps, 1.0, -1.0),
    ]
    for k in (-8, -1, 0, 3, 9):
        edge = qmax * 2.0**k
        if edge < info.max:
            blocks.append(block(edge, -edge / 3, edge / 7))
            blocks.append(block(_next_up(edge, dtype), 0.5 * edge, -0.25 * edge))
    blocks.append([6.0] + (e2m1_ties * g)[: g - 1])  # E2M1 ties at scale 1 (amax 6)
    blocks.append([-6.0] + [-t for t in e2m1_ties * g][: g - 1])
    blocks.append([7.0] + [1.0] * (g - 1))  # NVFP4: amax/6 rounds down, 7 * (1/sf) > 6 saturates
    blocks.append([448.0, 17.0, 19.0, 21.0, -23.0] + [0.5] * (g - 5))  # E4M3 ties at scale 1
    return blocks


def make_adversarial(mode: str, dtype: torch.dtype, device: str, blocks_per_row: int = 4) -> torch.Tensor:
    """The adversarial blocks laid out `blocks_per_row` to a row (padded with zero blocks)."""
    blocks = adversarial_blocks(mode, dtype)
    g = GROUP[mode]
    while len(blocks) % blocks_per_row:
        blocks.append([0.0] * g)
    x = torch.tensor(blocks, dtype=torch.float64).reshape(-1, blocks_per_row * g)
    return x.to(dtype).to(device)
