#!/usr/bin/env python3
"""Run kernel-builder's `nix run .#ci-test` step without Nix, on a local build.

kernel-builder's ci-test (nix-builder/lib/build.nix, mkCiTests) runs

    PYTHONPATH=<out>/<variant> LOCAL_KERNELS=<repo-id>=<out> \\
        python -m pytest <src>/tests -m kernels_ci -p no:cacheprovider

where <out> holds the variant directories and <src> is a read-only copy of the source set
(nix-builder/lib/source-set.nix: build.toml, the [torch] and [kernel.*] sources, the *.py/*.pyi files
of torch-ext/ and tests/) plus the pyproject.toml kernel-builder generates (it declares the
kernels_ci marker). This script builds that source set from build.toml in a temporary directory,
mounts it read-only (a private read-only bind mount where `unshare` allows it; the tree is checked
unchanged afterwards either way), and runs the same command from another working directory with
<out> = the local build directory. Unlike ci-test it fails when no test is selected.

    python tools/ci_test.py [--build-dir build]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PYTEST_EXIT_NO_TESTS = 5
# The part of kernel-builder's generated pyproject.toml that pytest reads.
PYPROJECT = """\
[project]
name = "{python_name}"
version = "0.1.0"
requires-python = ">=3.9"

[tool.pytest.ini_options]
markers = [
  "kernels_ci: mark a test as a kernel CI test"
]
"""


def source_set(root: Path, config: dict) -> list[str]:
    """Relative paths of kernel-builder's source set (source-set.nix), sorted."""
    torch_config = config.get("torch", {})
    py_suffixes = tuple(f".{ext}" for ext in torch_config.get("pyext", ["py", "pyi"]))
    files = {"build.toml", *torch_config.get("src", [])}
    for kernel in config.get("kernel", {}).values():
        files.update(kernel["src"])
    for folder in ("torch-ext", "tests"):
        files.update(
            str(p.relative_to(root)) for p in (root / folder).rglob("*") if p.is_file() and p.name.endswith(py_suffixes)
        )
    return sorted(f for f in files if "__pycache__" not in f)


def copy_source_set(root: Path, files: list[str], dest: Path, python_name: str) -> None:
    for relative in files:
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / relative, target)
    (dest / "pyproject.toml").write_text(PYPROJECT.format(python_name=python_name))


def tree_digest(path: Path) -> str:
    """Names and contents of every file under path: any write by the tests changes it."""
    digest = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        digest.update(str(p.relative_to(path)).encode())
        if p.is_file():
            digest.update(p.read_bytes())
    return digest.hexdigest()


def make_read_only(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)


def read_only_mount_prefix(path: Path) -> list[str]:
    """A command prefix that runs the command with `path` bind-mounted read-only in a private mount
    namespace, or [] where unshare/mount are not allowed (then only the permission bits guard it)."""
    if shutil.which("unshare") is None:
        return []
    script = 'mount --bind -o ro "$0" "$0" && exec "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, str(path), "true"], capture_output=True)
    return ["unshare", "-m", "sh", "-c", script, str(path)] if probe.returncode == 0 else []


def variant_dir(build: Path) -> Path:
    """The variant of this interpreter's torch (ci-test runs each variant under its own torch)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from build import read_torch_env  # the build tool's naming of variants

    variant = build / read_torch_env(sys.executable).variant
    if not (variant / "metadata.json").is_file():
        sys.exit(f"no variant {variant.name} under {build}: run `tools/build.py --torch {sys.executable}` first")
    return variant


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build", help="ci-test's <out> (default build/)")
    args = parser.parse_args()
    config = tomllib.loads((ROOT / "build.toml").read_text())
    repo_id = config["general"]["hub"]["repo-id"]
    python_name = config["general"]["name"].replace("-", "_")
    build = args.build_dir.resolve()
    variant = variant_dir(build)

    with tempfile.TemporaryDirectory(prefix="ci-test-") as scratch:
        src, cwd = Path(scratch) / "source", Path(scratch) / "cwd"
        files = source_set(ROOT, config)
        copy_source_set(ROOT, files, src, python_name)
        cwd.mkdir()
        make_read_only(src)
        before = tree_digest(src)
        mount = read_only_mount_prefix(src)
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FP4_GEMM_BUILD_DIR")}
        env |= {"PYTHONPATH": str(variant), "LOCAL_KERNELS": f"{repo_id}={build}", "PYTHONDONTWRITEBYTECODE": "1"}
        command = [sys.executable, "-m", "pytest", str(src / "tests"), "-m", "kernels_ci", "-p", "no:cacheprovider"]
        guard = "a read-only bind mount" if mount else "read-only permission bits (no private mount here)"
        print(f"ci-test: {len(files)} files of the source set in {src}, guarded by {guard}")
        print(f"ci-test: PYTHONPATH={variant} LOCAL_KERNELS={repo_id}={build}")
        started = time.time()
        result = subprocess.run(mount + command, cwd=cwd, env=env)
        print(f"ci-test: {time.time() - started:.1f} s, pytest exit code {result.returncode}")
        changed = tree_digest(src) != before
        for p in [src, *src.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)  # so the temporary directory can be removed
    if changed:
        sys.exit("ci-test: the tests wrote into the read-only source tree")
    if result.returncode == PYTEST_EXIT_NO_TESTS:
        sys.exit("ci-test: no kernels_ci test was selected")
    sys.exit(result.returncode)


if __name__ == "__main__":
    main()
