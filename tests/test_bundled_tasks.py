"""The six bundled tasks and their example submissions.

CPU tests check task.yml against the protocol (docs/protocol-notes.md §1), the references (deterministic, never all-zero
inputs, checks that pass the right answer and reject a wrong one with a useful message) and the
PyTorch examples on every test case. `nvcc` tests build each CUDA example; `gpu` tests run them.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from popkit.machine import system
from popkit.resources import HARNESS_MODULES

ROOT = Path(__file__).resolve().parents[1]
TASKS_DIR = ROOT / "tasks"
SUBMISSIONS_DIR = ROOT / "submissions"
TASKS = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
HIP_TASKS = ("identity", "vectoradd", "softmax")
GPUS = ["H100", "A100", "L4", "T4", "B200", "MI300"]

# docs/protocol-notes.md §1: the runner rejects any other top-level key.
ALLOWED_KEYS = {
    "files", "lang", "description", "config", "templates", "tests", "benchmarks",
    "test_timeout", "benchmark_timeout", "ranked_timeout", "ranking_by", "multi_gpu", "seed", "gpus",
}
REQUIRED_KEYS = {"files", "lang", "description", "config"}
EXPECTED_FILES = {
    "submission.py": "@SUBMISSION@",
    "task.py": "task.py",
    "reference.py": "reference.py",
    "utils.py": "../utils.py",
    "eval.py": "../eval.py",
    **{name: f"../{name}" for name in HARNESS_MODULES},  # the harness's modules, beside its entry
}


def _task_yml(task: str) -> dict:
    return yaml.safe_load((TASKS_DIR / task / "task.yml").read_text(encoding="utf-8"))


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _reference(task: str):
    # reference.py imports `utils` flat, as in the eval's working directory.
    if str(TASKS_DIR) not in sys.path:
        sys.path.insert(0, str(TASKS_DIR))
    return _load_module(TASKS_DIR / task / "reference.py", f"popkit_bundled_reference_{task}")


@functools.cache
def _utils():
    """tasks/utils.py, loaded by path: a test must not depend on an earlier one having put tasks/ on sys.path."""
    return _load_module(TASKS_DIR / "utils.py", "popkit_bundled_utils")


@functools.cache
def _example(task: str, kind: str):
    return _load_module(SUBMISSIONS_DIR / task / f"{kind}.py", f"popkit_bundled_example_{task}_{kind}")


def _check_example(task: str, kind: str, case: dict) -> tuple[bool, str]:
    """Run submissions/<task>/<kind>.py on one case (on a copy of the input) and check it with the reference."""
    ref = _reference(task)
    data = ref.generate_input(**case)
    if kind == "cuda":
        assert _tensors(data)[0].is_cuda
    out = _example(task, kind).custom_kernel(_utils().clone_data(data))
    if kind == "cuda":
        torch.cuda.synchronize()
    return ref.check_implementation(data, out)


def _tensors(data) -> list[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, (tuple, list)):
        return [t for item in data for t in _tensors(item)]
    if isinstance(data, dict):
        return [t for item in data.values() for t in _tensors(item)]
    return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise-equal values, NaN equal to NaN (identity's output buffer is NaN-filled)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def _cases(kind: str) -> list:
    return [pytest.param(task, case, id=f"{task}-{'-'.join(str(v) for k, v in case.items() if k != 'seed')}")
            for task in TASKS for case in _task_yml(task)[kind]]


def _example_files() -> list[Path]:
    return sorted(p for p in SUBMISSIONS_DIR.glob("*/*.py") if p.parent.name not in ("wrong", "cheats"))


# ----------------------------------------------------------------------------------------- task.yml


@pytest.mark.parametrize("task", TASKS)
def test_task_yml_keys_follow_the_protocol(task):
    raw = _task_yml(task)
    assert set(raw) <= ALLOWED_KEYS, f"unknown keys: {set(raw) - ALLOWED_KEYS}"
    assert REQUIRED_KEYS <= set(raw)
    assert raw["lang"] == "py"
    assert raw["config"] == {"main": "eval.py"}
    assert {f["name"]: f["source"] for f in raw["files"]} == EXPECTED_FILES
    assert raw["ranking_by"] == ("last" if task == "identity" else "geom")
    assert raw["gpus"] == GPUS
    assert isinstance(raw["seed"], int)
    for key in ("test_timeout", "benchmark_timeout", "ranked_timeout"):
        assert isinstance(raw[key], int) and 60 <= raw[key] <= 600, key
    description = raw["description"]
    assert len(description) > 300 and "Check:" in description and "Output:" in description


@pytest.mark.parametrize("task", TASKS)
def test_task_files_and_templates_exist(task):
    raw = _task_yml(task)
    for entry in raw["files"]:
        if entry["source"] != "@SUBMISSION@":
            assert (TASKS_DIR / task / entry["source"]).is_file(), entry["source"]
    expected = {"Python": "pytorch.py", "CUDA": "cuda.py"} | ({"HIP": "hip.py"} if task in HIP_TASKS else {})
    assert raw["templates"] == {lang: f"../../submissions/{task}/{name}" for lang, name in expected.items()}
    for rel in raw["templates"].values():
        assert (TASKS_DIR / task / rel).resolve().is_file(), rel


@pytest.mark.parametrize("task", TASKS)
def test_cases_match_generate_input_and_have_seeds(task):
    raw = _task_yml(task)
    params = set(inspect.signature(_reference(task).generate_input).parameters)
    assert len(raw["tests"]) >= 5 and len(raw["benchmarks"]) >= 4
    for kind in ("tests", "benchmarks"):
        seeds = [case["seed"] for case in raw[kind]]
        assert len(set(seeds)) == len(seeds), f"{kind}: repeated seeds"
        for case in raw[kind]:
            assert set(case) == params, case
            assert all(isinstance(v, int) and v > 0 for v in case.values()), case


@pytest.mark.parametrize("task", TASKS)
def test_task_loads_with_popkit(task):
    from popkit.model.tasks import load_task

    loaded = load_task(TASKS_DIR / task)
    assert loaded.main == "eval.py" and loaded.submission_name == "submission.py"
    expected = loaded.benchmarks[-1:] if task == "identity" else loaded.benchmarks
    assert loaded.cases_for("leaderboard") == list(expected)


def test_problem_set_lists_every_task():
    from popkit.model.tasks import load_problem_set

    raw = yaml.safe_load((TASKS_DIR / "problems.yaml").read_text(encoding="utf-8"))
    assert raw["name"] == "popkit" and raw["description"] and raw["deadline"]
    pset = load_problem_set(TASKS_DIR / "problems.yaml")
    assert [(p.directory, p.name) for p in pset.problems] == [(t, t) for t in TASKS]
    for problem in pset.problems:
        assert list(problem.gpus) == GPUS and problem.deadline
        assert (pset.task_dir(problem) / "task.yml").is_file()


# ---------------------------------------------------------------------------------------- references


@pytest.mark.parametrize("task", TASKS)
def test_generate_input_is_deterministic_per_seed(task):
    ref = _reference(task)
    case = dict(_task_yml(task)["tests"][3])
    first, second = _tensors(ref.generate_input(**case)), _tensors(ref.generate_input(**case))
    assert first and len(first) == len(second)
    assert all(_same(a, b) for a, b in zip(first, second))
    other = _tensors(ref.generate_input(**(case | {"seed": case["seed"] + 1})))
    assert not _same(first[0], other[0]), "a different seed must give different data"


@pytest.mark.parametrize("task, case", _cases("tests"))
def test_generated_inputs_are_never_all_zero(task, case):
    for tensor in _tensors(_reference(task).generate_input(**case)):
        assert bool((tensor != 0).any()), f"an all-zero input tensor for {case}"


@pytest.mark.parametrize("task, case", _cases("tests"))
def test_torch_example_passes_every_test_case(task, case):
    ok, message = _check_example(task, "pytorch", case)
    assert ok, message


def _perturbed(task: str, data, expected: torch.Tensor) -> torch.Tensor:
    """The right answer with one element clearly wrong."""
    wrong = expected.clone()
    flat = wrong.view(-1)
    if task == "vectorsum":
        flat[0] += 1e-3 * float(data.double().abs().sum()) + 1.0
    elif task == "softmax":
        flat[-1] *= 1.01
    else:
        flat[-1] += 1.0
    return wrong


@pytest.mark.parametrize("task", TASKS)
def test_wrong_output_fails_with_a_useful_message(task):
    utils = _utils()
    ref = _reference(task)
    case = _task_yml(task)["tests"][3]
    data = ref.generate_input(**case)
    expected = ref.ref_kernel(utils.clone_data(data))
    assert ref.check_implementation(data, expected) == (True, "")

    ok, message = ref.check_implementation(data, _perturbed(task, data, expected))
    assert not ok
    assert re.search(r"1 of \d+ elements mismatch", message), message
    assert "expected" in message and "got" in message

    ok, message = ref.check_implementation(data, expected.to(torch.float64))
    assert not ok and "dtype mismatch" in message
    ok, message = ref.check_implementation(data, expected.reshape(1, *expected.shape))
    assert not ok and "shape mismatch" in message


def test_identity_untouched_output_buffer_fails():
    ref = _reference("identity")
    data = ref.generate_input(size=127, seed=1)
    ok, message = ref.check_implementation(data, data[1])
    assert not ok and "127 of 127 elements mismatch" in message and "got nan" in message


def test_softmax_without_max_subtraction_fails():
    ref = _reference("softmax")
    x = ref.generate_input(rows=64, cols=4096, seed=7)
    naive = torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)
    assert not ref.check_implementation(x, naive)[0]
    assert not ref.check_implementation(x, torch.full_like(x, 1 / 4096))[0]


def test_vectorsum_single_float32_accumulator_fails_at_benchmark_size():
    np = pytest.importorskip("numpy")
    ref = _reference("vectorsum")
    x = ref.generate_input(size=16_777_216, seed=3)
    serial = torch.tensor(np.cumsum(x.cpu().numpy(), dtype=np.float32)[-1], device=x.device)
    assert not ref.check_implementation(x, serial)[0]
    assert ref.check_implementation(x, x.sum())[0]


@pytest.mark.slow
def test_matmul_float16_accumulation_fails_for_large_k():
    ref = _reference("matmul")
    a, b = ref.generate_input(m=256, n=256, k=8192, seed=5)
    acc = torch.zeros(256, 256, dtype=torch.float16, device=a.device)
    for start in range(0, 8192, 16):  # a float16 running sum, rounded once per 16-wide k step
        acc = acc + (a[:, start:start + 16].float() @ b[start:start + 16].float()).half()
    assert not ref.check_implementation((a, b), acc)[0]
    assert ref.check_implementation((a, b), a @ b)[0]


# ---------------------------------------------------------------------------------- example files


def test_every_task_has_its_examples():
    for task in TASKS:
        kinds = ("pytorch", "cuda") + (("hip",) if task in HIP_TASKS else ())
        for kind in kinds:
            assert (SUBMISSIONS_DIR / task / f"{kind}.py").is_file(), f"{task}/{kind}.py"


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_never_contain_the_refused_word(path):
    # The server refuses any file containing this substring, in any case, comments included.
    assert "stream" not in path.read_text(encoding="utf-8").lower()


@pytest.mark.parametrize("path", _example_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_examples_carry_server_directives_and_pass_popkit_check(path):
    from popkit.check.lint import check_file
    from popkit.model.directives import server_directives

    directives = server_directives(path.read_text(encoding="utf-8"))
    assert not directives.problems
    assert directives.leaderboard == path.parent.name
    assert directives.gpu == ("MI300" if path.name == "hip.py" else "H100")
    report = check_file(path, guard=False)
    assert report.ok, [f.message for f in report.errors]


@pytest.mark.parametrize("task", HIP_TASKS)
def test_hip_examples_are_hip_only(task):
    path = SUBMISSIONS_DIR / task / "hip.py"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    lines = text.splitlines()
    torch_import = next(i for i, line in enumerate(lines) if line.startswith("import torch"))
    env_lines = [i for i, line in enumerate(lines) if line.startswith("os.environ[")]
    assert env_lines and max(env_lines) < torch_import, "set the environment before importing torch"
    assert 'os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"' in text and 'os.environ["CXX"] = "clang++"' in text
    load_calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "load_inline"]
    assert len(load_calls) == 1
    flags = next(k.value for k in load_calls[0].keywords if k.arg == "extra_cuda_cflags")
    assert {"--offload-arch=gfx942", "-std=c++20"} <= {ast.literal_eval(e) for e in flags.elts}
    assert "hip/hip_runtime.h" in text
    for cuda_only in ("cuda_runtime", "c10/cuda", "C10_CUDA", "cudaGetLastError", "_sync(", "cp.async", "<mma.h>"):
        assert cuda_only not in text, cuda_only


# --------------------------------------------------------------------------------------- CUDA builds


def _build_env() -> dict:
    env = dict(os.environ)
    env.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # one architecture keeps the build short
    if "CUDA_HOME" not in env and system.toolkit_candidates():
        # torch guesses CUDA_HOME from nvcc's directory, which is wrong for wrapper scripts.
        env["CUDA_HOME"] = system.toolkit_candidates()[0]
    return env


@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_cuda_example_compiles(task, tmp_path):
    path = SUBMISSIONS_DIR / task / "cuda.py"
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('example', {str(path)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "assert callable(module.custom_kernel)\n"
    )
    # A private build folder: a build of the same extension name elsewhere on the machine cannot collide.
    env = {**_build_env(), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


# ----------------------------------------------------------------------------------------- GPU runs


@pytest.mark.gpu
@pytest.mark.parametrize("task, case", _cases("tests"))
def test_cuda_example_passes_every_test_case(task, case):
    ok, message = _check_example(task, "cuda", case)
    assert ok, message


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("task, case", _cases("benchmarks"))
def test_cuda_example_passes_every_benchmark_case(task, case):
    ok, message = _check_example(task, "cuda", case)
    assert ok, message
