"""The environment: a probe of an interpreter (for run reports) and `popkit doctor`'s checks.

Every external program runs with a timeout; nothing here raises on a broken interpreter or tool:
a failure becomes a field ("error") or a check with its fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

PROBE_KEYS = ("python", "platform", "torch", "cuda", "hip", "device", "arch", "gpu_count")
TOOL_TIMEOUT_S = 15.0

_PROBE_SCRIPT = r"""
import json, platform, sys
out = {"python": platform.python_version(), "platform": platform.platform(), "torch": None, "cuda": None,
       "hip": None, "device": "cpu", "arch": None, "gpu_count": 0}
extended = len(sys.argv) > 1 and sys.argv[1] == "extended"
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
        if out["hip"]:
            out["arch"] = (getattr(props, "gcnArchName", "") or "").split(":")[0] or None
        else:
            major, minor = torch.cuda.get_device_capability(0)
            out["arch"] = "sm_%d%d" % (major, minor)
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""


def probe(python: str | None = None, timeout: float = 60.0) -> dict:
    """{python, platform, torch, cuda, hip, device ('cpu' or the GPU's name), arch, gpu_count} of `python`.

    Runs a tiny script in that interpreter (default: this one) with a timeout of `timeout` seconds.
    Never raises: what could not be learned is None, and "error" says why.
    """
    return _probe(python or sys.executable, timeout, extended=False)


def _probe(python: str, timeout: float, extended: bool) -> dict:
    empty: dict[str, Any] = {k: None for k in PROBE_KEYS}
    empty.update(device="cpu", gpu_count=0)
    try:
        done = subprocess.run([python, "-c", _PROBE_SCRIPT] + (["extended"] if extended else []),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
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
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": len(self.problems), "checks": [c.to_json() for c in self.checks],
                "system": dict(self.system)}


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


def find_popcorn() -> str | None:
    """popcorn-cli: POPKIT_POPCORN, then `popcorn-cli` or `popcorn` on PATH."""
    explicit = os.environ.get("POPKIT_POPCORN")
    if explicit:
        return explicit if (Path(explicit).is_file() or shutil.which(explicit)) else None
    return shutil.which("popcorn-cli") or shutil.which("popcorn")


def doctor(python: str | None = None) -> DoctorReport:
    """Check what building and running kernels needs; each problem carries its fix."""
    from popkit.compile import find_nvcc

    python = python or sys.executable
    info = _probe(python, 90.0, extended=True)
    checks = [Check("python", "ok" if info.get("python") else "problem", info.get("python") or "unknown",
                    "" if info.get("python") else info.get("error", ""))]
    checks += _torch_checks(info)
    checks += _cuda_checks(info, find_nvcc())
    checks += _tool_checks(info)
    checks += _popcorn_checks()
    checks += _cache_checks(info, python)
    return DoctorReport(checks=tuple(checks), system={k: info.get(k) for k in PROBE_KEYS})


def _torch_checks(info: Mapping[str, Any]) -> list[Check]:
    if not info.get("torch"):
        return [Check("torch", "problem", "not importable" + (f" ({info['error']})" if info.get("error") else ""),
                      "pip install torch (a CUDA build: see the install selector on the PyTorch site)")]
    backend = f"CUDA {info['cuda']}" if info.get("cuda") else f"ROCm {info['hip']}" if info.get("hip") else "CPU only"
    out = [Check("torch", "ok" if backend != "CPU only" else "warn", f"{info['torch']} ({backend})",
                 "" if backend != "CPU only" else "a CPU-only torch cannot build CUDA or HIP extensions: "
                 "install a CUDA build of torch")]
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
                         "the bundled tasks' references on the CPU"))
    return out


def _cuda_checks(info: Mapping[str, Any], nvcc: str | None) -> list[Check]:
    if not info.get("cuda"):
        if info.get("hip"):
            hipcc = shutil.which("hipcc") or (str(Path(os.environ.get("ROCM_HOME", "/opt/rocm")) / "bin" / "hipcc"))
            found = Path(hipcc).is_file()
            return [Check("hipcc", "ok" if found else "problem", hipcc if found else "not found",
                          "" if found else "install ROCm and set ROCM_HOME (load_inline builds HIP with it)")]
        return []
    from popkit.compile import cuda_home, cuda_home_problem

    out = []
    problem = cuda_home_problem()
    home = cuda_home()
    if problem:
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
    found = find_popcorn()
    if not found:
        return [Check("popcorn-cli", "warn", "not found",
                      "needed only by `popkit submit`: install popcorn-cli and put it on PATH (as popcorn-cli or "
                      "popcorn), or set POPKIT_POPCORN to its path")]
    version = (_run([found, "--version"]) or "").splitlines()[:1]
    out = [Check("popcorn-cli", "ok", found + (f" ({version[0]})" if version else ""))]
    config = Path.home() / ".popcorn.yaml"
    registered = config.is_file() and config.stat().st_size > 0
    out.append(Check("popcorn registration", "ok" if registered else "warn",
                     str(config) if registered else f"{config} missing",
                     "" if registered else "run `popcorn-cli register discord` (or github) once"))
    return out


def _cache_checks(info: Mapping[str, Any], python: str) -> list[Check]:
    """Old builds in torch's default extension folder: loaded by a newer torch they fail with `undefined symbol`."""
    if not (info.get("cuda") or info.get("hip")) or not info.get("torch_dir"):
        return []
    from popkit.compile import default_extensions_root, find_locks, lock_state, toolchain
    from popkit.errors import PopkitError

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
