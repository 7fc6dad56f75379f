"""Assertions shared by the tests: bitwise equality with a first-mismatch report, poisoned outputs."""

from __future__ import annotations

import torch

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
    mismatch = (a != e).nonzero()
    if len(mismatch):
        first = tuple(mismatch[0].tolist())
        raise AssertionError(
            f"{what}: {len(mismatch)} of {a.numel()} bytes differ; first at {first}: "
            f"got 0x{int(a[first]):02x}, expected 0x{int(e[first]):02x}"
        )
