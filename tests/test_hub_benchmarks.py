"""The benchmarks as the Hub holds them: kernel-builder uploads benchmarks/benchmark*.py and nothing else
of benchmarks/, and `kernels benchmark <repo>` loads each of those files on its own (kernels'
discover_benchmark_classes) and runs its Benchmark subclasses' setup_/benchmark_/verify_ workloads."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HAS_CUDA, requires_repo_file, variant_dir

BENCHMARKS = requires_repo_file("benchmarks")
UPLOADED = sorted(BENCHMARKS.glob("benchmark*.py"))


def hub_repo(tmp_path: Path) -> Path:
    """A directory laid out like the Hub repo: the variant at the top, benchmarks/benchmark*.py only."""
    (tmp_path / "benchmarks").mkdir(parents=True)
    for script in UPLOADED:
        shutil.copy2(script, tmp_path / "benchmarks" / script.name)
    (tmp_path / variant_dir().name).symlink_to(variant_dir(), target_is_directory=True)
    return tmp_path


DISCOVER = """\
import sys
from pathlib import Path
from kernels.cli.benchmark import discover_benchmark_classes
script = Path(sys.argv[1])
for cls in discover_benchmark_classes(script, script.parent.parent):
    workloads = [n[len("benchmark_"):] for n in dir(cls) if n.startswith("benchmark_")]
    unverified = [w for w in workloads if not hasattr(cls, "verify_" + w)]
    print(cls.__name__, len(workloads), ",".join(unverified) or "-")
"""


def require_kernels_cli() -> None:
    """kernels' CLI imports its signature checks (sigstore, cryptography): a client installed without
    its dependencies (pip --no-deps, as on the device machine) has no CLI to run."""
    pytest.importorskip("kernels.cli", reason="the kernels CLI needs its dependencies (pip install kernels)")


def test_uploaded_benchmarks_exist():
    assert [p.name for p in UPLOADED] == ["benchmark_gemm.py", "benchmark_quantize.py"]


@pytest.mark.parametrize("script", [p.name for p in UPLOADED])
def test_uploaded_benchmark_loads_alone_with_verified_workloads(tmp_path, script):
    """kernels' own loader on the file, in a fresh interpreter that sees no other file of benchmarks/."""
    require_kernels_cli()
    repo = hub_repo(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", DISCOVER, str(repo / "benchmarks" / script)],
        capture_output=True, text=True, cwd=repo, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    classes = [line.split() for line in result.stdout.splitlines()]
    assert classes, f"{script}: no Benchmark subclass"
    for name, count, unverified in classes:
        assert int(count) > 0 and unverified == "-", f"{script} {name}: {count} workloads, unverified {unverified}"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="kernels benchmark runs on the GPU (its device is torch's CUDA backend)")
def test_kernels_benchmark_runs_and_verifies_every_uploaded_workload(tmp_path):
    pytest.importorskip("tabulate", reason="kernels benchmark needs tabulate (requirements.txt)")
    require_kernels_cli()
    from kernels.cli.benchmark import discover_benchmark_classes

    repo = hub_repo(tmp_path / "repo")
    expected = {
        f"{cls.__name__}.{name[len('benchmark_') :]}"
        for script in sorted((repo / "benchmarks").glob("benchmark*.py"))
        for cls in discover_benchmark_classes(script, repo)
        for name in dir(cls)
        if name.startswith("benchmark_")
    }
    cli = "import sys; from kernels.cli import main; sys.argv[0] = 'kernels'; main()"
    output = tmp_path / "result.json"
    command = [sys.executable, "-c", cli, "benchmark", str(repo), "--iterations", "3", "--warmup", "1"]
    result = subprocess.run(command + ["--output", str(output)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    workloads = {entry["workload"]: entry.get("verified") for entry in json.loads(output.read_text())["results"]}
    assert set(workloads) == expected and all(workloads.values()), workloads
