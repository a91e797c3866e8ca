"""The environment: a probe of an interpreter (run reports), the build toolchain (`popkit compile`)
and `popkit doctor`'s checks.

Every external program runs with a timeout. probe() and doctor() never raise on a broken
interpreter or tool: a failure becomes a field ("error") or a check with its fix.
"""

from __future__ import annotations

import glob
import importlib.machinery
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit.errors import EnvironmentProblem
from popkit.machine import nvml
from popkit.toolchain.prestep import extensions_root

PROBE_KEYS = ("python", "platform", "torch", "cuda", "hip", "device", "arch", "gpu_count", "memory")
TOOL_TIMEOUT_S = 15.0

# Reads torch's version file into `out` without importing torch (which takes seconds); `root` is torch's folder.
_READ_TORCH_VERSION = r"""
root = None
spec = importlib.util.find_spec("torch")
if spec is not None and spec.origin:
    root = os.path.dirname(spec.origin)
    ns = {}
    try:
        exec(open(os.path.join(root, "version.py")).read(), ns)
        out.update(torch=ns.get("__version__"), cuda=ns.get("cuda"), hip=ns.get("hip"))
    except Exception as exc:
        out["error"] = repr(exc)
"""

_PROBE_SCRIPT = r"""
import json, os, platform, sys
out = {"python": platform.python_version(), "platform": platform.platform(), "torch": None, "cuda": None,
       "hip": None, "device": "cpu", "arch": None, "gpu_count": 0, "memory": None}
extended = len(sys.argv) > 1 and sys.argv[1] == "extended"
if not extended:  # beside an eval (runner.SystemProbe): its torch import yields the CPU to the eval's
    try:
        os.nice(10)
    except OSError:
        pass
if extended:
    try:
        import numpy
        out["numpy"] = numpy.__version__
    except Exception as exc:
        out["numpy_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    import torch
    out.update(torch=torch.__version__, cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))
    if extended:
        out["torch_dir"] = torch.__path__[0]
        out["arch_list"] = list(torch.cuda.get_arch_list()) if (out["cuda"] or out["hip"]) else []
        out["cxx11_abi"] = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    if torch.cuda.is_available():
        out["gpu_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        out["device"] = props.name
        out["memory"] = props.total_memory
        if out["hip"]:
            out["arch"] = (getattr(props, "gcnArchName", "") or "").split(":")[0] or None
        else:
            major, minor = torch.cuda.get_device_capability(0)
            out["arch"] = "sm_%d%d" % (major, minor)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Ran:
    """How a script ended: its exit code, what it printed, whether its timeout ended it."""

    code: int
    stdout: str
    stderr: str
    timed_out: bool = False


# Runs `python` on a script's text with its arguments, under an environment, within a timeout (seconds); raises
# OSError when `python` cannot be executed. `plain` runs it as a child of popkit; popkit.run.sandbox.scripts in
# the sandbox an eval would get, so that whatever the interpreter runs at its start (a wrapper named as Python,
# a `.pth` file) reaches nothing of the user.
Scripts = Callable[[str, str, Sequence[str], Mapping[str, str], float], Ran]


def plain(python: str, script: str, args: Sequence[str], env: Mapping[str, str], timeout: float) -> Ran:
    """`python -c SCRIPT ARGS...` as a child of popkit (Scripts)."""
    try:
        done = subprocess.run([python, "-c", script, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=dict(env))
    except subprocess.TimeoutExpired:
        return Ran(-9, "", "", timed_out=True)
    return Ran(done.returncode, done.stdout, done.stderr)


def probe(python: str | None = None, timeout: float = 60.0, env: Mapping[str, str] | None = None,
          scripts: Scripts = plain) -> dict:
    """{python, platform, torch, cuda, hip, device ('cpu' or the GPU's name), arch, gpu_count, memory (bytes)}.

    What that interpreter (default: this one) would see under `env` (default: this process's environment):
    its versions read without importing torch (by this process when it is that interpreter with the same
    path settings, `answers_here`; else by a tiny script in it), the NVIDIA GPUs from the driver
    (popkit.machine.nvml), in a fraction of a second and without a CUDA context. Where the driver cannot answer as
    torch would (an AMD or HIP build, GPUs named by UUID, mixed models, a driver older than torch's CUDA, no
    torch), a tiny script imports torch in that interpreter instead (seconds). `timeout` bounds each script, and
    `scripts` runs it (in the sandbox, where popkit runs one: popkit.run.sandbox.scripts).
    Never raises: what could not be learned is None, and "error" says why.
    """
    python = python or sys.executable
    env = os.environ if env is None else env
    return (_probe_without_torch(python, timeout, env, scripts)
            or probe_torch(python, timeout, extended=False, env=env, scripts=scripts))


_FACTS_SCRIPT = r"""
import importlib.util, json, os, platform
out = {"python": platform.python_version(), "platform": platform.platform(), "torch": None, "cuda": None,
       "hip": None}
""" + _READ_TORCH_VERSION + r"""
print(json.dumps(out))
"""


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return 1 << 30  # unreadable: never older than the driver's, so torch is asked


def _probe_without_torch(python: str, timeout: float, env: Mapping[str, str], scripts: Scripts) -> dict | None:
    """probe()'s answer from torch's version file and NVML; None where only importing torch can tell."""
    try:
        if answers_here(python, env):
            facts = facts_here()
        else:
            facts = json.loads(scripts(python, _FACTS_SCRIPT, [], env, timeout).stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None
    if not isinstance(facts, dict) or facts.get("error") or not facts.get("torch") or facts.get("hip"):
        return None
    out: dict[str, Any] = {**{k: None for k in PROBE_KEYS}, "device": "cpu", "gpu_count": 0, **facts}
    if not facts.get("cuda"):
        return out  # a CPU build of torch sees no GPU
    if gpu_devices_visible(env) is False:
        return out  # no device node (or all hidden): torch sees no GPU either
    driver = nvml.visible_gpus(env)
    if driver is None or driver.cuda[0] < _major(str(facts["cuda"])):
        return None  # torch would find the driver too old for its CUDA: let torch say so
    if driver.gpus:
        first = driver.gpus[0]
        out.update(device=first.name, arch=first.arch, gpu_count=len(driver.gpus), memory=first.memory)
    return out


def facts_here() -> dict[str, Any]:
    """What _FACTS_SCRIPT prints, found by this process for a `python -c` of its own interpreter (answers_here):
    the same versions and platform, torch's version file found as that child finds it (its current folder first
    on the import path), read, never imported; as JSON gives it back. A Python start-up fewer beside each run."""
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(), "torch": None,
                           "cuda": None, "hip": None}
    spec = find_here("torch", first="")
    if spec is not None and spec.origin:
        ns: dict[str, Any] = {}
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
                exec(f.read(), ns)
            out.update(torch=ns.get("__version__"), cuda=ns.get("cuda"), hip=ns.get("hip"))
        except Exception as exc:  # as the script says it
            out["error"] = repr(exc)
    return json.loads(json.dumps(out))


# What decides where an interpreter looks for packages, besides the interpreter itself.
PATH_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSAFEPATH")


def answers_here(python: str, env: Mapping[str, str]) -> bool:
    """Whether this process finds packages where `python` started with `env` would (same executable path,
    path settings and start-up flags)."""
    flags = sys.flags
    return (os.path.abspath(python) == os.path.abspath(sys.executable)
            and not (flags.isolated or flags.ignore_environment or flags.no_user_site or flags.no_site
                     or getattr(flags, "safe_path", False))  # -P is Python 3.11+
            and all(env.get(k) == os.environ.get(k) for k in PATH_ENV if not _user_site_moot(k, env)))


def _user_site_moot(key: str, env: Mapping[str, str]) -> bool:
    """PYTHONNOUSERSITE set for the child (the sandbox sets it: HOME is empty there) changes nothing when this
    process's path holds no user site either: both find the same packages."""
    if key != "PYTHONNOUSERSITE" or not env.get(key):
        return False
    import site
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    return not (user and user in sys.path)


def find_here(name: str, first: str | None = None) -> importlib.machinery.ModuleSpec | None:
    """find_spec as another start of this interpreter runs it: every meta-path finder, with sys.path less its
    first entry (the folder of the script that started this process), `first` in its place when given ("" is
    a `python -c` child's current folder). Nothing is imported, and a module imported here already is looked for
    anew."""
    path = ([first] if first is not None else []) + sys.path[1:]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path) if finder is importlib.machinery.PathFinder else find(name, None)
        except (ImportError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def probe_torch(python: str, timeout: float, extended: bool, env: Mapping[str, str] | None = None,
                scripts: Scripts = plain) -> dict:
    """What importing torch in `python` tells (probe's keys; `extended`: doctor's more, and at full priority:
    the plain probe runs beside an eval, at a lower one)."""
    empty: dict[str, Any] = {k: None for k in PROBE_KEYS}
    empty.update(device="cpu", gpu_count=0)
    try:
        done = scripts(python, _PROBE_SCRIPT, ["extended"] if extended else [],
                       os.environ if env is None else env, timeout)
    except (OSError, ValueError) as exc:
        return {**empty, "error": f"cannot run {python}: {exc}"}
    if done.timed_out:
        return {**empty, "error": f"{python} did not answer within {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        data = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**empty, "error": f"{python} exited with code {done.code}: {tail}"}
    return {**empty, **data} if isinstance(data, dict) else {**empty, "error": "unexpected probe output"}


# ------------------------------------------------------------------------------ the build toolchain


@dataclass(frozen=True)
class Toolchain:
    """What the interpreter's torch is, read without importing torch (which takes seconds)."""

    python: str
    python_tag: str  # py311, as torch names its default extensions folder
    torch: str | None
    cuda: str | None
    hip: str | None
    lock_style: str  # "flock": an OS lock the kernel drops when its holder dies; "baton": a file whose existence blocks
    nvcc: str | None = None
    ninja: str | None = None
    cxx: str = "c++"
    notes: tuple[str, ...] = field(default_factory=tuple)


_TOOLCHAIN_SCRIPT = r"""
import importlib.util, json, os, sys
out = {"python_tag": "py%d%d%s" % (sys.version_info[0], sys.version_info[1], getattr(sys, "abiflags", "")),
       "torch": None, "cuda": None, "hip": None, "lock_style": "flock"}
""" + _READ_TORCH_VERSION + r"""
if root is not None:
    try:
        text = open(os.path.join(root, "utils", "cpp_extension.py")).read()
        out["lock_style"] = "flock" if "FileLock(os.path.join(build_directory" in text else "baton"
    except OSError:
        pass
print(json.dumps(out))
"""

def toolchain(python: str = sys.executable, timeout_s: float = 30.0, scripts: Scripts = plain) -> Toolchain:
    """`python`'s torch and the build tools beside it; `scripts` runs the script that reads torch's files in it."""
    try:
        out = scripts(python, _TOOLCHAIN_SCRIPT, [], os.environ, timeout_s)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        raise EnvironmentProblem(f"cannot run {python} to inspect its torch",
                                 "check the interpreter (popkit doctor shows the environment)") from None
    return Toolchain(python=python, python_tag=info["python_tag"], torch=info["torch"], cuda=info["cuda"],
                     hip=info["hip"], lock_style=info["lock_style"], nvcc=find_nvcc(),
                     ninja=shutil.which("ninja") or _module_ninja(python), cxx=os.environ.get("CXX", "c++"))


def gpu_devices_visible(env: Mapping[str, str] | None = None) -> bool | None:
    """Whether a GPU device node exists (NVIDIA or AMD) and CUDA_VISIBLE_DEVICES (in `env`, default this
    process's) does not hide it; None where unknown (not Linux). Checked without importing torch: False means
    no kernel can run here; True does not promise that torch can use the GPU (doctor says that)."""
    env = os.environ if env is None else env
    if env.get("POPKIT_ASSUME_GPU"):  # containers that hide /dev but pass the GPU some other way
        return True
    if not Path("/dev").is_dir() or sys.platform != "linux":
        return None
    if env.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or Path("/dev/kfd").exists() or Path("/dev/dxg").exists()


def gpu_count() -> int | None:
    """How many GPUs CUDA (or HIP) can enumerate here, from the device nodes (NVIDIA's /dev/nvidiaN, AMD's render
    nodes), without importing torch; None where unknown (not Linux, POPKIT_ASSUME_GPU)."""
    if os.environ.get("POPKIT_ASSUME_GPU") or not Path("/dev").is_dir() or sys.platform != "linux":
        return None
    nvidia = glob.glob("/dev/nvidia[0-9]*")
    if nvidia:
        return len(nvidia)
    return len(glob.glob("/dev/dri/renderD*")) if Path("/dev/kfd").exists() else 0


def has_gpu() -> bool:
    """A GPU may be here (gpu_devices_visible is not False)."""
    return gpu_devices_visible() is not False


def cuda_home() -> str | None:
    """The CUDA toolkit torch's cpp_extension will use: CUDA_HOME/CUDA_PATH, else nvcc's folder's parent."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    nvcc = shutil.which("nvcc")
    if nvcc:
        return str(Path(nvcc).parent.parent)
    return "/usr/local/cuda" if Path("/usr/local/cuda").exists() else None


def has_cudart(home: str | Path) -> bool:
    """Whether the link step's `-L<home>/lib64 -lcudart` (or lib/) can succeed."""
    return any(any((Path(home) / d).glob("libcudart.so*")) for d in ("lib64", "lib"))


def toolkit_candidates() -> list[str]:
    """CUDA toolkits on this machine with both nvcc and libcudart (for the fix of a wrong CUDA_HOME)."""
    paths = [Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"), reverse=True), Path("/opt/cuda")]
    return [str(p) for p in paths if (p / "bin" / "nvcc").is_file() and has_cudart(p)]


def find_nvcc() -> str | None:
    """nvcc as torch runs it: <CUDA toolkit>/bin/nvcc."""
    home = cuda_home()
    nvcc = Path(home) / "bin" / "nvcc" if home else None
    return str(nvcc) if nvcc and nvcc.is_file() else None


def cuda_home_problem() -> tuple[str, str] | None:
    """(problem, fix) when the toolkit torch will use cannot build and link an extension."""
    home = cuda_home()
    explicit = bool(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"))
    fix_home = (toolkit_candidates() or ["/usr/local/cuda"])[0]
    said = f"CUDA_HOME is {home}" if explicit else f"CUDA_HOME is unset, so torch uses {home}"
    if home is None:
        return "no CUDA toolkit found (CUDA_HOME unset, no nvcc on PATH, no /usr/local/cuda)", \
            "install the CUDA toolkit and export CUDA_HOME=<its folder>"
    if not (Path(home) / "bin" / "nvcc").is_file():
        return f"{said}, which has no bin/nvcc", f"export CUDA_HOME={fix_home}"
    if not has_cudart(home):
        return (f"{said}, which has no lib64/libcudart.so: linking an extension fails with "
                "`cannot find -lcudart`"), f"export CUDA_HOME={fix_home}"
    return None


def toolkit_for_builds(problem: tuple[str, str] | None = None) -> tuple[str | None, str]:
    """(CUDA_HOME to give builds, the line that says so) when torch would guess a toolkit that cannot build.

    `problem` is cuda_home_problem()'s answer. Only when CUDA_HOME/CUDA_PATH are unset (a user's choice
    is kept, and doctor reports it) and this machine has a toolkit with nvcc and libcudart; else (None, "").
    """
    if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or problem is None:
        return None, ""
    found = toolkit_candidates()
    if not found:
        return None, ""
    return found[0], (f"builds use the CUDA toolkit at {found[0]} (CUDA_HOME is unset, and torch would guess "
                      f"{cuda_home()}, which cannot build an extension)")


def _module_ninja(python: str) -> str | None:
    candidate = Path(python).parent / "ninja"
    return str(candidate) if candidate.is_file() else None


def default_extensions_root(tools: Toolchain) -> Path:
    """Where load_inline builds when TORCH_EXTENSIONS_DIR is unset (what `popkit test` and the runner use)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    accel = f"rocm{tools.hip.replace('.', '')}" if tools.hip else f"cu{tools.cuda.replace('.', '')}" if tools.cuda else "cpu"
    return extensions_root(os.environ) / f"{tools.python_tag}_{accel}"


# ---------------------------------------------------------------------------------------- doctor
