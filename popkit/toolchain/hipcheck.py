"""Static checks of a HIP submission, for machines without ROCm (where it cannot be built).

They catch what fails on the AMD runner before any compiler runs: the environment set after torch
is imported, no `--offload-arch`, CUDA-only headers, calls, types and flags, PTX assembly, and
32-bit lane masks on 64-lane wavefronts.
"""

from __future__ import annotations

import ast
import re

from popkit.model.diagnostics import Diagnostic

_HIP_MARKERS = re.compile(r"PYTORCH_ROCM_ARCH|--offload-arch|#include\s*[<\"]hip/|\bhip[A-Z]\w*\s*\(")
# Modules whose import loads torch: torch itself and the task files the runner puts beside the submission.
_TORCH_IMPORTERS = ("torch", "reference", "task", "utils", "eval")
_HEADERS = {
    "cuda_runtime.h": "hip/hip_runtime.h", "cuda_runtime_api.h": "hip/hip_runtime_api.h", "cuda.h": "hip/hip_runtime.h",
    "cuda_fp16.h": "hip/hip_fp16.h", "cuda_bf16.h": "hip/hip_bf16.h", "cuda_fp8.h": "hip/hip_fp8.h",
    "mma.h": "rocwmma/rocwmma.hpp", "cooperative_groups.h": "hip/hip_cooperative_groups.h",
    "curand_kernel.h": "hiprand/hiprand_kernel.h", "cub/": "hipcub/hipcub.hpp", "cuda/": "(no HIP equivalent)",
    "cutlass": "(no HIP equivalent; see composable_kernel)", "cute/": "(no HIP equivalent; see composable_kernel)",
    "c10/cuda/": "c10/hip/", "ATen/cuda/": "ATen/hip/",
}
_INCLUDE = re.compile(r"#\s*include\s*[<\"](?P<h>[^>\"]+)[>\"]")
_CUDA_CALL = re.compile(r"\b(?P<name>cuda[A-Z]\w*)\s*\(")
_MASK32 = re.compile(r"\b(?P<fn>__(?:shfl(?:_up|_down|_xor)?|ballot|any|all)_sync)\s*\(\s*(?P<mask>0x[fF]{8}[uU]?)\b(?![0-9a-fA-F])")
_TYPES = {"__nv_bfloat16": "__hip_bfloat16", "__nv_bfloat162": "__hip_bfloat162",
          "__nv_fp8_e4m3": "__hip_fp8_e4m3_fnuz (gfx942) or __hip_fp8_e4m3 (gfx950)",
          "__nv_fp8_e5m2": "__hip_fp8_e5m2_fnuz (gfx942) or __hip_fp8_e5m2 (gfx950)"}
_PTX = re.compile(r"\basm\s*(?:volatile\s*)?\(\s*\"[^\"]*\b(?:mov|ld|st|cp|mma|wgmma|ldmatrix|bar|shfl)\.")
_NVCC_FLAGS = re.compile(r"[\"'](?P<flag>-arch=sm_\w+|-gencode\S*|--use_fast_math|-Xptxas\S*|--expt-\S+|-arch=compute_\w+)[\"']")


def detect_target(text: str) -> str:
    """`hip` when the file shows any sign of HIP (environment, --offload-arch, hip headers or calls), else `cuda`."""
    return "hip" if _HIP_MARKERS.search(text) else "cuda"


def hip_checks(text: str, path: str) -> list[Diagnostic]:
    """Problems the AMD runner would hit, each at its line of the submission."""
    lines = text.splitlines()
    out: list[Diagnostic] = []

    def add(severity: str, line: int | None, column: int | None, message: str, hint: str) -> None:
        source = lines[line - 1] if line and 0 < line <= len(lines) else ""
        out.append(Diagnostic(severity, "static", message, path, line, column, source, "", hint))

    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    env_lines, import_line = _environment(tree)
    for var, severity, value in (("PYTORCH_ROCM_ARCH", "error", "gfx942"), ("CXX", "warning", "clang++")):
        where = env_lines.get(var)
        fix = f'put os.environ["{var}"] = "{value}" before `import torch`'
        if where is None:
            add(severity, 1, 1, f"{var} is never set: the AMD runner expects it in os.environ before torch is imported",
                fix)
        elif import_line is not None and where > import_line:
            add("error", where, 1, f"{var} is set on line {where}, after torch is imported on line {import_line}: "
                "torch has already read the environment", fix)
    arch = _offload_arch(tree)
    if arch is None and "--offload-arch" not in text:
        call = _load_inline(tree)
        add("error", call.lineno if call else None, (call.col_offset + 1) if call else None,
            "no --offload-arch in extra_cuda_cflags: the build would not target the runner's GPU",
            'pass extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20"] to load_inline')
    rocm_arch = _env_value(tree, "PYTORCH_ROCM_ARCH")
    if arch and rocm_arch and arch[0] != rocm_arch:
        add("warning", arch[1], None, f"--offload-arch={arch[0]} differs from PYTORCH_ROCM_ARCH={rocm_arch}",
            "build for one architecture: use the same value in both")
    for n, line in enumerate(lines, 1):
        for m in _INCLUDE.finditer(line):
            header = m.group("h")
            for cuda, hip in _HEADERS.items():
                if header == cuda or (cuda.endswith("/") and header.startswith(cuda)) or header.startswith(cuda + "/"):
                    add("error", n, m.start() + 1, f"CUDA-only header <{header}> in a HIP submission",
                        f"use {hip}" if not hip.startswith("(") else hip.strip("()"))
        for m in _CUDA_CALL.finditer(line):
            name = m.group("name")
            add("error", n, m.start() + 1, f"CUDA runtime call `{name}` in a HIP submission",
                f"use `hip{name[4:]}`")
        for m in _MASK32.finditer(line):
            add("error", n, m.start() + 1, f"{m.group('fn')} with the 32-bit mask {m.group('mask')}: AMD wavefronts "
                "have 64 lanes, and HIP's *_sync functions require a 64-bit mask",
                f"use {m.group('fn').replace('_sync', '')}(...) without a mask, or the mask 0xffffffffffffffffULL")
        for cuda_type, hip_type in _TYPES.items():
            for m in re.finditer(rf"\b{cuda_type}\b", line):
                add("error", n, m.start() + 1, f"CUDA type `{cuda_type}` in a HIP submission", f"use {hip_type}")
        if _PTX.search(line):
            add("error", n, line.index("asm") + 1, "inline PTX assembly: AMD GPUs do not run PTX",
                "write it in C++ or with AMDGCN builtins (__builtin_amdgcn_*)")
        for m in re.finditer(r"\b(?:nvcuda::)?wmma::", line):
            add("error", n, m.start() + 1, "CUDA WMMA API in a HIP submission", "use rocWMMA or __builtin_amdgcn_mfma_*")
            break
        for m in _NVCC_FLAGS.finditer(line):
            add("error", n, m.start() + 2, f"nvcc-only flag {m.group('flag')} in a HIP build",
                "hipcc/clang flags: --offload-arch=gfx942, -O3, -ffast-math")
    return out


def _environment(tree: ast.Module) -> tuple[dict[str, int], int | None]:
    """Line of the first assignment of each environment variable, and of the first torch-loading import."""
    env: dict[str, int] = {}
    import_line = None
    for node in tree.body:
        for name, line in _env_assignments(node):
            env.setdefault(name, line)
        if import_line is None and _imports_torch(node):
            import_line = node.lineno
    return env, import_line


def _env_assignments(node: ast.stmt):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if isinstance(target, ast.Subscript) and _is_environ(target.value):
                    key = target.slice
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        yield key.value, sub.lineno
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if _is_environ(sub.func.value) and sub.func.attr in ("setdefault", "__setitem__") and sub.args:
                if isinstance(sub.args[0], ast.Constant):
                    yield str(sub.args[0].value), sub.lineno
            elif _is_environ(sub.func.value) and sub.func.attr == "update":
                for kw in sub.keywords:
                    if kw.arg:
                        yield kw.arg, sub.lineno
                for arg in sub.args:
                    for key in getattr(arg, "keys", []):
                        if isinstance(key, ast.Constant):
                            yield str(key.value), sub.lineno
            elif getattr(sub.func.value, "id", "") == "os" and sub.func.attr == "putenv" and sub.args:
                if isinstance(sub.args[0], ast.Constant):
                    yield str(sub.args[0].value), sub.lineno


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name) and node.id == "environ")


def _imports_torch(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in _TORCH_IMPORTERS for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in _TORCH_IMPORTERS
    return False


def _env_value(tree: ast.Module, var: str) -> str | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and _is_environ(target.value):
                    if isinstance(target.slice, ast.Constant) and target.slice.value == var:
                        return str(node.value.value)
    return None


def _load_inline(tree: ast.Module) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "load_inline":
            return node
    return None


def _offload_arch(tree: ast.Module) -> tuple[str, int] | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--offload-arch="):
            return node.value.split("=", 1)[1], node.lineno
    return None
