"""`popkit tune`'s builds: the probe keys variants by what they hand the toolchain, so a `popkit new` grid
(every point compiled into one extension) builds once, with nvcc for CUDA and with clang for gfx942 (HIP);
a file that bakes its values into the source builds once per value."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from popkit.author import render
from popkit.machine import system
from popkit.model import tunespec
from popkit.model.tasks import load_task
from popkit.resources import data_dir
from popkit.run import proc
from popkit.run import runner
from popkit.run.compile import cuda_home_problem
from popkit.toolchain import hipbuild
from popkit.tuning import probe as tuneprobe
from popkit.tuning import workflow as tune


def rendered(tmp_path: Path, task: str, target: str = "cuda", style: str = "inline") -> Path:
    out = render.render(data_dir("tasks") / task, leaderboard=task, target=target, style=style)
    path = tmp_path / f"{task}_{target}_{style}.py"
    path.write_text(out.text)
    return path


def variants(path: Path) -> tuple[tunespec.TuneSpec, list[dict], list[bytes]]:
    text = path.read_text()
    spec = tunespec.parse(text, str(path))
    points = list(spec.points())
    return spec, points, [tunespec.variant_text(text, spec, p).encode() for p in points]


BAKED = '''#!POPKIT tune BLOCK=64,128
import torch
from torch.utils.cpp_extension import load_inline

BLOCK = 64
_module = load_inline(name="baked", cpp_sources="", cuda_sources=f"constexpr int B = {BLOCK};",
                      extra_cuda_cflags=["-O3"])


def custom_kernel(data):
    return data
'''


@pytest.mark.slow
def test_the_probe_keys_a_template_grid_alike_and_baked_values_apart(tmp_path):
    task = load_task(data_dir("tasks") / "vectoradd")
    inline, library = rendered(tmp_path, "vectoradd"), rendered(tmp_path, "vectoradd", style="library")
    baked = tmp_path / "baked.py"
    baked.write_text(BAKED)
    contents = []
    for path in (inline, library, baked):
        _spec, _points, found = variants(path)
        contents.append(found)
    keys = tuneprobe.build_identities(task, [c for group in contents for c in group], runner.RunOptions())
    n_inline, n_library = len(contents[0]), len(contents[1])
    assert n_inline == 20 and all(k.shared and k.key for k in keys)
    assert len({k.key for k in keys[:n_inline]}) == 1 and keys[0].names == ("popkit_vectoradd_cuda_inline",)
    assert len({k.key for k in keys[n_inline:n_inline + n_library]}) == 1  # register_fake after the build: followed
    assert keys[0].key != keys[n_inline].key
    assert len({k.key for k in keys[n_inline + n_library:]}) == 2  # the value is in the source: one build each


@pytest.mark.nvcc
@pytest.mark.slow
def test_a_rendered_cuda_grid_of_20_variants_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    if cuda_home_problem():
        candidates = system.toolkit_candidates()
        if not candidates:
            pytest.skip("no usable CUDA toolkit")
        monkeypatch.setenv("CUDA_HOME", candidates[0])
    path = rendered(tmp_path, "softmax")
    task = load_task(data_dir("tasks") / "softmax")
    spec, points, _contents = variants(path)
    assert len(points) >= 16
    content = path.read_bytes()
    options = runner.with_toolkit(runner.RunOptions(), content, lambda _m: None)
    with proc.WorkDir("popkit-test-tune-") as root:
        tuner = tune.Tuner(task, path, content, spec, options, tune.TuneSettings(record=False), tune.Backend(),
                           lambda _m: None, time.monotonic, root, {}, path, content)
        states = tuner.add(points)
        keys = {tuner.identities[s.sha256].key for s in states}
        assert len(keys) == 1 and None not in keys
        tuner.build(states)
        assert tuner.builds == 1 and tuner.built == {next(iter(keys)): ""}
        folder = tuneprobe.build_dir(tuner.ext_root, next(iter(keys)))
        (library,) = folder.rglob("*.so")
        before = (library.stat().st_mtime_ns, (library.parent / ".ninja_log").read_text())
        for state in (states[len(states) // 2], states[-1]):  # another variant's pre-step finds it built
            step, tampered = tune.build_step(task, state.path, state.content, tuner.options_for(state))
            assert step is not None and step.ok and not tampered, step.stderr[-2000:]
        assert (library.stat().st_mtime_ns, (library.parent / ".ninja_log").read_text()) == before


@pytest.mark.hip
@pytest.mark.slow
def test_a_rendered_hip_grid_builds_once_for_gfx942(tmp_path):
    path = rendered(tmp_path, "softmax", "hip")
    _spec, points, contents = variants(path)
    assert len(points) >= 16
    sources = {hipbuild.device_source(c.decode()) for c in contents}
    assert len(sources) == 1  # every variant hands clang the same kernels: one build serves them all
    build = hipbuild.build_device(path.read_text(), str(path), "gfx942")
    assert build.ok, build.log[-2000:]
    assert len(build.kernels) == len(points)  # one instantiation per grid point, all in that one build
