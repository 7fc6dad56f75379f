"""Every rule of the public API, checked before any launch.

A broken rule raises ValueError whose message states the rule, so a caller can fix the call
without reading the source. The kernels' own TORCH_CHECKs are only a last guard behind this module.
"""

from __future__ import annotations

from typing import NoReturn

import torch

from . import reference
from .reference import BlockFormat

HALF_DTYPES = (torch.bfloat16, torch.float16)


def fail(rule: str) -> NoReturn:
    raise ValueError(rule)


def mode_format(mode: str) -> BlockFormat:
    if mode not in reference.MODES:
        fail(f"mode must be one of {sorted(reference.MODES)}, got {mode!r}")
    return reference.MODES[mode]


def tensor(name: str, t: object, *, dtypes: tuple[torch.dtype, ...], ndim: int) -> torch.Tensor:
    """A tensor argument: type, dtype, rank, device kind and contiguity."""
    if not isinstance(t, torch.Tensor):
        fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        fail(f"{name} must have dtype {' or '.join(str(d) for d in dtypes)}, got {t.dtype}")
    if t.dim() != ndim:
        fail(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if t.device.type not in ("cpu", "cuda"):
        fail(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
    if not t.is_contiguous():
        fail(f"{name} must be contiguous")
    return t


def group_wise_quant(input: torch.Tensor, mode: str) -> BlockFormat:
    fmt = mode_format(mode)
    tensor("input", input, dtypes=HALF_DTYPES, ndim=2)
    if input.shape[1] % fmt.group != 0:
        fail(f"input.shape[1] (K = {input.shape[1]}) must be a multiple of {fmt.group} in mode {mode!r}")
    return fmt
