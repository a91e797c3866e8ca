"""The environment: a probe of an interpreter (run reports), the build toolchain (`popkit compile`)
and `popkit doctor`'s checks.

Every external program runs with a timeout. probe() and doctor() never raise on a broken
interpreter or tool: a failure becomes a field ("error") or a check with its fix.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from popkit import hipbuild, nvml, popcorn
from popkit.buildlocks import find_locks, lock_state
from popkit.cputorch import CANNOT_BUILD, SECOND_VENV
from popkit.errors import EnvironmentProblem, PopcornError, PopkitError
from popkit.prestep import extensions_root

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
import json, platform, sys
out = {"python": platform.python_version(), "platform": platform.platform(), "torch": None, "cuda": None,
       "hip": None, "device": "cpu", "arch": None, "gpu_count": 0, "memory": None}
extended = len(sys.argv) > 1 and sys.argv[1] == "extended"
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


def probe(python: str | None = None, timeout: float = 60.0, env: Mapping[str, str] | None = None) -> dict:
    """{python, platform, torch, cuda, hip, device ('cpu' or the GPU's name), arch, gpu_count, memory (bytes)}.

    What that interpreter (default: this one) would see under `env` (default: this process's environment):
    its versions read without importing torch, the NVIDIA GPUs from the driver (popkit.nvml), in a
    fraction of a second and without a CUDA context. Where the driver cannot answer as torch would (an AMD
    or HIP build, GPUs named by UUID, mixed models, a driver older than torch's CUDA, no torch), a tiny
    script imports torch in that interpreter instead (seconds). `timeout` bounds each of the two.
    Never raises: what could not be learned is None, and "error" says why.
    """
    python = python or sys.executable
    env = os.environ if env is None else env
    return _probe_without_torch(python, timeout, env) or _probe(python, timeout, extended=False, env=env)


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


def _probe_without_torch(python: str, timeout: float, env: Mapping[str, str]) -> dict | None:
    """probe()'s answer from torch's version file and NVML; None where only importing torch can tell."""
    try:
        done = subprocess.run([python, "-c", _FACTS_SCRIPT], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=dict(env))
        facts = json.loads(done.stdout.strip().splitlines()[-1])
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


BACKGROUND_NICE = 10


def _lower_priority() -> None:
    os.nice(BACKGROUND_NICE)


def _probe(python: str, timeout: float, extended: bool, env: Mapping[str, str] | None = None) -> dict:
    empty: dict[str, Any] = {k: None for k in PROBE_KEYS}
    empty.update(device="cpu", gpu_count=0)
    try:
        # The plain probe runs beside an eval (runner.SystemProbe): at a lower priority, its torch import
        # yields the CPU to the eval's on a busy machine. Doctor's extended probe runs alone.
        done = subprocess.run([python, "-c", _PROBE_SCRIPT] + (["extended"] if extended else []),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              preexec_fn=None if extended else _lower_priority,
                              env=None if env is None else dict(env))
    except subprocess.TimeoutExpired:
        return {**empty, "error": f"{python} did not answer within {timeout:.0f} s"}
    except (OSError, ValueError) as exc:
        return {**empty, "error": f"cannot run {python}: {exc}"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        data = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {**empty, "error": f"{python} exited with code {done.returncode}: {tail}"}
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

def toolchain(python: str = sys.executable, timeout_s: float = 30.0) -> Toolchain:
    try:
        out = subprocess.run([python, "-c", _TOOLCHAIN_SCRIPT], capture_output=True, text=True, timeout=timeout_s)
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


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, info, warn, problem
    value: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]
    system: Mapping[str, Any]

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status == "problem"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": len(self.problems), "warnings": len(self.warnings),
                "checks": [c.to_json() for c in self.checks], "system": dict(self.system)}


def _run(argv: list[str]) -> str | None:
    """First lines of a tool's output, or None when it cannot run."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return (done.stdout or done.stderr).strip() if done.returncode == 0 else None


def nvcc_version(nvcc: str) -> str | None:
    out = _run([nvcc, "--version"])
    m = re.search(r"release (\d+\.\d+)", out or "")
    return m.group(1) if m else None


def doctor(python: str | None = None) -> DoctorReport:
    """Check what building and running kernels needs; each problem carries its fix."""
    python = python or sys.executable
    info = _probe(python, 90.0, extended=True)
    checks = [Check("python", "ok" if info.get("python") else "problem", info.get("python") or "unknown",
                    "" if info.get("python") else info.get("error", ""))]
    checks += _torch_checks(info)
    checks += _numpy_checks(info, python)
    checks += _cuda_checks(info, find_nvcc())
    checks += _tool_checks(info)
    checks += _hip_device_checks(info)
    checks += _popcorn_checks()
    checks += _cache_checks(info, python)
    return DoctorReport(checks=tuple(checks), system={k: info.get(k) for k in PROBE_KEYS})


def _hip_device_checks(info: Mapping[str, Any]) -> list[Check]:
    """Without a ROCm torch, `popkit compile` builds HIP kernels for the AMD GPU with clang (hipbuild.py)."""
    if info.get("hip"):
        return []
    tools = hipbuild.find_tools()
    if not tools.missing:
        return [Check("hip device build", "ok", f"{tools.version}, device libraries in {tools.device_libs}")]
    return [Check("hip device build", "warn", "no " + ", ".join(tools.missing),
                  f"{tools.install_hint} (Debian/Ubuntu): `popkit compile` then builds HIP kernels for gfx942 and "
                  "reports their registers")]


def _torch_checks(info: Mapping[str, Any]) -> list[Check]:
    if not info.get("torch"):
        return [Check("torch", "problem", "not importable" + (f" ({info['error']})" if info.get("error") else ""),
                      "pip install torch (a CUDA build: see the install selector on the PyTorch site)")]
    backend = f"CUDA {info['cuda']}" if info.get("cuda") else f"ROCm {info['hip']}" if info.get("hip") else "CPU only"
    out = [Check("torch", "ok" if backend != "CPU only" else "warn", f"{info['torch']} ({backend})",
                 "" if backend != "CPU only" else f"{CANNOT_BUILD} (nor HIP ones): `popkit compile`, and `popkit "
                 f"test`/`bench` of a file that builds one, cannot run with it; {SECOND_VENV}")]
    if info.get("device") and info.get("device") != "cpu":
        arch, arch_list = info.get("arch"), info.get("arch_list") or []
        value = f"{info['device']} ({arch}), {info.get('gpu_count')} visible"
        supported = not arch or not arch_list or arch in arch_list or any(
            a.startswith("compute_") and a[8:] <= (arch or "")[3:] for a in arch_list)
        out.append(Check("gpu", "ok" if supported else "problem", value, "" if supported else
                         f"torch {info['torch']} has no kernels for {arch} (it has {', '.join(arch_list)}): "
                         "install a torch build that supports this GPU"))
    else:
        out.append(Check("gpu", "warn", "none visible" + (f" ({info['error']})" if info.get("error") else ""),
                         "kernels cannot run here; `popkit compile` still builds them, and `popkit test` runs "
                         "pure-PyTorch submissions of the bundled tasks on the CPU"))
    return out


def _numpy_checks(info: Mapping[str, Any], python: str) -> list[Check]:
    """numpy: every public problem set's utils.py imports it (popkit depends on it for that reason)."""
    if info.get("numpy"):
        return [Check("numpy", "ok", str(info["numpy"]))]
    if "numpy_error" not in info:  # the probe did not get that far (no python); that check says why
        return []
    return [Check("numpy", "problem", f"not importable in {python} ({info['numpy_error']})",
                  f"{python} -m pip install numpy (the public problem sets' utils.py imports it)")]


def _cuda_checks(info: Mapping[str, Any], nvcc: str | None) -> list[Check]:
    if not info.get("cuda"):
        if info.get("hip"):
            hipcc = shutil.which("hipcc") or (str(Path(os.environ.get("ROCM_HOME", "/opt/rocm")) / "bin" / "hipcc"))
            found = Path(hipcc).is_file()
            return [Check("hipcc", "ok" if found else "problem", hipcc if found else "not found",
                          "" if found else "install ROCm and set ROCM_HOME (load_inline builds HIP with it)")]
        return []
    out = []
    problem = cuda_home_problem()
    home = cuda_home()
    found, said = toolkit_for_builds(problem)
    if found:
        out.append(Check("CUDA_HOME", "info", said, f"only for builds outside popkit: export CUDA_HOME={found}"))
    elif problem:
        out.append(Check("CUDA_HOME", "problem", problem[0], problem[1]))
    elif os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        out.append(Check("CUDA_HOME", "ok", str(home)))
    else:
        out.append(Check("CUDA_HOME", "info", f"unset (torch will use {home})",
                         f"export CUDA_HOME={home} to make the choice explicit"))
    if not nvcc:
        out.append(Check("nvcc", "problem", "not found",
                         f"install the CUDA {info['cuda'].split('.')[0]} toolkit and set CUDA_HOME to it (load_inline "
                         "compiles .cu sources with nvcc)"))
        return out
    version = nvcc_version(nvcc)
    if version is None:
        out.append(Check("nvcc", "problem", f"{nvcc} does not run", "reinstall the CUDA toolkit"))
        return out
    torch_major, nvcc_major = info["cuda"].split(".")[0], version.split(".")[0]
    if torch_major != nvcc_major:
        out.append(Check("nvcc", "problem", f"{version} at {nvcc}, torch uses CUDA {info['cuda']}",
                         f"the major versions differ: torch refuses to build (or the build fails to load); install "
                         f"CUDA {torch_major}.x and point CUDA_HOME at it, or install a torch built for CUDA {nvcc_major}"))
    else:
        out.append(Check("nvcc", "ok", f"{version} at {nvcc} (torch: CUDA {info['cuda']})"))
    arch = info.get("arch")
    if arch and arch.startswith("sm_"):
        listed = _run([nvcc, "--list-gpu-arch"]) or ""
        if listed and f"compute_{arch[3:]}" not in listed:
            out.append(Check("nvcc arch", "problem", f"nvcc {version} cannot build for {arch}",
                             "install a CUDA toolkit that supports this GPU (see nvcc --list-gpu-arch)"))
    return out


def _tool_checks(info: Mapping[str, Any]) -> list[Check]:
    out = []
    ninja = shutil.which("ninja") or (str(Path(sys.executable).parent / "ninja")
                                      if (Path(sys.executable).parent / "ninja").is_file() else None)
    version = _run([ninja, "--version"]) if ninja else None
    out.append(Check("ninja", "ok" if version else "problem", f"{version} at {ninja}" if version else "not found",
                     "" if version else "pip install ninja (load_inline builds with it)"))
    cxx = os.environ.get("CXX") or "c++"
    path = shutil.which(cxx)
    first = (_run([path, "--version"]) or "").splitlines()[:1] if path else []
    fix = "" if first else f"install a C++ compiler ({'clang' if 'clang' in cxx else 'g++'}) or set CXX to one"
    out.append(Check("host compiler", "ok" if first else "problem", f"{cxx}: {first[0]}" if first else f"{cxx} not found",
                     fix))
    return out


def _popcorn_checks() -> list[Check]:
    """popcorn-cli found and registered by the same rules `popkit submit` applies (popkit.popcorn)."""
    try:
        found = popcorn.find_popcorn()
    except PopcornError as exc:
        return [Check("popcorn-cli", "warn", "not found" if "not found" in exc.message else exc.message,
                      f"needed only by `popkit submit`: {exc.hint}")]
    version = (_run([found, "--version"]) or "").splitlines()[:1]
    out = [Check("popcorn-cli", "ok", found + (f" ({version[0]})" if version else ""))]
    problem = popcorn.registration_problem()
    out.append(Check("popcorn registration", "warn" if problem else "ok", problem or str(popcorn.config_path()),
                     popcorn.REGISTER_HINT if problem else ""))
    return out


def _cache_checks(info: Mapping[str, Any], python: str) -> list[Check]:
    """Old builds in torch's default extension folder: loaded by a newer torch they fail with `undefined symbol`."""
    if not (info.get("cuda") or info.get("hip")) or not info.get("torch_dir"):
        return []
    try:
        tools = toolchain(python)
    except PopkitError:  # the checks above already report a broken interpreter
        return []
    root = default_extensions_root(tools)
    if not root.is_dir():
        return [Check("extension cache", "ok", f"{root} (empty)")]
    libtorch = next(iter(Path(info["torch_dir"], "lib").glob("libtorch*.so")), None)
    installed = libtorch.stat().st_mtime if libtorch else 0
    old = [so for so in root.glob("*/*.so") if so.stat().st_mtime < installed]
    out = []
    if old:
        out.append(Check("extension cache", "warn", f"{len(old)} build(s) in {root} are older than this torch",
                         "an extension built against another torch fails to load with `undefined symbol` (an ABI "
                         f"mismatch): delete {root} and let it rebuild"))
    else:
        out.append(Check("extension cache", "ok", str(root)))
    for lock in find_locks(root):
        state = lock_state(lock, tools.lock_style)
        if state == "stale":
            out.append(Check("build lock", "problem", f"{lock} (left by a killed build)",
                             f"rm {lock}: load_inline would wait for it forever"))
    return out
