"""Loads the built variant the way consumers do, once per session, and the reference on its own."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import tomllib
import torch

ROOT = Path(__file__).resolve().parent.parent
# The build under test: build/ (tools/build.py's default), or another --build-dir named here.
BUILD_DIR = Path(os.environ.get("FP4_GEMM_BUILD_DIR", ROOT / "build")).resolve()
# What a consumer names to load it (get_local_kernel, LOCAL_KERNELS): the repository, or that dir.
KERNEL_PATH = ROOT if BUILD_DIR == ROOT / "build" else BUILD_DIR
REPO_ID = "org/fp4-gemm"
HAS_CUDA = torch.cuda.is_available()

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (run on the device machine)")


def load_reference() -> ModuleType:
    """reference.py straight from the source tree: it must import without the compiled extension."""
    path = ROOT / "torch-ext" / "fp4_gemm" / "reference.py"
    spec = importlib.util.spec_from_file_location("fp4_gemm_reference", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def build_config() -> dict:
    return tomllib.loads((ROOT / "build.toml").read_text())


def variant_dirs() -> list[Path]:
    return sorted(p for p in BUILD_DIR.glob("torch*-linux") if (p / "metadata.json").exists())


def variant_dir() -> Path:
    dirs = variant_dirs()
    if not dirs:
        pytest.exit(f"no built variant under {BUILD_DIR}: run `python tools/build.py` first", returncode=2)
    return dirs[-1]


def variant_metadata() -> dict:
    return json.loads((variant_dir() / "metadata.json").read_text())


@pytest.fixture(scope="session")
def fp4() -> ModuleType:
    """The package as consumers get it: kernels.get_local_kernel on the repository root."""
    from kernels import get_local_kernel

    variant_dir()
    return get_local_kernel(KERNEL_PATH)


@pytest.fixture(scope="session")
def ref() -> ModuleType:
    return load_reference()


@pytest.fixture(scope="session")
def device() -> str:
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU (run on the device machine)")
    return "cuda"
