"""`popkit compile`: build a submission's load_inline extension without running any kernel.

The submission is imported in a fresh interpreter (a child process with a timeout), which runs its
module-level build; custom_kernel is never called, so a machine without a GPU will do (a CUDA build
of torch and nvcc are enough). The build lives in `<popkit home>/build/<key>/`, keyed by the
source and the toolchain, and the child imports twice: cold (fresh directory) and warm (what every
later eval process pays). Compiler messages are mapped to lines of the submission (diagnostics.py).
HIP on a machine without ROCm gets static checks (hipcheck.py) and, where clang's AMDGPU backend is
installed, a real device build of its DEVICE_SRC kernels with their register use (hipbuild.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import stat
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from popkit.machine import nvml
from popkit.machine import system
from popkit.machine.cputorch import CANNOT_BUILD, SECOND_VENV
from popkit.model import tasks
from popkit.model.contract import entry_points
from popkit.run import runner
from popkit.run import sandbox
from popkit.run.executor import Workspace
from popkit.submission.source import read_submission, task_spec_for, validate_submission
from popkit.toolchain import hipbuild
from popkit.toolchain.arch import ArchChoice, choose_arch, supported_archs
from popkit.toolchain.locks import check_locks, find_locks
from popkit.model.diagnostics import (
    Diagnostic, SourceMap, loader_diagnostic, map_diagnostics, missing_module_hint, parse_log, task_imports,
    torch_error,
)
from popkit.errors import EnvironmentProblem, ExitCode, PopkitError, UsageError
from popkit.model.directives import server_directives
from popkit.resources import popkit_home
from popkit.toolchain.hipcheck import detect_target, hip_checks
from popkit.machine.system import (  # noqa: F401  (cuda_home_problem and toolchain are patched in tests)
    Toolchain, cuda_home_problem, default_extensions_root, toolchain, toolkit_for_builds,
)
from popkit.progress import Progress, timed

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_TEST_TIMEOUT_S = 180.0  # the protocol's default when no task is known
PRECOMPILE_TIMEOUT_S = 120.0  # the runner's compile pre-step (docs/protocol-notes.md §2)
BUILD_SHARE_WARNING = 0.5  # warn when the cold build takes this share of test_timeout
RECORD = "popkit-build.json"



@dataclass(frozen=True)
class CompileReport:
    """The outcome of one `popkit compile`. Times are seconds."""

    submission: str
    target: str  # cuda or hip
    status: str  # built, failed, bad-submission, static-only
    exit_code: int
    cold_s: float | None = None  # importing the submission in a fresh build directory (the build)
    warm_s: float | None = None  # importing it again: what each later eval process pays
    torch_import_s: float | None = None  # importing torch, excluded from cold_s and warm_s
    cached: bool = False  # cold_s is from an earlier popkit compile of the same source
    build_dir: str = ""
    arch_list: str | None = None  # TORCH_CUDA_ARCH_LIST the build used
    extensions: tuple[str, ...] = ()
    task: str | None = None
    test_timeout_s: float | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    notes: tuple[str, ...] = ()
    log: str = ""  # the build's whole output
    arch: str | None = None  # the AMD architecture of a HIP device build
    compiler: str | None = None  # the compiler of a HIP device build (its --version line)
    kernels: tuple[Mapping[str, Any], ...] = ()  # per kernel of a HIP device build: hipbuild.KernelUsage

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["diagnostics"] = [d.to_json() for d in self.diagnostics]
        data["extensions"], data["notes"] = list(self.extensions), list(self.notes)
        data["kernels"] = [dict(k) for k in self.kernels]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CompileReport":
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kwargs["diagnostics"] = tuple(Diagnostic.from_json(d) for d in data.get("diagnostics", ()))
        kwargs["extensions"] = tuple(data.get("extensions", ()))
        kwargs["notes"] = tuple(data.get("notes", ()))
        kwargs["kernels"] = tuple(data.get("kernels", ()))
        return cls(**kwargs)


# The child: import the submission as a module (so a __main__ block does not run), never call
# custom_kernel, and write the outcome to a file (stdout belongs to the build's own output).
DRIVER_NAME = "popkit_compile_driver.py"
_DRIVER = r"""
import importlib.util, json, os, sys, time, traceback
path, result_path, pre_import = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
sys.path.insert(0, os.getcwd())
result = {"ok": False, "torch_import_s": None}
if pre_import:
    t0 = time.perf_counter()
    import torch, torch.utils.cpp_extension  # noqa: F401
    result["torch_import_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
try:
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    result.update(ok=True, has_custom_kernel=callable(getattr(module, "custom_kernel", None)))
except BaseException as exc:
    frames = [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    result.update(error_type=type(exc).__name__, error=str(exc), frames=frames,
                  traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
result["seconds"] = time.perf_counter() - t0
sys.stdout.flush()
sys.stderr.flush()
with open(result_path, "w") as fh:
    json.dump(result, fh)
"""


def build_key(source: bytes, tools: Toolchain, arch_list: str | None) -> str:
    """Builds are keyed by the source and everything that changes the compiled result."""
    h = hashlib.sha256(source)
    for part in (tools.python, tools.torch, tools.cuda, tools.hip, arch_list, os.environ.get("CXX"),
                 os.environ.get("PYTORCH_ROCM_ARCH")):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:16]


# -------------------------------------------------------------------------------------- compiling


def compile_submission(path: Path | str, *, task: str | None = None, roots: Sequence[Path] = (),
                       clean: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S, python: str = sys.executable,
                       progress: Progress | None = None, arch: str | None = None) -> CompileReport:
    """Build the submission's extension cold and warm and report diagnostics (see the module doc)."""
    say = progress or (lambda _msg: None)
    path = Path(path)
    if path.suffix != ".py":
        raise UsageError(f"{path}: popkit compile builds Python submissions (load_inline in a .py file)",
                         "a .cu/.cpp file is compiled by the task's own eval, not by popkit")
    source = read_submission(path, None)  # missing file, not UTF-8, syntax error: SubmissionError (exit 4)
    text = source.decode("utf-8")
    smap = SourceMap(path, text)
    target = detect_target(text)
    found_task, notes = _find_task(path, source, task, roots)
    if found_task is None:
        _require_task_for_imports(path, text)
    names = entry_points(found_task) if found_task else ("custom_kernel",)
    validate_submission(path, source, names)  # the names the task's eval takes (exit 4)
    test_timeout = found_task.test_timeout if found_task else DEFAULT_TEST_TIMEOUT_S
    static = hip_checks(text, str(path)) if target == "hip" else []
    base = dict(submission=str(path), target=target, extensions=tuple(smap.extension_names()),
                task=found_task.name if found_task else None, test_timeout_s=test_timeout)

    tools = toolchain(python, scripts=sandbox.scripts_for())  # the interpreter starts as an eval's does
    if target == "hip" and not tools.hip:
        return _hip_device_build(text, str(path), arch, static, notes, tools, say, base)
    toolkit, said = toolkit_for_builds(cuda_home_problem()) if tools.cuda else (None, "")
    if said:
        notes.append(said)
    _require_toolchain(tools, python, toolkit is not None)
    choice = _arch_choice(text, found_task, tools)
    arch_list = choice.arch_list if choice else None
    if choice:
        notes.append(choice.note)
    build_dir = popkit_home() / "build" / build_key(source, tools, arch_list)
    if clean and build_dir.exists():
        shutil.rmtree(build_dir)
    notes += check_locks(build_dir, default_extensions_root(tools), smap.extension_names(), tools.lock_style, clean)
    build_dir.mkdir(parents=True, exist_ok=True)
    base.update(build_dir=str(build_dir), arch_list=arch_list)

    record = _read_record(build_dir)
    # the build's caches all in its own folder, keyed by its source and toolchain (nothing shared with other runs)
    env = {"TORCH_EXTENSIONS_DIR": str(build_dir), "TRITON_CACHE_DIR": str(build_dir / "triton"),
           "CUDA_CACHE_PATH": str(build_dir / "nv"), "PYTHONUNBUFFERED": "1"}
    if arch_list and not tools.hip:
        env["TORCH_CUDA_ARCH_LIST"] = arch_list
    if toolkit:
        env["CUDA_HOME"] = toolkit
    executor = sandbox.executor_for()  # the submission's import runs its code: in the sandbox, as every eval
    with executor.workspace("popkit-compile-") as ws:  # removed by its guard even if popkit is killed
        ws.private_cache = False  # the build goes to build_dir, as the report says
        name = _prepare(ws, found_task, source)
        cached = record is not None
        if cached:
            cold, log = {"ok": True, "seconds": record["cold_s"], "torch_import_s": record.get("torch_import_s")}, record.get("log", "")
        else:
            say(f"building {path.name} ({target}) in {build_dir} ...")
            with timed(say, f"building {path.name}"):
                cold, log = _import(ws, name, env, tools, target, timeout_s, build_dir)
        diagnostics = static + _diagnostics(cold, log, smap, build_dir, tools, names)
        if not cold["ok"]:
            status, code = _failure(cold)
            return CompileReport(status=status, exit_code=int(code), cold_s=cold.get("seconds"),
                                 torch_import_s=cold.get("torch_import_s"), diagnostics=tuple(diagnostics),
                                 notes=tuple(notes), log=log, **base)
        say("importing again (warm) ...")
        warm, warm_log = _import(ws, name, env, tools, target, timeout_s, build_dir)
    if not warm["ok"]:  # built, yet the second import fails: report it like a failed build
        status, code = _failure(warm)
        diagnostics += _diagnostics(warm, warm_log, smap, build_dir, tools, names)
        return CompileReport(status=status, exit_code=int(code), cold_s=cold["seconds"], cached=cached,
                             diagnostics=tuple(diagnostics), notes=tuple(notes), log=log + warm_log, **base)
    if not cached:
        _write_record(build_dir, {"cold_s": cold["seconds"], "torch_import_s": cold.get("torch_import_s"), "log": log,
                                  "sha256": hashlib.sha256(source).hexdigest(),  # popkit check finds the build by it
                                  "environment": precompile_environment(tools, arch_list)})
    notes += _time_notes(cold["seconds"], test_timeout, found_task is not None, cached)
    if smap.call_position() is None:
        notes.append("the file calls no load_inline: nothing was compiled, cold and warm are plain imports")
    exit_code = ExitCode.COMPILE_FAILED if any(d.severity == "error" for d in diagnostics) else ExitCode.OK
    return CompileReport(status="built" if exit_code == ExitCode.OK else "failed", exit_code=int(exit_code),
                         cold_s=cold["seconds"], warm_s=warm["seconds"],
                         torch_import_s=warm.get("torch_import_s") or cold.get("torch_import_s"), cached=cached,
                         diagnostics=tuple(diagnostics), notes=tuple(notes), log=log, **base)


def _hip_device_build(text: str, path: str, arch: str | None, static: list[Diagnostic], notes: list[str],
                      tools: Toolchain, say: Progress, base: Mapping[str, Any]) -> CompileReport:
    """No ROCm torch: the kernels alone (DEVICE_SRC) built for the AMD GPU with clang, when it is installed."""
    hip = hipbuild.find_tools()
    why = None
    if hip.missing:
        why = (f"no {', '.join(hip.missing)} for an AMD GPU build here: install them "
               f"({hip.install_hint}; popkit doctor checks)")
    elif hipbuild.device_source(text) is None:
        why = (f"the file has no {hipbuild.DEVICE_VAR} string: put the kernels (no torch header) in DEVICE_SRC and "
               "the torch wrapper in HOST_SRC, as `popkit new --target hip` does, to build them here")
    if why is not None:
        errors = [d for d in static if d.severity == "error"]
        notes.append(f"The whole HIP build needs ROCm (this machine's torch is "
                     f"{'a CUDA build' if tools.cuda else 'not a ROCm build'}), and {why}; popkit checked the file "
                     "statically.")
        return CompileReport(status="static-only", exit_code=int(ExitCode.COMPILE_FAILED if errors else ExitCode.OK),
                             diagnostics=tuple(static), notes=tuple(notes), **base)
    arch = arch or hipbuild.file_arch(text) or hipbuild.DEFAULT_ARCH
    if not hipbuild.is_arch(arch):
        raise UsageError(f"--arch {arch}: not an AMD GPU architecture", "e.g. --arch gfx942 (MI300) or gfx950 (MI355X)")
    say(f"building the kernels for {arch} with {hip.version} ...")
    build = hipbuild.build_device(text, path, arch, hip)
    diagnostics = static + list(build.diagnostics)
    notes.append(f"device code only (DEVICE_SRC), compiled for {arch} with clang's AMDGPU backend; the torch "
                 "wrapper needs ROCm and was not built")
    failed = not build.ok or any(d.severity == "error" for d in diagnostics)
    if build.ok and not build.kernels:
        notes.append(f"warning: {hipbuild.DEVICE_VAR} instantiates no kernel: a template kernel launched only from "
                     "HOST_SRC is not built here; launch it from a function in DEVICE_SRC (as the softmax example "
                     "does) or instantiate it explicitly")
    return CompileReport(status="failed" if failed else "device-built",
                         exit_code=int(ExitCode.COMPILE_FAILED if failed else ExitCode.OK), cold_s=build.seconds,
                         diagnostics=tuple(diagnostics), notes=tuple(notes), log=build.log, arch=arch,
                         compiler=build.compiler, kernels=tuple(k.to_json() for k in build.kernels), **base)


def _find_task(path: Path, source: bytes, explicit: str | None,
               roots: Sequence[Path]) -> tuple[tasks.Task | None, list[str]]:
    if explicit:
        return tasks.resolve_task(explicit, list(roots)), []
    try:
        return tasks.resolve_task(task_spec_for(path, source, None), list(roots)), []
    except PopkitError:
        return None, [f"no task found (no --task, and the leaderboard directive names none popkit knows): "
                      f"build time is compared with the default test_timeout of {DEFAULT_TEST_TIMEOUT_S:.0f} s"]


def _require_toolchain(tools: Toolchain, python: str, toolkit_found: bool = False) -> None:
    if tools.torch is None:
        raise EnvironmentProblem(f"torch is not installed for {python}", "install a CUDA build of torch")
    if not tools.cuda and not tools.hip:
        raise EnvironmentProblem(f"torch {tools.torch} at {python} is a CPU-only build: {CANNOT_BUILD} "
                                 "(load_inline needs a CUDA or ROCm build)", SECOND_VENV)
    if tools.cuda and not toolkit_found:
        problem = cuda_home_problem()
        if problem:
            raise EnvironmentProblem(problem[0], problem[1] + " (popkit doctor checks the whole environment)")
    if not tools.ninja:
        raise EnvironmentProblem("ninja not found: load_inline builds with it", "pip install ninja")


def local_gpu_archs() -> tuple[list[str] | None, bool]:
    """(the visible NVIDIA GPUs' `sm_XY` from NVML, or None where it cannot say; whether a GPU may be here)."""
    if not system.has_gpu():
        return None, False
    driver = nvml.visible_gpus(os.environ)
    return ([gpu.arch for gpu in driver.gpus] or None) if driver else None, True


def _arch_choice(text: str, task: tasks.Task | None, tools: Toolchain) -> ArchChoice | None:
    """The architecture of a CUDA build (buildarch's order); None for a ROCm torch (PYTORCH_ROCM_ARCH rules) and
    for a file that builds nothing with torch's cpp_extension (Triton, Helion: they compile when called)."""
    if tools.hip or ("load_inline" not in text and "cpp_extension" not in text):
        return None
    directives = server_directives(text)
    archs, here = local_gpu_archs()
    label = task.display_name if task else ""
    return choose_arch(env_list=os.environ.get("TORCH_CUDA_ARCH_LIST"), local_archs=archs, local_gpu=here,
                       directive_gpu=directives.gpu, directive_line=directives.gpu_line,
                       task_gpus=task.gpus if task else (), task_label=label,
                       supported=lambda: supported_archs(tools.nvcc))


def _require_task_for_imports(path: Path, text: str) -> None:
    """A file importing the task's own modules (`from task import input_t`) cannot even be imported alone."""
    found = task_imports(text)
    if found:
        module, line = found[0]
        raise UsageError(f"{path}:{line}: the file imports `{module}`, one of the task's files, and popkit does not "
                         "know the task (no --task, and no `#!POPCORN leaderboard` line names one it knows)",
                         "pass --task NAME: a leaderboard name with --tasks-root DIR (e.g. --task vectoradd_v2 "
                         "--tasks-root reference-kernels/problems), or the task's folder")


def _prepare(ws: Workspace, task: tasks.Task | None, source: bytes) -> str:
    """A fresh workspace as the runner makes it: the task's files flat, the submission beside them, and popkit's
    import driver."""
    if task is not None:
        ws.prepare(task, source)
        name = task.submission_name
    else:
        for folder in dict.fromkeys([ws.files, ws.cwd]):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "submission.py").write_bytes(source)
        name = "submission.py"
    ws.add(DRIVER_NAME, _DRIVER.encode())
    return name


def _import(ws: Workspace, name: str, env: Mapping[str, str], tools: Toolchain, target: str,
            timeout_s: float, build_dir: Path) -> tuple[dict[str, Any], str]:
    result_path = ws.cwd / ".popkit-compile-result.json"
    result_path.unlink(missing_ok=True)
    full_env = runner.child_env(runner.RunOptions(python=tools.python), **env)
    pre_import = "0" if target == "hip" else "1"  # a HIP file must set its environment before torch loads
    done = ws.run(tools.python, DRIVER_NAME, [name, result_path.name, pre_import], full_env, timeout_s)
    code, out, err, secs, timed_out = done.code, done.stdout, done.stderr, done.seconds, done.timed_out
    log = out + (("\n" if out and err else "") + err)
    if timed_out:
        for lock in find_locks(build_dir):  # our own killed build: a baton lock would block the next one
            if tools.lock_style == "baton":
                lock.unlink(missing_ok=True)
        return {"ok": False, "timed_out": True, "seconds": secs,
                "error": f"the build ran past {timeout_s:.0f} s and was stopped"}, log
    try:
        return json.loads(_read_plain(result_path)), log
    except (OSError, ValueError):
        return {"ok": False, "seconds": secs, "error_type": "crash",
                "error": f"the interpreter exited with code {code} before reporting (killed, or out of memory?)"}, log


def _read_plain(path: Path, limit: int = 16 << 20) -> bytes:
    """A regular file's bytes, never following a link nor waiting on a FIFO the submission left there."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path.name} is not a file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit)
    finally:
        os.close(fd)


def _diagnostics(result: Mapping[str, Any], log: str, smap: SourceMap, build_dir: Path,
                 tools: Toolchain, entry_points: Sequence[str] = ("custom_kernel",)) -> list[Diagnostic]:
    compiler = "clang" if "clang" in tools.cxx else "gcc"
    error = result.get("error") or ""
    text = log if error in log else log + "\n" + error  # non-verbose builds put the output in the exception
    found = map_diagnostics(parse_log(text, compiler), smap, build_dir)
    if result.get("ok") and result.get("has_custom_kernel") is False and "custom_kernel" in entry_points:
        found.append(Diagnostic("error", "python", "no callable custom_kernel after import", smap.path))
    if result.get("ok"):
        return found
    loader = loader_diagnostic(error, smap)
    if loader is not None:
        found.append(loader)
    elif not any(d.severity == "error" for d in found):
        found.append(_python_diagnostic(result, smap, tools.python))
    return found


def _python_diagnostic(result: Mapping[str, Any], smap: SourceMap, python: str = "") -> Diagnostic:
    """An import failure that is not a compiler message: point at the submission's deepest frame. An exception
    from inside torch's extension builder is said in one line with what it means (never bare)."""
    error_type, error = str(result.get("error_type", "error")), str(result.get("error", ""))
    message = f"{error_type}: {error}".strip()
    first, hint, tool = (message.splitlines()[0] if message else "the import failed"), "", "python"
    line = None
    for filename, lineno, *_ in result.get("frames", []):
        if Path(filename).name in (Path(smap.path).name, "submission.py"):
            line = lineno
    inside_torch = torch_error(error_type, error, result.get("frames", []))
    if inside_torch:
        (first, hint), tool = inside_torch, "torch"
    else:
        hint = missing_module_hint(error_type, error, python)
    if result.get("timed_out"):
        tool = "build"
    return Diagnostic("error", tool, first[:500], smap.path, line, None, smap.line_text(line), hint=hint)


def _failure(result: Mapping[str, Any]) -> tuple[str, ExitCode]:
    error = str(result.get("error", ""))
    building = ("Error building extension" in error or "undefined symbol" in error or result.get("timed_out")
                or result.get("error_type") == "crash"
                or torch_error(str(result.get("error_type", "")), error, result.get("frames", [])) is not None)
    return ("failed", ExitCode.COMPILE_FAILED) if building else ("bad-submission", ExitCode.BAD_SUBMISSION)


def _time_notes(cold_s: float, test_timeout: float, known_task: bool, cached: bool) -> list[str]:
    notes = []
    share = cold_s / test_timeout if test_timeout else 0
    label = "the task's" if known_task else "the default"
    if share >= BUILD_SHARE_WARNING:
        notes.append(f"warning: the cold build took {cold_s:.0f} s, {share:.0%} of {label} test_timeout "
                     f"({test_timeout:.0f} s): a first run that must build may time out")
    if cold_s > PRECOMPILE_TIMEOUT_S:
        notes.append(f"warning: the cold build took longer than the runner's {PRECOMPILE_TIMEOUT_S:.0f} s compile "
                     "step, so the first test process would build it again inside its own timeout")
    if cached:
        notes.append("cold time is from an earlier build of this exact source (rerun with --clean to rebuild)")
    return notes


def precompile_environment(tools: Toolchain, arch_list: str | None) -> dict[str, str]:
    """The facts besides load_inline's arguments that the runner's precompile key holds, as far as they are known
    without importing torch (the CXX11 ABI is not: left empty)."""
    return {"torch": tools.torch or "", "torch_cuda": tools.cuda or "", "soabi": tools.python_tag,
            "machine": platform.machine(), "cxx11_abi": "", "arch_list": arch_list or ""}


def _read_record(build_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((build_dir / RECORD).read_text())
        return data if isinstance(data.get("cold_s"), (int, float)) else None
    except (OSError, ValueError):
        return None


def _write_record(build_dir: Path, data: Mapping[str, Any]) -> None:
    (build_dir / RECORD).write_text(json.dumps({**data, "written_at": time.time()}))
