"""HIP kernel logic on an NVIDIA GPU (`popkit test --hip-on-cuda`): a logic check, not AMD timing.

The run is the task's own, on the user's unchanged file; only the build differs. Every child gets
popkit/toolchain/hip_on_cuda/site on its PYTHONPATH, whose sitecustomize wraps load_inline: the AMD flags go,
and popkit's include folder (popkit/toolchain/hip_on_cuda/include) comes first, so `#include <hip/hip_runtime.h>`
gets popkit_hip_on_cuda.h, a small mapping of the HIP API that popkit's templates and examples use
onto CUDA (HIP 5.2's own NVIDIA headers do not compile against CUDA 13). nvcc then builds the HIP
source as CUDA.

CUDA warps have 32 lanes where AMD wavefronts have 64, so code that depends on the wavefront width
runs differently here; wave64_warnings() points at such lines.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from popkit.errors import UsageError
from popkit.model.diagnostics import Diagnostic, string_literals
from popkit.toolchain.hipcheck import detect_target

LABEL = "hip-on-cuda"
ENV_VAR = "POPKIT_HIP_ON_CUDA"  # the include folder; set, it turns the start-up hook on
NOTE = ("HIP on CUDA: a logic check, not AMD timing. The HIP kernels were built with nvcc through popkit's "
        "HIP-to-CUDA mapping and ran on an NVIDIA GPU (32-lane warps); AMD timing and 64-lane wavefront "
        "behaviour were not tested.")
_ROOT = Path(__file__).resolve().parent / "hip_on_cuda"

# Code whose behaviour depends on 64-lane wavefronts: (pattern, why).
_WAVE64 = (
    (re.compile(r"\b0x[fF]{16}(?:[uU]?[lL]{0,2})?\b"),
     "a 64-lane mask: a CUDA warp has 32 lanes, so its upper 32 bits match no lane"),
    (re.compile(r"\bwarpSize\s*[=!<>]=?\s*64\b|\b64\s*[=!<>]=?\s*warpSize\b"),
     "compares warpSize with 64: warpSize is 32 on NVIDIA"),
    (re.compile(r"\b__shfl(?:_up|_down|_xor)?\s*\(.*,\s*64\s*\)"),
     "a __shfl width of 64: a CUDA warp has 32 lanes"),
    (re.compile(r"\b__ballot\s*\("),
     "__ballot gives 64 lanes' bits on AMD and 32 here: code that reads the upper 32 bits differs"),
    (re.compile(r"(?:#define\s+|\b(?:constexpr|const)\s+\w+\s+)\w*(?:WARP|WAVE|Warp|Wave)\w*\s*=?\s*64\b"),
     "a wavefront width of 64 written as a constant: CUDA warps have 32 lanes"),
    (re.compile(r"\b__AMDGCN_WAVEFRONT_SIZE\b|\b__builtin_amdgcn_\w+"),
     "an AMD-only builtin: it has no CUDA counterpart, so the HIP-on-CUDA build cannot compile it"),
)


def include_dir() -> Path:
    return _ROOT / "include"


def site_dir() -> Path:
    return _ROOT / "site"


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment entries that turn the mapping on in every child of a run."""
    environ = dict(os.environ) if environ is None else environ
    path = os.pathsep.join(p for p in (str(site_dir()), environ.get("PYTHONPATH", "")) if p)
    return {ENV_VAR: str(include_dir()), "PYTHONPATH": path}


def require_hip(text: str, path: str) -> None:
    if detect_target(text) != "hip":
        raise UsageError(f"{path}: --hip-on-cuda runs HIP submissions, and this file shows no sign of HIP",
                         "run a CUDA file without --hip-on-cuda")


def wave64_warnings(text: str, path: str) -> list[Diagnostic]:
    """Lines of the C++ sources (string literals) whose behaviour depends on 64-lane wavefronts."""
    lines = text.splitlines()
    source_lines = sorted({pos[0] for lit in string_literals(text) if "\n" in lit.value for pos in lit.positions})
    out = []
    for n in source_lines:
        code = lines[n - 1].split("//", 1)[0] if 0 < n <= len(lines) else ""
        for pattern, why in _WAVE64:
            m = pattern.search(code)
            if m:
                out.append(Diagnostic("warning", "wave64", f"depends on the wavefront width: {why}", path, n,
                                      m.start() + 1, lines[n - 1], "",
                                      "on the AMD GPU this line sees 64 lanes; the HIP-on-CUDA check ran it on 32"))
    return out


def notes_for(text: str, path: str) -> tuple[str, ...]:
    """The run's notes: what the check is, then one line per wavefront-width warning."""
    return (NOTE, *(f"warning: {d.location}: {d.message}" for d in wave64_warnings(text, path)))
