"""Bad input raises ValueError naming the rule, before anything runs."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.kernels_ci


@pytest.mark.parametrize(
    "make_input,mode,rule",
    [
        (lambda: torch.zeros(4, 64, dtype=torch.float32), "w8a8-mxfp8", "input must have dtype"),
        (lambda: torch.zeros(4, 64, dtype=torch.uint8), "w4a4-nvfp4", "input must have dtype"),
        (lambda: torch.zeros(64, dtype=torch.bfloat16), "w8a8-mxfp8", "input must be 2-D"),
        (lambda: torch.zeros(2, 4, 64, dtype=torch.bfloat16), "w8a8-mxfp8", "input must be 2-D"),
        (lambda: torch.zeros(4, 48, dtype=torch.bfloat16), "w8a8-mxfp8", "must be a multiple of 32"),
        (lambda: torch.zeros(4, 48, dtype=torch.bfloat16), "w4a4-mxfp4", "must be a multiple of 32"),
        (lambda: torch.zeros(4, 24, dtype=torch.bfloat16), "w4a4-nvfp4", "must be a multiple of 16"),
        (lambda: torch.zeros(64, 4, dtype=torch.bfloat16).t(), "w4a4-nvfp4", "input must be contiguous"),
        (lambda: torch.zeros(4, 64, dtype=torch.bfloat16, device="meta"), "w4a4-nvfp4", "CPU or CUDA tensor"),
        (lambda: [[0.0] * 32], "w8a8-mxfp8", "input must be a torch.Tensor"),
        (lambda: torch.zeros(4, 64, dtype=torch.bfloat16), "w4a4-int4", "mode must be one of"),
    ],
)
def test_group_wise_quant_rejects_bad_input(fp4, make_input, mode, rule):
    with pytest.raises(ValueError, match=rule):
        fp4.group_wise_quant(make_input(), mode)
