"""The ops trace with fake tensors: torch.compile(fullgraph=True) and opcheck work."""

from __future__ import annotations

import pytest
import torch
from cases import MODES, make_random
from checks import assert_bitwise_equal

pytestmark = pytest.mark.kernels_ci


@pytest.mark.parametrize("mode", MODES)
def test_group_wise_quant_compiles_fullgraph(fp4, mode):
    x = make_random(130, 256, torch.bfloat16, "cpu", seed=0)
    compiled = torch.compile(fp4.group_wise_quant, fullgraph=True, backend="aot_eager")
    for got, expected in zip(compiled(x, mode), fp4.group_wise_quant(x, mode), strict=True):
        assert_bitwise_equal(got, expected, f"compiled {mode}")


@pytest.mark.parametrize("swizzle", [True, False])
def test_quantize_op_passes_opcheck(fp4, swizzle):
    x = make_random(130, 64, torch.float16, "cpu", seed=1)
    values = torch.empty(130, 32, dtype=torch.uint8)
    scales = torch.empty((256, 4) if swizzle else (130, 4), dtype=torch.uint8)
    torch.library.opcheck(fp4.ops.quantize.default, (x, "nvfp4", swizzle, True, values, scales))


def test_group_wise_quant_traces_under_fake_tensors(fp4):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(300, 128, dtype=torch.bfloat16)
        q, sf = fp4.group_wise_quant(x, "w4a4-mxfp4")
    assert tuple(q.shape) == (300, 64) and q.dtype == torch.uint8
    assert tuple(sf.shape) == (384, 4) and sf.dtype == torch.uint8
