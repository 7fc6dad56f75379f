"""Loads the built variant the way consumers do, once per session, and the reference on its own.

Where the build is, in this order:
- FP4_GEMM_BUILD_DIR: a tools/build.py --build-dir;
- LOCAL_KERNELS=<repo-id>=<path> for this package's repo id (kernels' local override; kernel-builder's
  ci-test sets it to its output, whose variants sit at the top level);
- a variant directory on PYTHONPATH (ci-test puts <output>/<variant> there);
- <repo>/build (tools/build.py's default).
The repo id is build.toml's [general.hub] repo-id.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

import pytest
import tomllib
import torch

ROOT = Path(__file__).resolve().parent.parent
VARIANT_GLOB = "torch*-linux"


def build_config() -> dict:
    return tomllib.loads((ROOT / "build.toml").read_text())


REPO_ID: str = build_config()["general"]["hub"]["repo-id"]


def is_variant(path: Path) -> bool:
    return path.match(VARIANT_GLOB) and (path / "metadata.json").is_file()


def local_kernels_path(value: str, repo_id: str) -> Path | None:
    """The path LOCAL_KERNELS ("id=path:id=path") gives repo_id, as kernels parses it."""
    for entry in filter(None, value.split(":")):
        name, _, path = entry.partition("=")
        if name == repo_id and path:
            return Path(path)
    return None


def locate_build(environ: dict[str, str], root: Path, repo_id: str) -> tuple[Path, Path]:
    """(directory holding the variants, what a consumer names to load them: get_local_kernel's path)."""
    if environ.get("FP4_GEMM_BUILD_DIR"):
        build = Path(environ["FP4_GEMM_BUILD_DIR"]).resolve()
        return build, root if build == root / "build" else build
    overridden = local_kernels_path(environ.get("LOCAL_KERNELS", ""), repo_id)
    if overridden is not None:
        overridden = overridden.resolve()
        build = overridden / "build" if (overridden / "build").is_dir() else overridden
        return build, overridden
    for entry in filter(None, environ.get("PYTHONPATH", "").split(os.pathsep)):
        if is_variant(Path(entry).resolve()):
            return Path(entry).resolve().parent, Path(entry).resolve().parent
    return root / "build", root


BUILD_DIR, KERNEL_PATH = locate_build(dict(os.environ), ROOT, REPO_ID)
HAS_CUDA = torch.cuda.is_available()


def gpu_compute_capability() -> int | None:
    """This GPU's compute capability as GemmCall.backends numbers it (90 for 9.0); None without one."""
    if not HAS_CUDA:
        return None
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


GPU_CC = gpu_compute_capability()


def requires_arch(*ccs: int) -> pytest.MarkDecorator:
    """The one GPU gate: marks a test that runs on any CUDA GPU, or with ccs on a GPU whose compute
    capability is one of them (90 = sm_90). It is the `gpu` mark with ccs as its arguments (`-m gpu`
    selects these tests); elsewhere pytest_collection_modifyitems skips the test with the reason."""
    return pytest.mark.gpu(*ccs)


def gpu_missing(ccs: tuple[int, ...] = ()) -> str | None:
    """Why a test gated by requires_arch(*ccs) cannot run here, or None where it can."""
    if HAS_CUDA and (not ccs or GPU_CC in ccs):
        return None
    needed = ("an " + " or ".join(f"sm_{cc}" for cc in ccs) + " GPU") if ccs else "a CUDA GPU"
    here = f", this one is sm_{GPU_CC}" if HAS_CUDA else ""
    return f"needs {needed}{here} (run on the device machine)"


# a `device` parametrization: the CPU (the reference) always, the GPU where there is one
DEVICES = ["cpu", pytest.param("cuda", marks=requires_arch())]


def pytest_configure(config: pytest.Config) -> None:
    # kernel-builder's ci-test runs on a source set without pytest.ini: register the markers here too
    config.addinivalue_line("markers", "kernels_ci: the fast subset for kernel-builder's ci-test")
    config.addinivalue_line("markers", "gpu(*ccs): needs a CUDA GPU (of one of these compute capabilities: 90 = sm_90)")
    config.addinivalue_line("markers", "machine_code: checks the cubins and SASS of the built library")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test taking the `device` fixture (not the DEVICES parametrization) gets requires_arch();
    a test whose `gpu` marks (module, class, function: each must hold) this machine does not meet
    gets a skip with gpu_missing's reason."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if "device" in getattr(item, "fixturenames", ()) and "device" not in (callspec.params if callspec else {}):
            item.add_marker(requires_arch())
        reason = next(filter(None, (gpu_missing(mark.args) for mark in item.iter_markers("gpu"))), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def requires_repo_file(relative: str) -> Path:
    """A repository file that kernel-builder's source set (build.toml, sources, *.py of torch-ext and
    tests) leaves out; the test skips where it is absent, as in ci-test."""
    path = ROOT / relative
    if not path.exists():
        reason = f"{relative} is not in this source tree (kernel-builder's ci-test copies only its source set)"
        pytest.skip(reason, allow_module_level=True)
    return path


def load_module(name: str, path: Path) -> ModuleType:
    """A Python file of the repository imported as module `name` (registered: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_reference() -> ModuleType:
    """reference.py straight from the source tree: it must import without the compiled extension."""
    return load_module("fp4_gemm_reference", ROOT / "torch-ext" / "fp4_gemm" / "reference.py")


def variant_dirs() -> list[Path]:
    return sorted(p for p in BUILD_DIR.glob(VARIANT_GLOB) if is_variant(p))


def running_variant_name() -> str:
    """The variant kernel-builder builds for this interpreter's torch (and the kernels client loads):
    torch<MAJ><MIN>-cxx11-cu<torch.version.cuda>-<machine>-linux."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda = (torch.version.cuda or "none").replace(".", "")
    return f"torch{major}{minor}-cxx11-cu{cuda}-{platform.machine()}-linux"


def variant_dir() -> Path:
    """The built variant of this interpreter's torch (a build may hold one per torch version)."""
    path = BUILD_DIR / running_variant_name()
    if not is_variant(path):
        built = ", ".join(p.name for p in variant_dirs()) or "none"
        message = f"no variant {path.name} for torch {torch.__version__} under {BUILD_DIR} (built: {built})"
        pytest.exit(f"{message}: run `tools/build.py --torch {sys.executable}` first", returncode=2)
    return path


def variant_metadata() -> dict:
    return json.loads((variant_dir() / "metadata.json").read_text())


@pytest.fixture(scope="session")
def fp4() -> ModuleType:
    """The package as consumers get it: kernels.get_local_kernel on the build's repository path."""
    from kernels import get_local_kernel

    variant_dir()
    return get_local_kernel(KERNEL_PATH)


@pytest.fixture(scope="session")
def ref() -> ModuleType:
    return load_reference()


@pytest.fixture(scope="session")
def device() -> str:
    """The GPU, "cuda": a test taking it is gated by requires_arch() (pytest_collection_modifyitems)."""
    return "cuda"
