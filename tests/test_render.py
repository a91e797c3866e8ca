"""popkit new / templates: KernelSpec validation, golden renderings, directives, and the rendered kernels.

Golden files live in tests/golden/<target>/<style>/<task>.py; regenerate them with
POPKIT_UPDATE_GOLDEN=1 pytest tests/test_render.py and review the diff.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from popkit.author import render
from popkit.author.kernelspec import TUNABLE, TUNE_IF
from popkit.cli import app
from popkit.errors import ExitCode, PopkitError, TaskError, UsageError
from popkit.model import tunespec
from popkit.model.directives import server_directives
from popkit.resources import data_dir
from popkit.toolchain.hipcheck import hip_checks

GOLDEN = Path(__file__).parent / "golden"
BUNDLED = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
UPDATE = bool(os.environ.get("POPKIT_UPDATE_GOLDEN"))
TEMPLATES = [(t, s) for t, styles in render.template_names() for s in styles]
SKELETON_TASK_PY = '''from typing import TypeVar
import torch
input_t = TypeVar("input_t", bound=tuple[torch.Tensor, torch.Tensor, int])
output_t = TypeVar("output_t", bound=torch.Tensor)
'''


@pytest.fixture(autouse=True)
def _plain_output(monkeypatch):
    monkeypatch.setenv("POPKIT_WIDTH", "200")
    monkeypatch.setenv("NO_COLOR", "1")


def task_dir(name: str) -> Path:
    return data_dir("tasks") / name


@pytest.fixture
def skeleton_task(tmp_path) -> Path:
    d = tmp_path / "mystery"
    d.mkdir()
    (d / "task.py").write_text(SKELETON_TASK_PY)
    return d


def rendered(task: str | Path, target: str, style: str, **kw) -> render.Rendered:
    path = Path(task) if isinstance(task, Path) else task_dir(task)
    return render.render(path, leaderboard=path.name, target=target, style=style, **kw)


# ------------------------------------------------------------------------------------ golden files


@pytest.mark.parametrize("target,style", TEMPLATES)
@pytest.mark.parametrize("task", BUNDLED + ("_skeleton",))
def test_golden(task, target, style, skeleton_task):
    out = rendered(skeleton_task if task == "_skeleton" else task, target, style)
    golden = GOLDEN / target / style / f"{task}.py"
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(out.text)
    assert golden.is_file(), f"no golden file for template {target}/{style} on {task}: run with POPKIT_UPDATE_GOLDEN=1"
    assert out.text == golden.read_text(), f"{golden} differs: review, then POPKIT_UPDATE_GOLDEN=1"


def test_every_template_has_golden_files_and_no_golden_is_orphaned():
    templates = {f"{t}/{s}" for t, s in TEMPLATES}
    on_disk = {f"{p.parent.name}/{p.name[: -len('.py.j2')]}" for p in data_dir("templates").glob("*/*.py.j2")
               if p.parent.name != "common"}  # common/ holds the partials the templates include
    assert templates == on_disk, "a template's target is not in TARGETS"
    for key in templates:
        for task in BUNDLED + ("_skeleton",):
            assert (GOLDEN / key / f"{task}.py").is_file(), f"template {key} has no golden file for {task}"
    for golden in GOLDEN.glob("*/*/*.py"):
        assert f"{golden.parent.parent.name}/{golden.parent.name}" in templates, f"{golden}: no such template"
        assert golden.stem in BUNDLED + ("_skeleton",), f"{golden}: no such bundled task"


def test_every_bundled_task_has_a_valid_spec():
    for task in BUNDLED:
        spec = render.load_spec(task_dir(task) / "kernel.yml")
        assert spec.function == task and not spec.skeleton


# ------------------------------------------------------------------------------ rendered contents


def test_no_template_contains_the_refused_word():
    for path in data_dir("templates").rglob("*"):
        if path.is_file():
            assert "stream" not in path.read_text().lower(), path


@pytest.mark.parametrize("target,style", TEMPLATES)
@pytest.mark.parametrize("task", BUNDLED)
def test_rendered_submission_is_well_formed(task, target, style):
    out = rendered(task, target, style)
    text = out.text
    assert "stream" not in text.lower()
    tree = ast.parse(text)
    directives = server_directives(text)
    assert (directives.leaderboard, directives.gpu, directives.problems) == (task, out.gpu, ())
    assert out.gpu == ("H100" if target == "cuda" else "MI300")
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "custom_kernel" in top
    calls = [n for n in tree.body if isinstance(n, (ast.Assign, ast.Expr)) and isinstance(n.value, ast.Call)
             and getattr(n.value.func, "id", "") == "load_inline"]
    assert len(calls) == 1, "the extension is built once, at module level"
    launches = re.findall(r"<<<([^>]*)>>>", text)
    kind = render.load_spec(task_dir(task) / "kernel.yml").geometry.kind
    if target == "cuda" and kind == "matmul":  # float16 operands: the tensor-core kernel, dynamic shared memory
        assert launches == ["grid, block, pk_bytes"]
    elif target == "cuda" and kind == "row_reduction":  # rows staged in shared memory when they fit, else 3 passes
        assert launches == ["grid, block, pk_bytes", "grid, block"]
    else:
        assert launches == ["grid, block"]
    assert text.count("GetLastError()") == len(launches), "every launch is checked"
    if style == "library":
        assert "TORCH_LIBRARY(popkit_" in text and "TORCH_LIBRARY_IMPL(popkit_" in text
        assert "torch.library.register_fake" in text and "is_python_module=False" in text
    else:
        assert f'functions=["{task}"]' in text
    if target == "hip":
        assert [d for d in hip_checks(text, "x.py") if d.severity != "note"] == []
        assert text.index('os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"') < text.index("import torch")
        assert '"--offload-arch=gfx942", "-std=c++20"' in text
        assert "<cuda" not in text and "cudaGetLastError" not in text
    else:
        assert "hip" not in text.lower()


@pytest.mark.parametrize("target,style", TEMPLATES)
@pytest.mark.parametrize("task", BUNDLED)
def test_rendered_geometry_is_tunable_and_every_grid_point_is_compiled(task, target, style):
    """`#!POPKIT tune` lines for the geometry's parameters, a default inside the grid, one dispatch line per
    point, and variants that differ in their assignments only: the source load_inline builds is the same."""
    out = rendered(task, target, style)
    spec = tunespec.parse(out.text, "t.py")
    kind = render.tuning_key(render.load_spec(task_dir(task) / "kernel.yml"), target)
    assert [(p.name, p.values) for p in spec.parameters] == [(t.name, t.values) for t in TUNABLE[kind]]
    assert [c.text for c in spec.constraints] == ([TUNE_IF[kind]] if kind in TUNE_IF else [])
    points = list(spec.points())
    assert spec.default in points and len(points) >= 10
    dispatch = re.findall(r"^    if \((.*)\) \{ \*err = \w+_launch<(.*)>\(", out.text, re.M)
    assert dispatch == [(" && ".join(f"{k} == {v}" for k, v in p.items()), ", ".join(map(str, p.values())))
                        for p in points]
    assert f"template <{', '.join(f'int {n}' for n in spec.names)}>" in out.text  # real template parameters
    for point in (points[0], points[-1]):
        text = tunespec.variant_text(out.text, spec, point)
        changed = [b for a, b in zip(out.text.splitlines(), text.splitlines()) if a != b]
        assert [line.split(" = ")[0] for line in changed] == [n for n in spec.names if point[n] != spec.default[n]]
    assert tunespec.read_time_uses(out.text, spec.names) == {}  # read at call time: a per-shape file may set them


def test_hip_arch_and_gpu_choice():
    out = rendered("softmax", "hip", "inline", arch="gfx950", gpu="MI355X")
    assert '"PYTORCH_ROCM_ARCH"] = "gfx950"' in out.text and "--offload-arch=gfx950" in out.text
    assert server_directives(out.text).gpu == "MI355X"
    assert rendered("softmax", "hip", "inline", gpu="MI355X").arch == "gfx950"  # from the GPU
    assert rendered("softmax", "cuda", "inline", gpus=("MI300", "A100")).gpu == "A100"  # the task's first NVIDIA GPU


@pytest.mark.parametrize("kwargs,message", [
    ({"target": "cuda", "arch": "gfx942"}, "--arch applies to --target hip"),
    ({"target": "hip", "arch": "sm_90"}, "--arch 'sm_90' is not an AMD architecture"),
    ({"target": "cuda", "gpu": "MI300"}, "--gpu MI300 does not run CUDA code"),
    ({"target": "cuda", "gpu": "L4", "gpus": ("H100",)}, "--gpu L4 is not one of this leaderboard's GPUs (H100)"),
    ({"target": "metal"}, "unknown target `metal`"),
    ({"target": "cuda", "style": "fancy"}, "unknown style `fancy` for target cuda"),
])
def test_render_refuses_bad_options(kwargs, message):
    kwargs.setdefault("style", "inline")
    with pytest.raises(UsageError) as info:
        render.render(task_dir("vectoradd"), leaderboard="vectoradd", **kwargs)
    assert info.value.message == message


def test_skeleton_unpacks_what_task_py_says(skeleton_task):
    out = rendered(skeleton_task, "cuda", "inline")
    assert out.skeleton and "in0, in1, in2 = data" in out.text
    assert "return _module.mystery(in0, in1, in2, BLOCK, VEC)" in out.text
    assert "int64_t in2" in out.text  # the int in the tuple is passed to the kernel
    assert "# Fill in:" in out.text and "TODO" not in out.text


@pytest.mark.parametrize("source,unpack", [
    ("import torch\ninput_t = torch.Tensor\n", "x = data"),
    ("from typing import Tuple\nimport torch\ninput_t = Tuple[torch.Tensor, float]\n", "in0, in1 = data"),
    ("import torch\nclass input_t(dict):\n    pass\n", "x = data"),
    ("this is not python", "x = data"),
])
def test_skeleton_layouts(tmp_path, source, unpack):
    (tmp_path / "task.py").write_text(source)
    out = render.render(tmp_path, leaderboard="t", target="cuda", style="inline")
    assert unpack in out.text
    ast.parse(out.text)


# ------------------------------------------------------------------------------ spec validation


def _spec_error(tmp_path, spec: dict) -> str:
    d = tmp_path / "demo"
    d.mkdir(exist_ok=True)
    (d / "kernel.yml").write_text(yaml.safe_dump(spec))
    with pytest.raises(TaskError) as info:
        render.load_spec(d / "kernel.yml")
    assert info.value.exit_code == ExitCode.BAD_TASK
    assert info.value.hint == f"in {d / 'kernel.yml'}"
    return info.value.message


GOOD = {"function": "demo", "data": "tuple", "inputs": [{"name": "a", "dtype": "float32"}],
        "output": {"name": "out", "dtype": "float32", "like": "a"},
        "geometry": {"kind": "elementwise_flat"}, "body": "out[i] = a[i];"}


@pytest.mark.parametrize("change,message", [
    ({"inputs": [{"name": "a", "dtype": "half"}]},
     "key `inputs[0].dtype` must be one of float32, float16, bfloat16, float64, int32, int64, uint8, bool, int, "
     "float, object (got str 'half')"),
    ({"inputs": [{"name": "n", "dtype": "float32"}]}, "key `inputs[0].name` `n` is reserved (the templates use it); "
                                                      "choose another name"),
    ({"inputs": [{"name": "a", "dtype": "float32"}, {"name": "a", "dtype": "float32"}]},
     "key `inputs[1].name` `a` is already used by another input, scalar or reduction"),
    ({"geometry": {"kind": "stencil"}}, "key `geometry.kind` must be one of elementwise_flat, elementwise_2d, "
                                        "row_reduction, full_reduction, matmul (got str 'stencil')"),
    ({"output": {"name": "out", "dtype": "float32"}},
     "key `output` needs exactly one of `like`, `reduce`, `shape`, `reuse` (got none)"),
    ({"output": {"name": "out", "dtype": "float32", "like": "b"}},
     "key `output.like` must be the name of a tensor input (a) (got str 'b')"),
    ({"output": {"name": "out", "dtype": "float32", "shape": ["a.x"]}},
     "key `output.shape[0]` must be INPUT.DIM with a tensor input's name, e.g. a.0 (got str 'a.x')"),
    ({"geometry": {"kind": "full_reduction"}, "body": None},
     "key `reductions` must be exactly one reduction for `full_reduction` (blocks cannot wait for each other "
     "between two) (got nothing)"),
    ({"body": None}, "key `body` must be C++ statements that write the output (got nothing)"),
    ({"colour": "red"}, "key `colour` is unknown (known: body, data, finish, function, geometry, inputs, output, "
                        "reductions, scalars)"),
    ({"geometry": {"kind": "elementwise_flat", "block": 100}},
     "key `geometry.block` must be a power of two from 64 to 1024 (got int 100)"),
])
def test_spec_validation_names_file_and_key(tmp_path, change, message):
    spec = {**GOOD, **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    assert _spec_error(tmp_path, spec) == f"demo/kernel.yml: {message}"


def test_spec_invalid_yaml(tmp_path):
    d = tmp_path / "demo"
    d.mkdir()
    (d / "kernel.yml").write_text("inputs: [a\n")
    with pytest.raises(TaskError) as info:
        render.load_spec(d / "kernel.yml")
    assert info.value.message.startswith("demo/kernel.yml: line 2: invalid YAML")


def test_refused_word_in_a_spec_body_is_an_error(tmp_path):
    d = tmp_path / "demo"
    d.mkdir()
    (d / "kernel.yml").write_text(yaml.safe_dump({**GOOD, "body": "out[i] = a[i];  // " + "str" + "eaming"}))
    with pytest.raises(TaskError) as info:
        render.render(d, leaderboard="demo", target="cuda", style="inline")
    assert "the rendered file would contain" in info.value.message


def test_missing_template_variable_names_template_and_variable(tmp_path):
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "broken.py.j2").write_text("x = {{ nothing_here }}\n")
    with pytest.raises(PopkitError) as info:
        render.render_template("cuda/broken.py.j2", {}, root=tmp_path)
    assert info.value.message == "template cuda/broken.py.j2: undefined variable `nothing_here`"
    assert info.value.exit_code == ExitCode.INTERNAL


# ------------------------------------------------------------------------------------ the commands


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_new_writes_refuses_to_overwrite_and_forces(tmp_path):
    out = tmp_path / "va.py"
    result = invoke("new", "--task", "vectoradd", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    assert f"popkit test {out}" in result.output
    assert out.read_text().startswith("#!POPCORN leaderboard vectoradd\n")
    again = invoke("new", "--task", "vectoradd", "-o", str(out))
    assert again.exit_code == 2
    assert f"error: {out} already exists; not overwriting it" in again.output
    assert "pass --force" in again.output
    forced = invoke("new", "--task", "vectoradd", "-o", str(out), "--force", "--style", "library")
    assert forced.exit_code == 0 and "replaced the existing file" in forced.output
    assert "TORCH_LIBRARY(popkit_vectoradd" in out.read_text()


def test_new_json_and_hip(tmp_path):
    import json

    out = tmp_path / "sm.py"
    result = invoke("new", "--task", "softmax", "--target", "hip", "--arch", "gfx950", "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "popkit/new/1"
    assert (doc["target"], doc["arch"], doc["skeleton"], doc["next"]) == ("hip", "gfx950", False, f"popkit test {out}")


def test_new_errors(tmp_path):
    result = invoke("new", "--task", "vectoradd", "--target", "cuda", "--arch", "gfx950", "-o", str(tmp_path / "a.py"))
    assert result.exit_code == 2 and "--arch applies to --target hip" in result.output
    result = invoke("new", "--task", "vectoradd", "-o", str(tmp_path / "a.cu"))
    assert result.exit_code == 2 and "a rendered submission is Python" in result.output
    result = invoke("new", "--task", "no-such-task", "-o", str(tmp_path / "a.py"))
    assert result.exit_code == 3 and "no task named `no-such-task`" in result.output


def test_templates_lists_targets_styles_and_specs():
    import json

    result = invoke("templates")
    assert result.exit_code == 0, result.output
    assert "cuda: inline, library" in result.output and "hip: inline, library" in result.output
    for task in BUNDLED:
        assert re.search(rf"^{task}\s+{task}\s+kernel.yml", result.output, re.M), task
    doc = json.loads(invoke("templates", "--json").output)
    assert doc["schema"] == "popkit/templates/1"
    assert doc["targets"] == {"cuda": ["inline", "library"], "hip": ["inline", "library"]}
    geometry = {t["task"]: t["geometry"] for t in doc["tasks"]}
    assert geometry["matmul"] == "matmul" and geometry["softmax"] == "row_reduction"


# ---------------------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("style", ["inline", "library"])
@pytest.mark.parametrize("task", BUNDLED)
def test_rendered_cuda_submission_passes_the_task(tmp_path, task, style):
    """What `popkit test` does, on each rendered submission, unchanged."""
    from popkit.model import tasks
    from popkit.run import runner

    found = tasks.load_task(task_dir(task), leaderboard=task)
    out = render.write(render.render(found.path, leaderboard=task, target="cuda", style=style),
                       tmp_path / f"{task}_{style}.py")
    report = runner.run_submission(found, out.path, "test")
    assert report.exit_code == 0, report.to_json()
