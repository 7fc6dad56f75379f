"""The variant loads through both kernels-client entry points, as consumers load it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import KERNEL_PATH, REPO_ID, ROOT, locate_build, variant_dir, variant_metadata

pytestmark = pytest.mark.kernels_ci


def test_get_local_kernel_loads_the_variant(fp4):
    functions = [name for name in fp4.__all__ if not name.isupper()]  # the rest: flashrt's constants
    assert functions and all(callable(getattr(fp4, name)) for name in functions)
    assert "group_wise_quant" in fp4.__all__


def test_compat_entry_exposes_what_the_package_does():
    """`<variant>/fp4_gemm/`, imported as a plain package (flashrt's test suite does), has the public
    functions, the constants, `ops` and the submodules, and runs."""
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(variant_dir())!r})\n"
        "import fp4_gemm\n"
        "variant = sys.modules['fp4_gemm._variant']\n"
        "public = {n for n in vars(variant) if not n.startswith('__')}\n"
        "missing = sorted(public - set(vars(fp4_gemm)))\n"
        "assert not missing, missing\n"
        "assert fp4_gemm.ops is variant.ops and fp4_gemm.ops.name.startswith('_fp4_gemm_')\n"
        "assert fp4_gemm.NVFP4_BLOCK_SIZE == 16 and fp4_gemm.aligned_fp4_dim(4304) == 4320\n"
        "q, sf = fp4_gemm.quantize_fp4_sfa_bf16(torch.ones(1, 32, dtype=torch.bfloat16))\n"
        "print(sf[0].item())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == str(0x23)  # e4m3(1 / 6)


def test_get_kernel_with_local_override_gives_the_same_module(fp4, monkeypatch):
    from kernels import get_kernel

    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={KERNEL_PATH}")
    assert get_kernel(REPO_ID, version=1, trust_remote_code=True) is fp4


def test_get_kernel_loads_in_a_fresh_interpreter():
    code = (
        "from kernels import get_kernel\n"
        f"ops = get_kernel({REPO_ID!r}, version=1, trust_remote_code=True)\n"
        "import torch\n"
        "q, sf = ops.group_wise_quant(torch.ones(1, 32, dtype=torch.bfloat16), 'w4a4-nvfp4')\n"
        "print(sf.flatten()[0].item())\n"
    )
    env = dict(os.environ, LOCAL_KERNELS=f"{REPO_ID}={KERNEL_PATH}", HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == str(0x23)  # e4m3(1 / 6) = 0.1640625


def test_ops_namespace_is_unique_per_build(fp4):
    """tools/build.py names it _fp4_gemm_<content hash>; kernel-builder _fp4_gemm_cuda_<git revision>."""
    namespace = fp4.ops.name
    assert re.fullmatch(r"_fp4_gemm_([0-9a-f]{10}|cuda_\w+)", namespace), namespace
    assert variant_metadata()["id"] == namespace


def test_quantize_op_has_its_full_schema(fp4):
    schema = str(fp4.ops.quantize.default._schema)
    assert schema.endswith(
        "::quantize(Tensor input, str recipe, bool swizzle, bool pdl, Tensor(a!) values, Tensor(b!) scales) -> ()"
    ), schema


def test_build_is_found_through_fp4_gemm_build_dir_first(tmp_path):
    environ = {"FP4_GEMM_BUILD_DIR": str(tmp_path), "LOCAL_KERNELS": f"{REPO_ID}=/elsewhere"}
    assert locate_build(environ, ROOT, REPO_ID) == (tmp_path, tmp_path)


def test_build_is_found_through_local_kernels_as_ci_test_sets_it(tmp_path):
    environ = {"LOCAL_KERNELS": f"other/kernel=/x:{REPO_ID}={tmp_path}", "PYTHONPATH": "/y"}
    assert locate_build(environ, ROOT, REPO_ID) == (tmp_path, tmp_path)


def test_build_is_found_in_the_build_dir_of_a_local_kernels_checkout(tmp_path):
    (tmp_path / "build").mkdir()
    assert locate_build({"LOCAL_KERNELS": f"{REPO_ID}={tmp_path}"}, ROOT, REPO_ID) == (tmp_path / "build", tmp_path)


def test_build_is_found_through_a_variant_on_pythonpath(tmp_path):
    variant = tmp_path / "torch211-cxx11-cu130-x86_64-linux"
    variant.mkdir()
    (variant / "metadata.json").write_text("{}")
    environ = {"PYTHONPATH": os.pathsep.join(["/unrelated", str(variant)])}
    assert locate_build(environ, ROOT, REPO_ID) == (tmp_path, tmp_path)


def test_build_defaults_to_the_checkouts_build_dir():
    assert locate_build({}, ROOT, REPO_ID) == (ROOT / "build", ROOT)
