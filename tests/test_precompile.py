"""The leaderboard's compile path predicted from a file's source: the bundled CUDA and HIP examples precompile;
constructed files (device work at import, GPU-dependent arguments, a lazy build, a large artifact) fall back."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.check import precompile
from popkit.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "submissions").glob("*/cuda.py")) + sorted((ROOT / "submissions").glob("*/hip.py"))

HEAD = '''import torch
from torch.utils.cpp_extension import load_inline

SRC = "__global__ void k() {}"
'''
CALL = 'mod = load_inline(name="ext", cpp_sources="void f();", cuda_sources=SRC, functions=["f"]{extra})\n'


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_bundled_examples_precompile_on_the_cpu_worker(path):
    found = precompile.predict(path.read_text())
    assert found.status == "compiled", found.reason
    assert len(found.extensions) == 1 and found.extensions[0].argument_digest
    assert found.extensions[0].at_import and not found.device_work_lines


def test_a_file_without_load_inline_is_skipped():
    assert precompile.predict((ROOT / "submissions" / "vectoradd" / "pytorch.py").read_text()).status == "skipped"


def test_the_digest_leaves_out_build_directory_and_verbose_and_follows_every_other_argument():
    base = precompile.predict(HEAD + CALL.format(extra="")).extensions[0].argument_digest
    quiet = precompile.predict(HEAD + CALL.format(extra=', verbose=True, build_directory="/tmp/x"'))
    assert quiet.extensions[0].argument_digest == base
    flags = precompile.predict(HEAD + CALL.format(extra=', extra_cuda_cflags=["-O3"]'))
    assert flags.extensions[0].argument_digest != base
    positional = precompile.predict(HEAD + 'mod = load_inline("ext", "void f();", SRC, functions=["f"])\n')
    assert positional.extensions[0].argument_digest == base


def test_device_work_at_import_before_the_build_falls_back():
    text = HEAD + "scratch = torch.empty(16, device='cuda')\n" + CALL.format(extra="")
    found = precompile.predict(text)
    assert found.status == "fallback" and found.device_work_lines == (5,)
    assert "line 5 does device work at import" in found.reason and "compile on the GPU" in found.pays


@pytest.mark.parametrize("work", ["x = torch.ones(2).cuda()", "torch.cuda.synchronize()",
                                  "dev = torch.device('cuda')\nx = torch.zeros(1, device=dev)",
                                  "x = torch.ones(2).to('cuda:0')"])
def test_each_kind_of_device_work_is_seen(work):
    assert precompile.predict(HEAD + work + "\n" + CALL.format(extra="")).status == "fallback"


def test_device_work_after_the_build_or_inside_custom_kernel_does_not_stop_it():
    after = precompile.predict(HEAD + CALL.format(extra="") + "warm = torch.zeros(1, device='cuda')\n")
    assert after.extensions[0].status == "compiled" and after.device_work_lines == (6,)
    lazy_work = HEAD + CALL.format(extra="") + "def custom_kernel(data):\n    return data.cuda()\n"
    assert precompile.predict(lazy_work).status == "compiled"
    guarded = HEAD + "ok = torch.cuda.is_available()\n" + CALL.format(extra="")
    assert precompile.predict(guarded).status == "compiled"


def test_arguments_that_read_the_gpu_fall_back():
    text = HEAD + ("CAP = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)\n"
                   "ARCH = f'-arch=sm_{CAP[0]}{CAP[1]}'\n") + CALL.format(extra=", extra_cuda_cflags=[ARCH]")
    found = precompile.predict(text)
    assert found.device_work_lines == ()  # guarded: the CPU worker takes (9, 0)
    assert found.status == "fallback" and found.extensions[0].gpu_dependent == ("extra_cuda_cflags",)
    assert "depend(s) on the GPU" in found.reason
    unguarded = HEAD + "major, minor = torch.cuda.get_device_capability()\n" + CALL.format(extra="")
    assert "device work at import" in precompile.predict(unguarded).reason  # it raises on the CPU worker


def test_device_work_under_an_is_available_guard_does_not_run_on_the_cpu_worker():
    text = HEAD + "if torch.cuda.is_available():\n    torch.cuda.synchronize()\n" + CALL.format(extra="")
    assert precompile.predict(text).status == "compiled"


def test_a_build_only_inside_a_function_is_lazy_unless_called_at_import():
    lazy = HEAD + "def build():\n    return " + CALL.format(extra="").replace("mod = ", "")
    assert precompile.predict(lazy).status == "fallback"
    assert "not called at import" in precompile.predict(lazy).reason
    assert precompile.predict(lazy + "mod = build()\n").status == "compiled"


def test_two_builds_one_falling_back_is_partial():
    second = CALL.format(extra="").replace('"ext"', '"ext2"')
    text = HEAD + CALL.format(extra="") + "torch.cuda.set_device(0)\n" + second
    found = precompile.predict(text)
    assert found.status == "partial" and [e.status for e in found.extensions] == ["compiled", "fallback"]


def test_a_large_artifact_falls_back_and_a_small_one_precompiles(tmp_path):
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "ext.so").write_bytes(os.urandom(2 * 1024 * 1024))  # random: zips to ~2 MiB
    found = precompile.predict(HEAD + CALL.format(extra=""), build_dir=tmp_path)
    artifact = found.extensions[0].artifact
    assert artifact.unpacked_bytes == 2 * 1024 * 1024 and artifact.zipped_bytes > precompile.MAX_ZIPPED_BYTES
    assert found.status == "fallback" and "over the runner's 64 MiB / 1 MiB limits" in found.reason
    (tmp_path / "ext" / "ext.so").write_bytes(b"\0" * (2 * 1024 * 1024))  # zeros: zips to a few KiB
    small = precompile.predict(HEAD + CALL.format(extra=""), build_dir=tmp_path)
    assert small.status == "compiled" and small.extensions[0].artifact.zipped_bytes < 64 * 1024


def test_the_key_needs_the_environment_and_changes_with_it():
    env = {"torch": "2.11.0", "torch_cuda": "13.0", "soabi": "cpython-312-x86_64-linux-gnu", "machine": "x86_64",
           "cxx11_abi": "True", "arch_list": "9.0a"}
    text = HEAD + CALL.format(extra="")
    assert precompile.predict(text).key is None
    key = precompile.predict(text, environment=env).key
    assert key and key != precompile.predict(text, environment={**env, "arch_list": "10.0"}).key


def test_check_prints_the_prediction_and_carries_it_in_json(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    sub = tmp_path / "sub.py"
    sub.write_text("#!POPCORN leaderboard vectoradd\n#!POPCORN gpu H100\n\n" + HEAD
                   + "scratch = torch.empty(16, device='cuda')\n" + CALL.format(extra="")
                   + "def custom_kernel(data):\n    return mod.f(*data)\n")
    result = CliRunner().invoke(app, ["check", str(sub), "--no-guard"])
    assert "precompile: fallback" in result.output and "compile on the GPU" in result.output
    result = CliRunner().invoke(app, ["check", str(sub), "--no-guard", "--json"])
    doc = json.loads(result.stdout)
    assert doc["precompile"]["status"] == "fallback" and doc["precompile"]["device_work_lines"] == [8]


def test_check_measures_the_build_popkit_compile_made_of_the_same_bytes(tmp_path):
    sub = tmp_path / "sub.py"
    sub.write_text(HEAD + CALL.format(extra=""))
    env = {"torch": "2.11.0", "torch_cuda": "13.0", "soabi": "py312", "machine": "x86_64", "cxx11_abi": "",
           "arch_list": "9.0a"}
    for folder, digest, size in (("old", "0" * 64, 10), ("this", hashlib.sha256(sub.read_bytes()).hexdigest(), 4096)):
        (tmp_path / "build" / folder / "ext").mkdir(parents=True)
        (tmp_path / "build" / folder / "ext" / "ext.so").write_bytes(b"\1" * size)
        (tmp_path / "build" / folder / precompile.BUILD_RECORD).write_text(json.dumps(
            {"cold_s": 41.5, "sha256": digest, "environment": env, "written_at": 1.0}))
    found = precompile.predict_file(sub, tmp_path / "build")
    assert found.extensions[0].artifact.unpacked_bytes == 4096 and found.key and found.environment == env
    assert found.status == "compiled" and "not measured" not in found.reason
    sub.write_text(HEAD + "scratch = torch.ones(1).cuda()\n" + CALL.format(extra=""))
    assert precompile.predict_file(sub, tmp_path / "build").pays.endswith("the cold build (popkit compile FILE measures it)")


def test_a_cold_build_over_the_precompile_limit_is_said():
    slow = precompile.predict(HEAD + CALL.format(extra=""), cold_s=290.0)
    assert slow.status == "compiled" and "took 290 s here, over the precompile's 120 s limit" in slow.reason
    assert "over the precompile" not in precompile.predict(HEAD + CALL.format(extra=""), cold_s=30.0).reason
