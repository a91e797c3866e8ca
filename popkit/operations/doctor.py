"""`popkit doctor`: what building and running kernels needs here, each problem with its fix.

Checks Python, torch (and whether it is a CPU-only build), numpy, the CUDA toolkit torch will build with,
ninja and the compiler, the HIP device build (clang, device libraries), popcorn-cli and its registration,
and torch's extension build cache (locks). The environment facts come from popkit.machine.system.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from popkit.errors import PopcornError, PopkitError
from popkit.ledger import popcorn
from popkit.machine import system
from popkit.machine.cputorch import CANNOT_BUILD, SECOND_VENV
from popkit.run import sandbox
from popkit.toolchain import hipbuild
from popkit.toolchain.locks import find_locks, lock_state


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
        done = subprocess.run(argv, capture_output=True, text=True, timeout=system.TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)
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
    scripts = sandbox.scripts_for()  # the interpreter runs as the evals run it
    info = system.probe_torch(python, 90.0, extended=True, scripts=scripts)
    checks = [Check("python", "ok" if info.get("python") else "problem", info.get("python") or "unknown",
                    "" if info.get("python") else info.get("error", ""))]
    checks += _torch_checks(info)
    checks += _numpy_checks(info, python)
    checks += _cuda_checks(info, system.find_nvcc())
    checks += _tool_checks(info)
    checks += _hip_device_checks(info)
    checks += _popcorn_checks()
    checks += _cache_checks(info, python, scripts)
    return DoctorReport(checks=tuple(checks), system={k: info.get(k) for k in system.PROBE_KEYS})


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
        # A CPU-only torch builds nothing, but the toolkit is half of what a second venv's CUDA torch needs.
        version = nvcc_version(nvcc) if nvcc else None
        return [Check("nvcc", "info", f"{version} at {nvcc}" if version else "not found",
                      "with a CUDA build of torch of the same major version in a second venv, `popkit compile FILE "
                      "--python VENV/bin/python` builds CUDA files here (README: CUDA builds on a CPU machine)")]
    out = []
    problem = system.cuda_home_problem()
    home = system.cuda_home()
    found, said = system.toolkit_for_builds(problem)
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
    """popcorn-cli found and registered by the same rules `popkit submit` applies (popkit.ledger.popcorn)."""
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


def _cache_checks(info: Mapping[str, Any], python: str, scripts: system.Scripts = system.plain) -> list[Check]:
    """Old builds in torch's default extension folder: loaded by a newer torch they fail with `undefined symbol`."""
    if not (info.get("cuda") or info.get("hip")) or not info.get("torch_dir"):
        return []
    try:
        tools = system.toolchain(python, scripts=scripts)
    except PopkitError:  # the checks above already report a broken interpreter
        return []
    root = system.default_extensions_root(tools)
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
