"""Whether this machine can run a task, and if not exactly why (`popkit tasks --check`, and before a run).

What a task needs is read from its files with `ast`, never by running them:
- a GPU, when its files put tensors on "cuda" with no CPU fallback, or when a function every run calls
  (generate_input, ref_kernel, check_implementation and what they call) does, whatever other files name;
- a vendor or architecture, from ROCm-only or CUDA-only packages and fp4 dtypes (sm_100);
- the GPU count its `world_size` cases ask for;
- the third-party packages its files import (import names mapped to what pip calls them);
- memory, from the largest fixed-size CUDA buffer the eval allocates (the cache-flush buffer).
What the machine has comes from the eval interpreter (system.probe) and `importlib.util.find_spec`.
The task's `gpus` list is the leaderboard's hardware: a different vendor is a note, not a refusal
(amd-identity runs on an H100), because the files decide what can run.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from popkit.errors import EnvironmentProblem
from popkit.machine import memo
from popkit.machine import system as sysmod
from popkit.model.tasks import SUBMISSION_SOURCE, Task
from popkit.resources import harness_paths

GiB = 1024**3
# Import name -> what pip installs it as, where they differ (or where it is not on PyPI at all).
PIP_NAMES = {
    "cutlass": "nvidia-cutlass-dsl", "cuda": "cuda-python", "yaml": "pyyaml", "cv2": "opencv-python",
    "PIL": "pillow", "sklearn": "scikit-learn", "aiter": "aiter (ROCm; built from github.com/ROCm/aiter)",
    "rocshmem": "rocshmem (ROCm)", "hip": "hip-python (ROCm)", "cupy": "cupy-cuda12x",
}
AMD_ONLY = {"aiter", "rocshmem", "hip"}  # packages that exist only for ROCm
NVIDIA_ONLY = {"cutlass", "cuda", "cupy"}
_ALLOC = {"empty", "zeros", "ones", "randn", "rand", "full", "randint"}
_DTYPE_BYTES = {"float64": 8, "double": 8, "int64": 8, "long": 8, "float32": 4, "float": 4, "int32": 4, "int": 4,
                "float16": 2, "half": 2, "bfloat16": 2, "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
_AMD_GPU_PREFIXES = ("MI",)
_VENDOR = {"amd": "AMD", "nvidia": "NVIDIA"}


@dataclass(frozen=True)
class Needs:
    """What a task needs from the machine, with the file and reason for each."""

    gpu: str = ""  # why it needs a GPU ("" when its files can run on the CPU)
    vendor: str = ""  # "nvidia" or "amd" when only one will do
    vendor_why: str = ""
    min_sm: int = 0  # NVIDIA compute capability as 100 for sm_100
    sm_why: str = ""
    world_size: int = 1
    packages: tuple[tuple[str, str], ...] = ()  # (import name, file that imports it)
    memory_bytes: int = 0
    memory_why: str = ""
    leaderboard_vendor: str = ""  # vendor of the task's `gpus` list, when it names one vendor only


@dataclass(frozen=True)
class Machine:
    """What this machine offers to the eval's interpreter."""

    vendor: str = ""  # "nvidia", "amd" or "" (no GPU)
    device: str = "cpu"
    sm: int = 0  # compute capability as 90 for sm_90; 0 on AMD or without a GPU
    arch: str = ""
    gpu_count: int = 0
    memory_bytes: int = 0
    missing: frozenset[str] = field(default_factory=frozenset)  # import names not found

    @classmethod
    def from_probe(cls, system: Mapping[str, Any], missing: Iterable[str] = ()) -> "Machine":
        arch = system.get("arch") or ""
        vendor = "" if not system.get("gpu_count") else ("amd" if system.get("hip") else "nvidia")
        sm = int(arch[3:].rstrip("a")) if arch.startswith("sm_") and arch[3:].rstrip("a").isdigit() else 0
        return cls(vendor=vendor, device=system.get("device") or "cpu", sm=sm, arch=arch,
                   gpu_count=int(system.get("gpu_count") or 0), memory_bytes=int(system.get("memory") or 0),
                   missing=frozenset(missing))


@dataclass(frozen=True)
class Verdict:
    """Whether a task runs here: `runnable` for a pure-PyTorch submission, `build_runnable` for one that builds a
    CUDA or HIP extension (load_inline), which also needs a GPU of the task's vendor."""

    task: str
    leaderboard: str | None
    runnable: bool
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    build_runnable: bool = False
    build_reasons: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"task": self.task, "leaderboard": self.leaderboard, "runnable": self.runnable,
                "reasons": list(self.reasons), "notes": list(self.notes), "build_runnable": self.build_runnable,
                "build_reasons": list(self.build_reasons)}


# ------------------------------------------------------------------------------ what a task needs


def _files(task: Task, harness: str = "task") -> dict[str, bytes]:
    """The Python files that run besides the submission, by name (one that cannot be read is skipped): the
    task's own, with popkit's harness in place of the task's eval under `--harness popkit`, and the harness's
    modules beside its entry wherever it runs (the workspace writes them: executor.harness_files)."""
    paths = {f.name: task.path / f.source for f in task.files
             if f.source != SUBMISSION_SOURCE and f.name.endswith(".py")}
    if harness == "popkit":
        paths.pop(task.main, None)
    own = harness_paths("popkit_eval.py" if harness == "popkit" else task.main)
    found: dict[str, bytes] = {}
    for name, path in [*paths.items(), *((f"<popkit>/{n}", p) for n, p in own.items())]:
        try:
            found[name] = path.read_bytes()
        except OSError:
            continue
    mine = {name.split("/", 1)[1]: found.pop(name) for name in list(found) if name.startswith("<popkit>/")}
    return {**mine, **found} if harness == "popkit" or found.get(task.main) == mine.get(task.main) else found


def _parsed(files: Mapping[str, bytes]) -> dict[str, ast.Module]:
    """Each file parsed as text mode reads it (UTF-8, universal newlines); one that does not decode or parse is
    skipped."""
    trees = {}
    for name, data in files.items():
        try:
            trees[name] = ast.parse(data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n"))
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
    return trees


@functools.lru_cache(maxsize=None)
def _walk(tree: ast.AST) -> tuple[ast.AST, ...]:
    """Every node of a parsed file (or a part of one), walked once: needs() looks at each file several ways.
    needs() empties the cache when it is done, so no task's trees outlive it."""
    return tuple(ast.walk(tree))


def needs(task: Task, harness: str = "task") -> Needs:
    """What running `task` takes, read from the files that will run (`harness`: the eval in use)."""
    try:
        return _needs(task, harness)
    finally:
        _walk.cache_clear()


def _needs(task: Task, harness: str = "task") -> Needs:
    files = _files(task, harness)
    local = sorted({Path(f.name).stem for f in task.files} | {Path(name).stem for name in files})
    # What the files say depends on their bytes and names alone: remembered per content (memo.py).
    key = memo.digest("needs", [Path(__file__)], [json.dumps([task.main, local, list(files)]), *files.values()])
    found = memo.remembered("needs", key, lambda: _read_needs(_parsed(files), set(local), task.main),
                            dump=dict, load=_loaded)
    world = max([int(c.get("world_size", 1)) for c in task.tests + task.benchmarks
                 if isinstance(c.get("world_size", 1), int)] or [1])
    if world > 1 and not found.get("gpu"):
        found["gpu"] = f"cases ask for world_size {world}"
    return Needs(world_size=world, leaderboard_vendor=_gpus_vendor(task.gpus), **found)


def _read_needs(trees: Mapping[str, ast.Module], local: set[str], main: str) -> dict[str, Any]:
    """The needs the files themselves say (Needs' fields but world_size and leaderboard_vendor)."""
    found: dict[str, Any] = {}
    packages = _third_party_imports(trees, local)
    names = {name for name, _ in packages}
    amd = sorted(names & AMD_ONLY)
    nvidia = sorted(names & NVIDIA_ONLY)
    if amd:
        found.update(vendor="amd", vendor_why=f"imports {amd[0]} (ROCm only)")
    elif nvidia:
        found.update(vendor="nvidia", vendor_why=f"imports {nvidia[0]} (CUDA only)")
    cpu_path = any(_names_cpu(tree) for tree in trees.values())  # a helper with a CPU path: never certain
    for fname, tree in trees.items():
        if not found.get("gpu") and not cpu_path and _puts_tensors_on_cuda(tree):
            found["gpu"] = f"{fname} puts tensors on \"cuda\""
        if not found.get("min_sm") and any(isinstance(n, ast.Attribute) and n.attr == "float4_e2m1fn_x2"
                                           for n in _walk(tree)):
            found.update(min_sm=100, sm_why=f"{fname} uses fp4 (torch.float4_e2m1fn_x2), which needs sm_100 (B200)")
    # What the runs reach decides, not a helper elsewhere that names "cpu" (a utils.py with a CPU fallback
    # that generate_input never uses).
    found["gpu"] = found.get("gpu") or _entries_on_cuda(trees, main)
    if found.get("min_sm") and not found.get("vendor"):
        found.update(vendor="nvidia", vendor_why=found["sm_why"])
    memory, why = _flush_buffer(main, trees)
    return {**found, "packages": packages, "memory_bytes": memory, "memory_why": why}


def _loaded(data: Any) -> dict[str, Any]:
    """A remembered _read_needs answer as it was computed (TypeError or ValueError when it is not one)."""
    found = dict(data)
    found["packages"] = tuple((str(name), str(fname)) for name, fname in found["packages"])
    Needs(**found)  # every key is a field
    return found


def _gpus_vendor(gpus: Sequence[str]) -> str:
    vendors = {"amd" if g.upper().startswith(_AMD_GPU_PREFIXES) else "nvidia" for g in gpus}
    return vendors.pop() if len(vendors) == 1 else ""


def _optional_imports(tree: ast.Module) -> set[int]:
    """ids of import nodes inside `try: ... except ImportError` (the file copes without them)."""
    ids = set()
    for node in _walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError", "Exception")
                or h.type is None for h in node.handlers):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return ids


def _third_party_imports(trees: Mapping[str, ast.Module], local: set[str]) -> tuple[tuple[str, str], ...]:
    seen: dict[str, str] = {}
    for fname, tree in trees.items():
        optional = _optional_imports(tree)
        for node in _walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top not in local and top not in sys.stdlib_module_names and top != "__future__":
                    seen.setdefault(top, fname)
    return tuple(sorted(seen.items()))


def _is_cuda(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(":")[0] == "cuda"


def _names_cpu(tree: ast.AST) -> bool:
    """Whether the file (or function) names the "cpu" device: it has a CPU path."""
    return any(isinstance(n, ast.Constant) and n.value == "cpu" for n in _walk(tree))


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the nodes that run only after asking whether a GPU is there (`if torch.cuda.is_available():`, a
    conditional expression on it, `device_count()`), or inside a `try` that catches a failure."""
    ids: set[int] = set()
    for node in _walk(tree):
        asks = isinstance(node, (ast.If, ast.IfExp, ast.While)) and any(
            isinstance(n, ast.Attribute) and n.attr in ("is_available", "device_count") for n in ast.walk(node.test))
        if asks or isinstance(node, ast.Try) and node.handlers:
            ids |= {id(n) for n in ast.walk(node)}
    return ids


# The functions of a task's files that every run calls (the eval takes them from reference.py).
ENTRY_FUNCTIONS = ("generate_input", "ref_kernel", "check_implementation")


def _entries_on_cuda(trees: Mapping[str, ast.Module], main: str) -> str:
    """Why the task needs a GPU when code every run reaches puts tensors on "cuda" without a CPU path of its own
    ("" else): ENTRY_FUNCTIONS, the eval's `main`, and the functions of the task's files they name, transitively."""
    functions: dict[str, tuple[str, ast.AST]] = {}
    for fname, tree in trees.items():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(node.name, (fname, node))
    todo = [functions[name] for name in ENTRY_FUNCTIONS if name in functions]
    todo += [(main, node) for node in (trees[main].body if main in trees else ())
             if isinstance(node, ast.FunctionDef) and node.name == "main"]
    seen = {id(node) for _, node in todo}
    while todo:
        fname, node = todo.pop(0)
        if _puts_tensors_on_cuda(node):
            return f"{fname}:{node.name} puts tensors on \"cuda\" with no CPU path"  # type: ignore[attr-defined]
        for name in _walk(node):
            reached = functions.get(name.id) if isinstance(name, ast.Name) else None
            if reached and id(reached[1]) not in seen:
                seen.add(id(reached[1]))
                todo.append(reached)
    return ""


def _puts_tensors_on_cuda(tree: ast.AST) -> bool:
    """`device="cuda"`, `torch.device("cuda")`, `.to("cuda")`, `.cuda()`, torch.cuda.Event or synchronize, outside
    any guard (_guarded), in a file (or function) that never names the "cpu" device (one that does has a CPU
    path)."""
    if _names_cpu(tree):
        return False
    guarded = _guarded(tree)
    for node in _walk(tree):
        if not isinstance(node, ast.Call) or id(node) in guarded:
            continue
        if any(k.arg == "device" and _is_cuda(k.value) for k in node.keywords):
            return True
        func = node.func
        if not isinstance(func, ast.Attribute):
            continue
        if (func.attr == "cuda" and not node.args
                or func.attr in ("device", "to") and node.args and _is_cuda(node.args[0])
                or func.attr in ("Event", "synchronize") and _is_torch_cuda(func.value)):
            return True
    return False


def _is_torch_cuda(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Name)
            and node.value.id == "torch")


def _const_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Pow)):
        left, right = _const_int(node.left), _const_int(node.right)
        if left is not None and right is not None:
            return left * right if isinstance(node.op, ast.Mult) else left**right
    return None


def _alloc_bytes(call: ast.Call) -> int:
    """Bytes of `torch.empty((a, b), dtype=torch.int64, device="cuda")` with constant sizes; 0 otherwise."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in _ALLOC and isinstance(func.value, ast.Name)
            and func.value.id == "torch"):
        return 0
    if not any(k.arg == "device" and _is_cuda(k.value) for k in call.keywords):
        return 0
    shape = call.args[0] if call.args else None
    dims = shape.elts if isinstance(shape, (ast.Tuple, ast.List)) else call.args[:1] if func.attr != "full" else [shape]
    sizes = [_const_int(d) for d in dims]
    if not sizes or any(s is None for s in sizes):
        return 0
    dtype = next((k.value for k in call.keywords if k.arg == "dtype"), None)
    width = _DTYPE_BYTES.get(dtype.attr, 4) if isinstance(dtype, ast.Attribute) else 4
    count = 1
    for s in sizes:
        count *= s
    return count * width


def _flush_buffer(main: str, trees: Mapping[str, ast.Module]) -> tuple[int, str]:
    """The largest constant-size CUDA allocation in the eval (`main`) or in a function it imports by name."""
    tree = trees.get(main)
    if tree is None:
        return 0, ""
    scopes: list[tuple[str, ast.AST]] = [(main, tree)]
    for node in _walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in {Path(n).stem for n in trees}:
            module = trees[node.module + ".py"]
            wanted = {a.name for a in node.names}
            scopes += [(f"{node.module}.py:{d.name}", d) for d in module.body
                       if isinstance(d, ast.FunctionDef) and d.name in wanted]
    best, why = 0, ""
    for where, scope in scopes:
        for node in _walk(scope):
            size = _alloc_bytes(node) if isinstance(node, ast.Call) else 0
            if size > best:
                best, why = size, f"{where} allocates a {size / GiB:.3g} GiB buffer"
    return best, why


# ------------------------------------------------------------------------------ this machine


_FIND_SCRIPT = "import importlib.util, json, sys; print(json.dumps([m for m in sys.argv[1:] " \
               "if importlib.util.find_spec(m) is None]))"


def missing_packages(python: str, names: Iterable[str], timeout: float = 30.0,
                     env: Mapping[str, str] | None = None, scripts: sysmod.Scripts = sysmod.plain) -> set[str]:
    """Top-level import names the interpreter `python` cannot find (find_spec only: nothing is imported).

    `env` is the eval's environment (default: this one). When the eval runs this very interpreter with
    the same path settings, this process answers (system.find_here, without the folder popkit started from:
    the eval's is its own working directory): no interpreter start-up before a run. Else `scripts` runs a
    script in `python` (in the sandbox, where popkit runs one).
    """
    names = sorted(set(names))
    if not names:
        return set()
    env = dict(os.environ) if env is None else dict(env)
    if sysmod.answers_here(python, env):
        return {name for name in names if sysmod.find_here(name) is None}
    try:
        return set(json.loads(scripts(python, _FIND_SCRIPT, names, env, timeout).stdout.strip().splitlines()[-1]))
    except (OSError, ValueError, IndexError):
        return set()  # unknown: the run itself will tell


def machine(python: str | None = None, packages: Iterable[str] = (),
            system: Mapping[str, Any] | None = None, scripts: sysmod.Scripts = sysmod.plain) -> Machine:
    """This machine as `python` sees it; `scripts` runs what must run in that interpreter (system.Scripts)."""
    python = python or sys.executable
    return Machine.from_probe(system if system is not None else sysmod.probe(python, scripts=scripts),
                              missing_packages(python, packages, scripts=scripts))


# ------------------------------------------------------------------------------ the verdict


def _pip(name: str) -> str:
    return PIP_NAMES.get(name, name)


def blockers(need: Needs, here: Machine, world_size: int | None = None) -> list[str]:
    """Why the task cannot run here, most basic first; empty when it can."""
    reasons = []
    why_gpu = need.gpu or need.vendor_why or need.sm_why  # a vendor or an architecture implies a GPU
    if why_gpu and not here.vendor:
        reasons.append(f"needs a GPU ({why_gpu}); this machine has none")
    elif need.vendor and here.vendor and need.vendor != here.vendor:
        reasons.append(f"needs an {_VENDOR[need.vendor]} GPU "
                       f"({need.vendor_why}); this one is {here.device}")
    if need.min_sm and here.vendor == "nvidia" and here.sm < need.min_sm:
        reasons.append(f"{need.sm_why}; this GPU is {here.arch}")
    wanted = world_size or need.world_size
    if wanted > 1 and here.gpu_count < wanted:
        reasons.append(f"cases need {wanted} GPUs (world_size); this machine has {here.gpu_count}"
                       + ("" if world_size or not here.gpu_count else " (--world-size N runs them scaled down)"))
    for name, fname in need.packages:
        if name in here.missing:
            reasons.append(f"{fname} imports {name}, which is not installed (pip: {_pip(name)})")
    if need.memory_bytes and here.memory_bytes and need.memory_bytes > here.memory_bytes:
        reasons.append(f"{need.memory_why}; this GPU has {here.memory_bytes / GiB:.3g} GiB")
    return reasons


def build_blockers(need: Needs, here: Machine) -> list[str]:
    """Why a submission that builds a CUDA or HIP extension cannot run the task here, beyond `blockers`: its
    kernels need a GPU of the task's vendor (either vendor when its GPU list names both)."""
    vendor = need.vendor or need.leaderboard_vendor
    kind = {"nvidia": "a CUDA", "amd": "a HIP"}.get(vendor, "a CUDA or HIP")
    gpu = f"an {_VENDOR[vendor]} GPU" if vendor else "a GPU"
    if not here.vendor:
        return [f"{kind} build needs {gpu} to run; this machine has none (`popkit compile` checks the build)"]
    if vendor and here.vendor != vendor:
        also = " (`popkit test --hip-on-cuda` checks a HIP file's logic on it)" if vendor == "amd" else ""
        return [f"{kind} build needs {gpu}; this one is {here.device}{also}"]
    return []


def notes(need: Needs, here: Machine) -> list[str]:
    if need.leaderboard_vendor and here.vendor and need.leaderboard_vendor != here.vendor:
        return [f"the leaderboard runs it on {_VENDOR[need.leaderboard_vendor]} GPUs: times here are not comparable"]
    return []


def check_tasks(tasks: Sequence[Task], python: str | None = None, system: Mapping[str, Any] | None = None,
                scripts: sysmod.Scripts = sysmod.plain) -> list[Verdict]:
    """One verdict per task, with one probe of the machine for all of them."""
    found = [(t, needs(t)) for t in tasks]
    here = machine(python, {name for _, n in found for name, _ in n.packages}, system, scripts)
    out = []
    for task, need in found:
        reasons = blockers(need, here)
        build = reasons + [r for r in build_blockers(need, here) if r not in reasons]
        out.append(Verdict(task.name, task.leaderboard, not reasons, tuple(reasons), tuple(notes(need, here)),
                           build_runnable=not build, build_reasons=tuple(build)))
    return out


# ------------------------------------------------------------------------------ before a run

_HEAVY_MEMORY = 16 * GiB  # every GPU a leaderboard uses has this much; a larger buffer is worth a probe


def gpu_devices_visible() -> bool | None:
    """Whether a GPU device node is visible here (system.gpu_devices_visible); None where unknown."""
    return sysmod.gpu_devices_visible()


def preflight(task: Task, python: str, system: Callable[[], Mapping[str, Any]],
              world_size: int | None = None, env: Mapping[str, str] | None = None, harness: str = "task",
              scripts: sysmod.Scripts = sysmod.plain) -> None:
    """Raise EnvironmentProblem (exit 11) when the task cannot run here, before anything starts.

    Packages cost a find_spec in the eval's interpreter (`env`: its environment), answered here when it is
    this one (missing_packages); "is there a GPU" a look at /dev. The probe
    (a torch import, seconds) is waited for only when the task needs more: a vendor, an architecture,
    several GPUs, or a buffer larger than any leaderboard GPU's memory.
    """
    need = needs(task, harness)
    heavy = need.vendor or need.min_sm or (world_size or need.world_size) > 1 or need.memory_bytes > _HEAVY_MEMORY
    if heavy:
        here = Machine.from_probe(system())
    else:
        # Only "is there a GPU" matters here: a vendor of "unknown" never conflicts (need.vendor is empty).
        here = Machine(vendor="" if gpu_devices_visible() is False else "unknown", device="a GPU")
    here = replace(here, missing=frozenset(missing_packages(python, [n for n, _ in need.packages], env=env,
                                                            scripts=scripts)))
    reasons = blockers(need, here, world_size)
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise EnvironmentProblem(f"{task.display_name} cannot run here: {reasons[0]}{more}",
                                 "`popkit tasks --check` lists what each task needs and what is missing")
