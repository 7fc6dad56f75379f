"""The built library's machine code, for the tests that read it: the CUDA binary tools (on PATH or
from the nvidia-cuda-* wheels of requirements.txt), the variant's shared library, and the SASS of
every kernel of one arch."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import variant_dir, variant_metadata


def nvidia_tool(name: str) -> str | None:
    """A CUDA binary tool: on PATH, or from the nvidia-cuda-* wheels (site-packages/nvidia/cu13/bin)."""
    found = shutil.which(name)
    if found:
        return found
    for site in (Path(p) for p in sys.path if p.endswith("site-packages")):
        candidate = site / "nvidia" / "cu13" / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return None


def cuobjdump() -> str:
    found = nvidia_tool("cuobjdump")
    if found is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    return found


@functools.cache
def disassembly_env() -> dict[str, str]:
    """Environment for cuobjdump --dump-sass, which runs nvdisasm (found through NVDISASM_PATH)."""
    nvdisasm = nvidia_tool("nvdisasm")
    if nvidia_tool("cuobjdump") is None or nvdisasm is None:
        pytest.skip("cuobjdump/nvdisasm not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    env = dict(os.environ, NVDISASM_PATH=nvdisasm)
    env["PATH"] = os.pathsep.join([str(Path(nvdisasm).parent), env.get("PATH", "")])
    return env | {"CUOBJDUMP": cuobjdump()}


def library() -> Path:
    return variant_dir() / f"{variant_metadata()['id']}.abi3.so"


def cubin_arch(cc: int) -> str:
    """The cubin arch of compute capability cc in this build: sm_90a, sm_100f, ..."""
    (capability,) = [c for c in variant_metadata()["backend"]["archs"] if c.rstrip("af").replace(".", "") == str(cc)]
    return "sm_" + capability.replace(".", "")


@functools.cache
def all_kernels(cc: int) -> dict[str, str]:
    """Mangled name -> SASS of every kernel in the arch's cubins."""
    env = disassembly_env()
    command = [env["CUOBJDUMP"], "--dump-sass", "--gpu-architecture", cubin_arch(cc), str(library())]
    sass = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    kernels = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name, _, body = chunk.partition("\n")
        kernels[name.strip()] = body
    return kernels
