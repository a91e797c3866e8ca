"""The templates' fast paths: WMMA tensor cores for float16 matmul on CUDA, rows staged in shared memory for
CUDA row_reduction; the scalar and three-pass kernels everywhere else (HIP, other dtypes, rows that do not fit).
`nvcc` tests build every bundled task's rendered CUDA file, each grid in one build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from popkit import api
from popkit.author import render
from popkit.errors import TaskError
from popkit.machine import system
from popkit.model import tunespec
from popkit.resources import data_dir
from popkit.run.compile import cuda_home_problem

BUNDLED = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")


def spec_task(tmp_path: Path, spec: dict, name: str = "demo") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "kernel.yml").write_text(yaml.safe_dump(spec))
    return d


def text_of(task: str | Path, target: str = "cuda") -> str:
    path = Path(task) if isinstance(task, Path) else data_dir("tasks") / task
    return render.render(path, leaderboard=path.name, target=target, style="inline").text


def test_float16_matmul_on_cuda_is_the_tensor_core_kernel_with_the_examples_defaults():
    text = text_of("matmul")
    spec = tunespec.parse(text, "m.py")
    assert spec.names == ("BM", "BN", "WARPS_M", "WARPS_N", "STAGES")
    assert spec.default == {"BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "STAGES": 2}  # cuda.py's configuration
    points = list(spec.points())
    assert len(points) == 22 and spec.default in points
    assert all(p["WARPS_M"] * p["WARPS_N"] <= 8 and p["BM"] * p["BN"] // (p["WARPS_M"] * p["WARPS_N"]) <= 2048
               for p in points)
    assert "#include <mma.h>" in text and "wmma::mma_sync" in text and "cp.async.cg.shared.global" in text
    assert "matmul_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, true> : matmul_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, false>" in text
    assert "c[row * n + col] = __float2half(acc);" in text  # the spec's body, run per element in the epilogue
    assert "cudaFuncAttributeMaxDynamicSharedMemorySize" in text and "tile_a" not in text


@pytest.mark.parametrize("dtypes, target", [(("float32", "float32"), "cuda"), (("float16", "float32"), "cuda"),
                                            (("float16", "float16"), "hip")])
def test_other_matmuls_keep_the_scalar_kernel(tmp_path, dtypes, target):
    spec = {"inputs": [{"name": "a", "dtype": dtypes[0]}, {"name": "b", "dtype": dtypes[1]}],
            "output": {"name": "c", "dtype": "float32", "shape": ["a.0", "b.1"]}, "geometry": {"kind": "matmul"},
            "body": "c[row * n + col] = acc;"}
    text = text_of(spec_task(tmp_path, spec), target)
    assert tunespec.parse(text, "m.py").names == ("TILE", "WPT")
    assert "tile_a[ty][threadIdx.x]" in text and "wmma" not in text and "<mma.h>" not in text


def test_cuda_softmax_stages_its_row_and_falls_back_to_three_passes():
    text = text_of("softmax")
    assert tunespec.parse(text, "s.py").names == ("BLOCK", "ROWS")
    assert "softmax_kernel_staged<BLOCK, ROWS><<<grid, block, pk_bytes>>>(x, y, rows, cols);" in text
    assert "softmax_kernel<BLOCK, ROWS><<<grid, block>>>(x, y, rows, cols);" in text
    assert "const float* __restrict__ x = pk_x;" in text  # the passes read the row in shared memory
    assert "cudaDevAttrMaxSharedMemoryPerBlockOptin" in text and "__shfl_xor_sync" in text
    hip = text_of("softmax", "hip")
    assert "_staged" not in hip and "pk_" not in hip and "__shfl_xor_sync" not in hip


STAGED_SPEC = {"inputs": [{"name": "x", "dtype": "float16"}, {"name": "wt", "dtype": "float32"},
                       {"name": "out", "dtype": "float32"}],
            "output": {"reuse": "out"},
            "geometry": {"kind": "row_reduction", "over": "x", "rows_of": ["x", "wt", "out"]},
            "reductions": [{"name": "total", "op": "sum", "init": "0.0f", "value": "__half2float(x[j]) * wt[j]"}],
            "body": "out[j] = __half2float(x[j]) * wt[j] / total;"}


def test_only_read_only_rows_are_staged(tmp_path):
    text = text_of(spec_task(tmp_path, STAGED_SPEC))
    staged = re.findall(r"const (\S+) __restrict__ (\w+) = pk_\w+;", text)
    assert staged == [("__half*", "x"), ("float*", "wt")]
    assert "sizeof(__half)" in text and "pk_out" not in text


def test_names_starting_pk_are_reserved(tmp_path):
    spec = {"inputs": [{"name": "pk_x", "dtype": "float32"}], "output": {"name": "y", "dtype": "float32", "like": "pk_x"},
            "geometry": {"kind": "elementwise_flat"}, "body": "y[i] = pk_x[i];"}
    with pytest.raises(TaskError, match="reserved"):
        render.load_spec(spec_task(tmp_path, spec) / "kernel.yml")


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("task", BUNDLED + ("staged-spec",))
def test_every_bundled_cuda_render_builds_its_grid_in_one_build(task, tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    if cuda_home_problem():
        if not system.toolkit_candidates():
            pytest.skip("no usable CUDA toolkit")
        monkeypatch.setenv("CUDA_HOME", system.toolkit_candidates()[0])
    path = tmp_path / f"{task.replace('-', '_')}.py"
    path.write_text(text_of(spec_task(tmp_path, STAGED_SPEC) if task == "staged-spec" else task))
    report = api.compile(path, task=None if task == "staged-spec" else task, timeout_s=900.0)
    assert report.ok and report.status == "built", report.log[-3000:]
    assert not [d for d in report.diagnostics if d.severity == "error"]
