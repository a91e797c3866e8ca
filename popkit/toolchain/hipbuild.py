"""A real AMD GPU build of a HIP submission's kernels, on a machine without ROCm.

A HIP submission holds its kernels in `DEVICE_SRC` (no torch header) and its torch wrapper in
`HOST_SRC`; load_inline gets both, concatenated. Where no ROCm build of torch is installed, popkit
compiles DEVICE_SRC alone for the target (gfx942 by default) with clang's AMDGPU backend
(`--cuda-device-only -S`), links ROCm's device libraries (ocml/ockl, so math calls are inlined and
the register counts are the real ones), and reads the compiler's `kernel-resource-usage` remarks:
VGPR/SGPR/AGPR, LDS, scratch, spills and occupancy per kernel. Compiler errors are mapped to lines
of the submission as CUDA build errors are (diagnostics.py).

Device libraries: Debian's rocm-device-libs (5.2) ship bitcode for gfx940 but not gfx942. Only one
file of them is architecture-specific, `oclc_isa_version_<N>.bc`, a single constant
(`__oclc_ISA_version`, 9400 for gfx940); the math and kernel libraries are generic. When the
target's file is missing, popkit writes it (the same constant, e.g. 9402 for gfx942) into a
temporary folder beside links to the installed libraries. Linking gfx940's file instead would tell
the libraries they run on another chip; building with -nogpulib would leave math calls as external
calls, and the compiler then reports a dynamic stack and inflated register counts.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Sequence

from popkit.model.diagnostics import Diagnostic, SourceMap, demangle, map_diagnostics, parse_log

DEFAULT_ARCH = "gfx942"
DEVICE_VAR = "DEVICE_SRC"
DEVICE_FILE = "device.hip"  # the name the kernels are compiled under (diagnostics.GENERATED_NAMES)
CLANG_NAMES = ("clang++-19", "clang++-20", "clang++-18", "clang++-17", "/opt/rocm/llvm/bin/clang++", "clang++")
DEVICE_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu/amdgcn/bitcode", "/usr/lib/aarch64-linux-gnu/amdgcn/bitcode",
                   "/opt/rocm/amdgcn/bitcode", "/opt/rocm/lib/llvm/lib/clang/*/lib/amdgcn/bitcode")
HIP_INCLUDE_DIRS = ("/usr/include", "/opt/rocm/include")
# What to install (Debian/Ubuntu) for each missing piece.
PACKAGES = {"compiler": "clang-19", "device libraries": "rocm-device-libs", "HIP headers": "libamdhip64-dev"}
# Flags of the submission's extra_cuda_cflags that change device code; the rest are host or hipcc flags.
_PASS_FLAGS = re.compile(r"^(?:-O\w*|-std=\S+|-D\S+|-U\S+|-ffast-math|-fno-\S+|-f(?:un)?safe-math\S*|-munsafe-fp-atomics)$")
_REMARK = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): remark:\s+(?P<key>[^:]+?): (?P<value>.*?)"
                     r"\s*\[-Rpass-analysis=kernel-resource-usage\]$")
_USAGE_KEYS = {"SGPRs": "sgprs", "VGPRs": "vgprs", "AGPRs": "agprs", "ScratchSize [bytes/lane]": "scratch_bytes",
               "Occupancy [waves/SIMD]": "occupancy", "SGPRs Spill": "sgpr_spills", "VGPRs Spill": "vgpr_spills",
               "LDS Size [bytes/block]": "lds_bytes"}
_ARCH = re.compile(r"^gfx(?P<major>\d{1,2})(?P<minor>[0-9a-f])(?P<step>[0-9a-f])$")


@dataclass(frozen=True)
class HipTools:
    """What a device build needs; None where it is missing."""

    clang: str | None
    version: str
    device_libs: str | None
    include: str | None

    @property
    def missing(self) -> dict[str, str]:
        """Missing piece -> the package that provides it."""
        have = {"compiler": self.clang, "device libraries": self.device_libs, "HIP headers": self.include}
        return {what: PACKAGES[what] for what, found in have.items() if not found}

    @property
    def install_hint(self) -> str:
        return "apt-get install -y " + " ".join(self.missing.values())


@dataclass(frozen=True)
class KernelUsage:
    """What the compiler reports about one kernel (per work-item registers, per block LDS)."""

    name: str  # demangled, without parameters
    symbol: str
    line: int | None  # the kernel's line in the submission
    vgprs: int = 0
    sgprs: int = 0
    agprs: int = 0
    lds_bytes: int = 0
    scratch_bytes: int = 0  # per lane
    vgpr_spills: int = 0
    sgpr_spills: int = 0
    occupancy: int | None = None  # waves per SIMD
    dynamic_stack: bool = False

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class DeviceBuild:
    arch: str
    compiler: str
    ok: bool
    seconds: float
    kernels: tuple[KernelUsage, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = ()
    command: tuple[str, ...] = ()
    log: str = ""


@functools.lru_cache(maxsize=None)
def find_tools() -> HipTools:
    clang, version = None, ""
    for name in CLANG_NAMES:
        path = shutil.which(name)
        if path and _has_amdgpu(path):
            clang, version = path, _version(path)
            break
    libs = None
    for pattern in DEVICE_LIB_DIRS:
        for cand in sorted(Path("/").glob(pattern.lstrip("/")), reverse=True):
            if (cand / "ocml.bc").is_file() and (cand / "ockl.bc").is_file():
                libs = str(cand)
                break
        if libs:
            break
    include = next((d for d in HIP_INCLUDE_DIRS if (Path(d) / "hip" / "hip_runtime.h").is_file()), None)
    return HipTools(clang, version, libs, include)


def _has_amdgpu(clang: str) -> bool:
    try:
        out = subprocess.run([clang, "-print-targets"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "amdgcn" in out


def _version(clang: str) -> str:
    try:
        out = subprocess.run([clang, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    m = re.search(r"clang version (\S+)", out)
    return f"clang {m.group(1)}" if m else (out.splitlines()[0].strip() if out else "")


def is_arch(arch: str) -> bool:
    return bool(_ARCH.match(arch))


def isa_version(arch: str) -> int:
    """`__oclc_ISA_version` for an architecture: gfx942 -> 9402, gfx90a -> 9010, gfx1030 -> 10300."""
    m = _ARCH.match(arch)
    if not m:
        raise ValueError(f"not an AMD GPU architecture: {arch}")
    return int(m.group("major")) * 1000 + int(m.group("minor"), 16) * 100 + int(m.group("step"), 16)


def device_source(text: str) -> str | None:
    """The value of the module-level `DEVICE_SRC = "..."` string, None if the file has none."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if any(isinstance(t, ast.Name) and t.id == DEVICE_VAR for t in node.targets):
                return node.value.value
    return None


def submission_flags(text: str) -> list[str]:
    """The device-relevant flags among the string constants of the submission's extra_cuda_cflags."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    flags: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extra_cuda_cflags":
            for elt in getattr(node.value, "elts", []):
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str) and _PASS_FLAGS.match(elt.value):
                    flags.append(elt.value)
    return flags


def file_arch(text: str) -> str | None:
    """The architecture the file builds for (`--offload-arch=` or PYTORCH_ROCM_ARCH), if it names one."""
    m = re.search(r"--offload-arch=(gfx[0-9a-f]+)", text) or re.search(r"PYTORCH_ROCM_ARCH\"\]\s*=\s*\"(gfx[0-9a-f]+)", text)
    return m.group(1) if m else None


def compile_command(tools: HipTools, arch: str, source: Path, libs: str, flags: Sequence[str], out: Path) -> list[str]:
    std = [] if any(f.startswith("-std=") for f in flags) else ["-std=c++20"]
    opt = [] if any(f.startswith("-O") for f in flags) else ["-O3"]
    include = [] if tools.include == "/usr/include" else ["-isystem", str(tools.include)]  # not ahead of libc's
    return [str(tools.clang), "-x", "hip", f"--offload-arch={arch}", "--cuda-device-only", "-S",
            f"--rocm-device-lib-path={libs}", *include, *opt, *std, *flags,
            "-Rpass-analysis=kernel-resource-usage", "-fno-color-diagnostics", "-o", str(out), str(source)]


def build_device(text: str, path: str, arch: str = DEFAULT_ARCH, tools: HipTools | None = None,
                 timeout_s: float = 300.0) -> DeviceBuild:
    """Compile the submission's DEVICE_SRC for `arch`; the caller checks that tools and source exist."""
    tools = tools or find_tools()
    source = device_source(text)
    if source is None or tools.missing:
        raise ValueError("build_device needs DEVICE_SRC and every tool (see HipTools.missing)")
    smap = SourceMap(path, text)
    with tempfile.TemporaryDirectory(prefix="popkit-hip-") as tmp:
        work = Path(tmp)
        device = work / DEVICE_FILE
        device.write_text(source)
        libs = device_libs_for(arch, Path(tools.device_libs), work / "bitcode")
        cmd = compile_command(tools, arch, device, str(libs), submission_flags(text), work / "device.s")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=work)
            log, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            log, code = f"the device build ran past {timeout_s:.0f} s and was stopped", -1
        seconds = time.monotonic() - t0
        diagnostics = map_diagnostics(parse_log(log, "clang"), smap, work)
        kernels = parse_usage(log, smap, source)
    if code != 0 and not any(d.severity == "error" for d in diagnostics):
        first = next((ln for ln in log.splitlines() if "error" in ln), log.strip().splitlines()[-1] if log.strip() else "")
        hint = (f"{tools.version} does not know {arch}: install a newer clang (gfx950 needs clang 20)"
                if "invalid target ID" in first else "")
        diagnostics.append(Diagnostic("error", "clang", first[:500] or f"clang exited with code {code}", path, hint=hint))
    return DeviceBuild(arch=arch, compiler=tools.version, ok=code == 0, seconds=seconds, kernels=tuple(kernels),
                       diagnostics=tuple(diagnostics), command=tuple(cmd), log=log)


def device_libs_for(arch: str, installed: Path, scratch: Path) -> Path:
    """The installed device-library folder if it has `arch`'s ISA file, else `scratch` with that file added."""
    name = f"oclc_isa_version_{arch[3:]}.bc"
    if (installed / name).is_file():
        return installed
    scratch.mkdir(parents=True, exist_ok=True)
    for lib in installed.glob("*.bc"):
        os.symlink(lib, scratch / lib.name)
    ir = scratch / "isa.ll"
    ir.write_text('target triple = "amdgcn-amd-amdhsa"\n'
                  f"@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 "
                  f"{isa_version(arch)}, align 4\n")
    clang = find_tools().clang
    subprocess.run([str(clang), "-target", "amdgcn-amd-amdhsa", "-nogpulib", "-c", "-emit-llvm", "-x", "ir",
                    str(ir), "-o", str(scratch / name)], capture_output=True, timeout=60, check=True)
    return scratch


def parse_usage(log: str, smap: SourceMap | None = None, generated: str | None = None) -> list[KernelUsage]:
    """One KernelUsage per `Function Name:` block of kernel-resource-usage remarks, in order."""
    kernels: list[dict[str, Any]] = []
    for text in log.splitlines():
        m = _REMARK.match(text.rstrip())
        if not m:
            continue
        key, value = m.group("key").strip(), m.group("value").strip()
        if key == "Function Name":
            line, mapped = int(m.group("line")), None
            if smap is not None and generated is not None:
                mapped = smap.map(generated, _signature_start(generated, line), None)
            kernels.append({"symbol": value, "name": kernel_name(value), "line": mapped[0] if mapped else None})
        elif kernels and key == "Dynamic Stack":
            kernels[-1]["dynamic_stack"] = value == "True"
        elif kernels and key in _USAGE_KEYS:
            try:
                kernels[-1][_USAGE_KEYS[key]] = int(value)
            except ValueError:
                continue
    return [KernelUsage(**k) for k in kernels]


def _signature_start(generated: str, line: int) -> int:
    """The remark points at the kernel's body (its `{` line); a long signature starts at `__global__` above."""
    lines = generated.splitlines()
    for n in range(min(line, len(lines)), max(line - 30, 0), -1):
        if "__global__" in lines[n - 1]:
            return n
    return line


def kernel_name(symbol: str) -> str:
    """`_Z20softmax_block_kernelILi64ELi1EEvPKfPfi` -> `softmax_block_kernel<64, 1>`."""
    text = demangle(symbol)
    if text == symbol:
        return symbol
    text = re.sub(r"^void\s+", "", text)
    depth = 0
    for i, ch in enumerate(text):  # cut at the parameter list's "(" outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return text[:i]
    return text
