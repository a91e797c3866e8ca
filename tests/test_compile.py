"""popkit compile: log parsing, mapping generated lines to the submission, locks, HIP static checks, the command.

Tests marked `nvcc` build for real (skipped without nvcc and a CUDA build of torch); the others
replace the child build with canned results or generate load_inline's files without compiling.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.author import render
from popkit.cli import app
from popkit.errors import EnvironmentProblem, ExitCode, SubmissionError
from popkit.machine import system
from popkit.model.diagnostics import SourceMap, map_diagnostics, parse_log, string_literals
from popkit.resources import data_dir
from popkit.run import compile as compiler
from popkit.toolchain.locks import lock_state

NVCC_LOG = """\
[1/3] /usr/local/cuda/bin/nvcc -c /b/ext/cuda.cu -o cuda.cuda.o
FAILED: cuda.cuda.o
/b/ext/cuda.cu(12): error: identifier "c" is undefined
          out[i] = __hadd(a[i], c[i]);
                                ^

/b/ext/cuda.cu(12): error: identifier "c" is undefined
          out[i] = __hadd(a[i], c[i]);
                                ^

/b/ext/cuda.cu(9): warning #177-D: variable "unused" was declared but never referenced
      int unused = 3;
          ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

2 errors detected in the compilation of "/b/ext/cuda.cu".
/b/ext/main.cpp: In function 'void pybind11_init_ext(pybind11::module_&)':
/b/ext/main.cpp:6:50: error: 'vector_add' was not declared in this scope; did you mean 'vectoradd'?
    6 | m.def("vector_add", torch::wrap_pybind_function(vector_add), "vector_add");
      |                                                  ^~~~~~~~~~
/usr/include/c++/12/bits/stl_vector.h:10:3: warning: something in a system header
ptxas error   : Entry function '_Z14softmax_kernelPKfPfl' uses too much shared data (0x13880 bytes, 0xc000 max)
/usr/bin/ld: cannot find -lcudart: No such file or directory
collect2: error: ld returned 1 exit status
ninja: build stopped: subcommand failed.
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)


def rendered_file(tmp_path: Path, task: str = "vectoradd", target: str = "cuda", style: str = "inline") -> Path:
    out = render.render(data_dir("tasks") / task, leaderboard=task, target=target, style=style)
    path = tmp_path / f"{task}_{target}_{style}.py"
    path.write_text(out.text)
    return path


def line_of(path: Path, needle: str) -> int:
    return next(n for n, s in enumerate(path.read_text().splitlines(), 1) if needle in s)


def generate_sources(submission: Path, build_root: Path, monkeypatch) -> Path:
    """Let the real load_inline write main.cpp and cuda.cu, without compiling anything."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(build_root))
    monkeypatch.setattr(ext, "_jit_compile", lambda *a, **k: object())
    runpy.run_path(str(submission), run_name="submission")
    return build_root


# ------------------------------------------------------------------------------------ parsing


def test_parse_log_reads_every_tool_once():
    found = parse_log(NVCC_LOG)
    summary = [(d.tool, d.severity, d.path and Path(d.path).name, d.line, d.column) for d in found]
    assert summary == [
        ("nvcc", "error", "cuda.cu", 12, 31),
        ("nvcc", "warning", "cuda.cu", 9, 9),
        ("gcc", "error", "main.cpp", 6, 50),
        ("gcc", "warning", "stl_vector.h", 10, 3),
        ("ptxas", "error", None, None, None),
        ("ld", "error", None, None, None),
    ]
    assert found[0].message == 'identifier "c" is undefined'
    assert found[4].symbol == "_Z14softmax_kernelPKfPfl"


def test_string_literals_know_each_characters_position():
    text = 'A = r"""\nx\\n y\n"""\nB = "p\\tq\\\nr"\n'
    raw, plain = string_literals(text)
    assert raw.value == "\nx\\n y\n" and raw.positions[1] == (2, 0) and raw.positions[4] == (2, 3)
    assert plain.value == "p\tqr"
    assert plain.positions[3] == (5, 0)  # after the line continuation


def test_map_generated_lines_back_to_the_submission(tmp_path, monkeypatch):
    sub = rendered_file(tmp_path)
    text = sub.read_text().replace("__hadd(a[i], b[i])", "__hadd(a[i], c[i])").replace(
        'functions=["vectoradd"]', 'functions=["vector_add"]')
    sub.write_text(text)
    build = generate_sources(sub, tmp_path / "ext", monkeypatch)
    gen_dir = build / "popkit_vectoradd_cuda_inline"
    cuda = (gen_dir / "cuda.cu").read_text().splitlines()
    main = (gen_dir / "main.cpp").read_text().splitlines()
    cu_line = next(n for n, s in enumerate(cuda, 1) if "c[i]" in s)
    def_line = next(n for n, s in enumerate(main, 1) if 'm.def("vector_add"' in s)
    source = cuda[cu_line - 1]  # nvcc quotes the line, two spaces in, with a caret under the column
    log = (f"{gen_dir}/cuda.cu({cu_line}): error: identifier \"c\" is undefined\n"
           f"  {source}\n{' ' * (source.index('c[i]') + 2)}^\n"
           f"{gen_dir}/main.cpp:{def_line}:50: error: 'vector_add' was not declared in this scope\n")
    diags = map_diagnostics(parse_log(log), SourceMap(sub, text), build)
    assert [(d.line, d.column, d.file) for d in diags] == [
        (line_of(sub, "c[i]"), sub.read_text().splitlines()[line_of(sub, "c[i]") - 1].index("c[i]") + 1, str(sub)),
        (line_of(sub, 'functions=["vector_add"]'), 16, str(sub)),
    ]
    assert diags[0].source_line.strip() == "out[i] = __hadd(a[i], c[i]);"
    assert diags[0].generated == f"cuda.cu:{cu_line}:{source.index('c[i]') + 1}"
    assert "functions= names `vector_add`" in diags[1].hint


def test_symbols_point_at_the_kernel_or_declaration(tmp_path):
    sub = rendered_file(tmp_path, "softmax")
    smap = SourceMap(sub, sub.read_text())
    ptxas, ld = [d for d in parse_log(NVCC_LOG) if d.tool in ("ptxas", "ld")]
    [d] = map_diagnostics([ptxas], smap, None)
    assert d.line == line_of(sub, "__global__ void __launch_bounds__(BLOCK) softmax_kernel(")
    assert "softmax_kernel" in d.message
    [d] = map_diagnostics([ld], smap, None)
    assert d.message == "cannot find -lcudart: No such file or directory" and d.line is None


# ------------------------------------------------------------------------------------ compile flow


def fake_import(results: list[dict], logs: list[str] | None = None):
    calls = []

    def _import(workdir, name, env, tools, target, timeout_s, build_dir):
        calls.append({"name": name, "env": dict(env), "files": sorted(p.name for p in workdir.cwd.iterdir())})
        return results[len(calls) - 1], (logs or [""] * len(results))[len(calls) - 1]

    return _import, calls


def cuda_tools(**kw) -> compiler.Toolchain:
    base = dict(python=sys.executable, python_tag="py311", torch="2.14.1+cu130", cuda="13.0", hip=None,
                lock_style="flock", nvcc="/usr/local/cuda/bin/nvcc", ninja="/usr/bin/ninja")
    return compiler.Toolchain(**{**base, **kw})


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools())
    monkeypatch.setattr(compiler, "cuda_home_problem", lambda: None)
    monkeypatch.setattr(compiler, "local_gpu_archs", lambda: (None, False))  # as on a machine without a GPU
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)


def test_built_report_with_times_record_and_cache(tmp_path, monkeypatch, fake_cuda):
    sub = rendered_file(tmp_path)
    fake, calls = fake_import([{"ok": True, "seconds": 100.0, "torch_import_s": 2.0, "has_custom_kernel": True},
                               {"ok": True, "seconds": 1.5, "torch_import_s": 2.0, "has_custom_kernel": True}])
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(sub)
    assert (report.status, report.exit_code, report.cold_s, report.warm_s, report.cached) == ("built", 0, 100.0, 1.5, False)
    assert report.task == "vectoradd" and report.test_timeout_s == 120
    assert report.arch_list == "9.0a" and calls[0]["env"]["TORCH_CUDA_ARCH_LIST"] == "9.0a"  # from `#!POPCORN gpu H100`
    assert calls[0]["name"] == "submission.py" and "reference.py" in calls[0]["files"]  # the task's files beside it
    assert Path(report.build_dir).parent == tmp_path / "home" / "build"
    assert report.notes == (
        "architecture: TORCH_CUDA_ARCH_LIST=9.0a, no GPU here: from `#!POPCORN gpu H100` (line 2)",
        "warning: the cold build took 100 s, 83% of the task's test_timeout (120 s): a first run that must build may "
        "time out")
    assert compiler.CompileReport.from_json(json.loads(json.dumps(report.to_json()))) == report

    fake, calls = fake_import([{"ok": True, "seconds": 1.2, "has_custom_kernel": True}])
    monkeypatch.setattr(compiler, "_import", fake)
    again = compiler.compile_submission(sub)
    assert (again.cached, again.cold_s, again.warm_s, len(calls)) == (True, 100.0, 1.2, 1)  # only the warm import ran


def test_a_file_without_load_inline_says_nothing_was_compiled(tmp_path, monkeypatch, fake_cuda):
    sub = tmp_path / "plain.py"
    sub.write_text("import torch\n\n\ndef custom_kernel(data):\n    return data\n")
    fake, _ = fake_import([{"ok": True, "seconds": 0.01, "has_custom_kernel": True}] * 2)
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(sub)
    assert report.ok and report.arch_list is None
    assert "the file calls no load_inline: nothing was compiled, cold and warm are plain imports" in report.notes


def test_failed_build_maps_the_log(tmp_path, monkeypatch, fake_cuda):
    sub = rendered_file(tmp_path)
    log = f"{sub}:{line_of(sub, '__hadd')}:9: error: planted\n"  # a message about the submission itself
    fake, _ = fake_import([{"ok": False, "seconds": 30.0, "error_type": "RuntimeError",
                            "error": "Error building extension 'popkit_vectoradd_cuda_inline'"}], [log])
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(sub)
    assert (report.status, report.exit_code) == ("failed", ExitCode.COMPILE_FAILED)
    assert [(d.severity, d.line, d.column, d.message) for d in report.errors] == [
        ("error", line_of(sub, "__hadd"), 9, "planted")]


def test_import_error_outside_the_build_is_a_bad_submission(tmp_path, monkeypatch, fake_cuda):
    sub = tmp_path / "s.py"
    sub.write_text("import torch\n\nx = undefined_name\n\ndef custom_kernel(data):\n    return data\n")
    fake, _ = fake_import([{"ok": False, "seconds": 0.1, "error_type": "NameError",
                            "error": "name 'undefined_name' is not defined", "frames": [[str(sub), 3]]}])
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(sub)
    assert (report.status, report.exit_code) == ("bad-submission", ExitCode.BAD_SUBMISSION)
    [d] = report.errors
    assert (d.line, d.message, d.source_line) == (3, "NameError: name 'undefined_name' is not defined",
                                                  "x = undefined_name")


def test_undefined_symbol_on_load_points_at_the_declaration(tmp_path, monkeypatch, fake_cuda):
    sub = rendered_file(tmp_path)
    error = ("/b/popkit_vectoradd_cuda_inline.so: undefined symbol: _Z9vectoraddN2at6TensorES0_")
    fake, _ = fake_import([{"ok": False, "seconds": 50.0, "error_type": "ImportError", "error": error}])
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(sub)
    [d] = report.errors
    assert report.exit_code == ExitCode.COMPILE_FAILED and d.tool == "loader"
    assert d.line == line_of(sub, "torch::Tensor vectoradd(torch::Tensor a, torch::Tensor b, int64_t BLOCK, int64_t VEC) {")
    assert "declared but never defined" in d.hint


def test_stale_baton_lock_is_refused_before_building_and_clean_removes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools(lock_style="baton"))
    monkeypatch.setattr(compiler, "cuda_home_problem", lambda: None)
    sub = rendered_file(tmp_path)
    fake, calls = fake_import([{"ok": True, "seconds": 5.0, "has_custom_kernel": True}] * 2)
    monkeypatch.setattr(compiler, "_import", fake)
    key = compiler.build_key(sub.read_bytes(), cuda_tools(lock_style="baton"), "9.0a")
    lock = tmp_path / "home" / "build" / key / "popkit_vectoradd_cuda_inline" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    with pytest.raises(EnvironmentProblem) as info:
        compiler.compile_submission(sub)
    assert info.value.message == (f"{lock}: stale build lock, left by a build that was killed; torch would wait "
                                  "for it forever")
    assert info.value.hint == f"delete it (rm {lock}) or rerun with --clean"
    assert calls == []
    report = compiler.compile_submission(sub, clean=True)
    assert report.ok and not lock.exists()


def test_lock_states(tmp_path):
    import fcntl

    lock = tmp_path / "lock"
    lock.touch()
    assert lock_state(lock, "baton") == "stale"
    assert lock_state(lock, "flock") == "leftover"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert lock_state(lock, "flock") == "held"
    finally:
        os.close(fd)


def test_stale_lock_in_torchs_default_folder_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools(lock_style="baton"))
    monkeypatch.setattr(compiler, "cuda_home_problem", lambda: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lock = tmp_path / "cache" / "torch_extensions" / "py311_cu130" / "popkit_vectoradd_cuda_inline_v1" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    fake, _ = fake_import([{"ok": True, "seconds": 5.0, "has_custom_kernel": True}] * 2)
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(rendered_file(tmp_path))
    assert any(n.startswith(f"{lock} is a stale build lock: `popkit test`") for n in report.notes)


def test_environment_problems_exit_11(tmp_path, monkeypatch):
    sub = rendered_file(tmp_path)
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools(cuda=None))
    with pytest.raises(EnvironmentProblem) as info:
        compiler.compile_submission(sub)
    assert "CPU-only build" in info.value.message and info.value.exit_code == ExitCode.ENVIRONMENT
    monkeypatch.setattr(compiler, "toolchain", lambda python=None, timeout_s=30.0, scripts=None: cuda_tools())
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))
    result = CliRunner().invoke(app, ["compile", str(sub)])
    assert result.exit_code == 11
    assert f"error: CUDA_HOME is {tmp_path / 'nowhere'}, which has no bin/nvcc" in result.output


def test_syntax_error_exits_4_with_the_line(tmp_path):
    sub = tmp_path / "bad.py"
    sub.write_text("def custom_kernel(data):\n    return (\n")
    result = CliRunner().invoke(app, ["compile", str(sub)])
    assert result.exit_code == 4
    assert f"error: {sub}:2:12: syntax error: '(' was never closed" in result.output


# ------------------------------------------------------------------------------------ HIP, statically


@pytest.mark.parametrize("style", ["inline", "library"])
def test_rendered_hip_passes_the_static_checks(tmp_path, monkeypatch, style, fake_cuda):
    from popkit.toolchain import hipbuild

    monkeypatch.setattr(hipbuild, "find_tools", lambda: hipbuild.HipTools(None, "", None, None))  # no clang here
    sub = rendered_file(tmp_path, "softmax", "hip", style)
    result = CliRunner().invoke(app, ["compile", str(sub)])
    assert result.exit_code == 0, result.output
    assert "static checks passed" in result.output
    assert "The whole HIP build needs ROCm" in result.output


def test_hip_static_errors_exit_5_at_their_lines(tmp_path, fake_cuda):
    sub = tmp_path / "h.py"
    sub.write_text(textwrap.dedent('''\
        #!POPCORN leaderboard softmax
        import torch
        import os
        os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"
        SRC = r"""
        #include <cuda_fp16.h>
        __global__ void k(float* x) { x[0] = __shfl_xor_sync(0xffffffff, x[0], 1); }
        """
        from torch.utils.cpp_extension import load_inline
        m = load_inline(name="h", cpp_sources="", cuda_sources=SRC)

        def custom_kernel(data):
            return data
        '''))
    result = CliRunner().invoke(app, ["compile", str(sub), "--json"])
    assert result.exit_code == 5
    doc = json.loads(result.output)
    assert doc["schema"] == "popkit/compile/1" and doc["status"] == "static-only"
    where = [(d["severity"], d["line"]) for d in doc["diagnostics"]]
    assert where == [("error", 4), ("warning", 1), ("error", 10), ("error", 6), ("error", 7)]
    assert "after torch is imported on line 2" in doc["diagnostics"][0]["message"]


# ------------------------------------------------------------------------------------ real builds


def _real_build_env(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    if compiler.cuda_home_problem():  # e.g. an nvcc wrapper on PATH whose parent has no libcudart
        candidates = system.toolkit_candidates()
        if not candidates:
            pytest.skip("no usable CUDA toolkit")
        monkeypatch.setenv("CUDA_HOME", candidates[0])


@pytest.mark.nvcc
@pytest.mark.slow
def test_rendered_cuda_submission_compiles(tmp_path, monkeypatch):
    _real_build_env(monkeypatch)
    sub = rendered_file(tmp_path, "vectoradd", "cuda", "library")
    result = CliRunner().invoke(app, ["compile", str(sub)])
    assert result.exit_code == 0, result.output
    assert f"built {sub} (cuda with TORCH_CUDA_ARCH_LIST=9.0)" in result.output
    assert "cold build" in result.output and "warm import" in result.output


@pytest.mark.nvcc
@pytest.mark.slow
def test_planted_errors_point_at_the_submission_lines(tmp_path, monkeypatch):
    _real_build_env(monkeypatch)
    sub = rendered_file(tmp_path, "vectoradd", "cuda", "inline")
    sub.write_text(sub.read_text().replace("__hadd(a[i], b[i])", "__hadd(a[i], c[i])").replace(
        'functions=["vectoradd"]', 'functions=["vector_add"]'))
    nvcc_line, functions_line = line_of(sub, "c[i]"), line_of(sub, 'functions=["vector_add"]')
    result = CliRunner().invoke(app, ["compile", str(sub), "--json"])
    assert result.exit_code == 5, result.output
    errors = [d for d in json.loads(result.output)["diagnostics"] if d["severity"] == "error"]
    nvcc = [d for d in errors if d["tool"] == "nvcc"]
    host = [d for d in errors if d["tool"] == "gcc"]
    assert nvcc and nvcc[0]["line"] == nvcc_line and nvcc[0]["message"] == 'identifier "c" is undefined'
    assert nvcc[0]["column"] == sub.read_text().splitlines()[nvcc_line - 1].index("c[i]") + 1
    if host:  # ninja builds main.cpp beside cuda.cu; it reports the binding error unless it stopped first
        assert host[0]["line"] == functions_line


def test_compile_checks_the_tasks_own_entry_points(tmp_path, monkeypatch, fake_cuda):
    pair = Path(__file__).parent / "fixtures" / "tasks" / "pair"
    fake, _ = fake_import([{"ok": True, "seconds": 0.01, "has_custom_kernel": False}] * 2)
    monkeypatch.setattr(compiler, "_import", fake)
    report = compiler.compile_submission(pair / "template.py", task=str(pair))  # forward/backward, no custom_kernel
    assert report.ok and not report.diagnostics
    half = tmp_path / "half.py"
    half.write_text("def forward(x):\n    return 2 * x\n")
    with pytest.raises(SubmissionError, match="no `backward` defined"):
        compiler.compile_submission(half, task=str(pair))


@pytest.mark.slow
@pytest.mark.skipif(bool(__import__("popkit.run.sandbox").run.sandbox.unavailable()), reason="no sandbox here")
def test_compile_imports_the_submission_in_the_sandbox(tmp_path, monkeypatch):
    """`popkit compile` runs the submission's module code: it reached ~/.popcorn.yaml, a TCP listener and popkit's
    sandbox trial record. It now runs as every eval does: uid 65534, nothing of HOME, nothing outside written."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".popcorn.yaml").write_text("SECRET\n")
    planted = tmp_path / "planted.txt"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "popkit"))
    sub = tmp_path / "sub.py"
    sub.write_text("import os\nreached = []\n"
                   f"for p in ({str(home / '.popcorn.yaml')!r},):\n"
                   "    try:\n        open(p).read(); reached.append(p)\n    except OSError:\n        pass\n"
                   f"try:\n    open({str(planted)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
                   "print('reached:', reached or 'nothing', 'uid', os.getuid())\n"
                   "def custom_kernel(data):\n    return data\n")
    report = compiler.compile_submission(sub)
    assert report.status == "built", report.log
    assert "reached: nothing uid 65534" in report.log, report.log
    assert not planted.exists()
