"""The variant loads through both kernels-client entry points, as consumers load it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import KERNEL_PATH, REPO_ID, ROOT, locate_build, variant_dir, variant_metadata

pytestmark = pytest.mark.kernels_ci


def test_get_local_kernel_loads_the_variant(fp4):
    functions = [name for name in fp4.__all__ if not name.isupper() and name != "layers"]  # and the constants
    assert functions and all(callable(getattr(fp4, name)) for name in functions)
    assert fp4.layers.NVFP4Linear.forward
    assert "group_wise_quant" in fp4.__all__


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


def load_in_fresh_interpreter(path, check_arch: bool = True) -> subprocess.CompletedProcess:
    code = (
        "import logging, sys\n"
        "from pathlib import Path\n"
        "from kernels import get_local_kernel\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        f"ops = get_local_kernel(Path(sys.argv[1]), check_arch={check_arch})\n"
        "print(ops.sfa_size_bytes(128, 64))\n"
    )
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)


def test_loading_verifies_the_digest_without_a_warning():
    result = load_in_fresh_interpreter(KERNEL_PATH)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "512"
    assert "digest" not in result.stderr, result.stderr[-3000:]


def test_loading_a_modified_variant_fails_the_digest_check(tmp_path):
    copy = tmp_path / variant_dir().name
    shutil.copytree(variant_dir(), copy)
    with (copy / "_validate.py").open("a") as f:
        f.write("\n# modified after the build\n")
    result = load_in_fresh_interpreter(tmp_path)
    assert result.returncode != 0 and "do not match the digest" in result.stderr, result.stderr[-3000:]


def test_loading_without_the_arch_check_is_the_documented_call():
    """docs/API.md's call for a GPU outside the build's archs (the package then runs its reference)."""
    result = load_in_fresh_interpreter(KERNEL_PATH, check_arch=False)
    assert result.returncode == 0, result.stderr[-3000:]


def test_ops_namespace_is_unique_per_build(fp4):
    """kernel-builder names it _fp4_gemm_cuda_<git revision>, tools/build.py _fp4_gemm_cuda_<content hash>."""
    namespace = fp4.ops.name
    assert re.fullmatch(r"_fp4_gemm_cuda_\w+", namespace), namespace
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
