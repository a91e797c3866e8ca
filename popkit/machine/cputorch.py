"""A CPU-only torch and the one way out popkit gives for CUDA builds on such a machine.

The README's quick start installs the CPU build of torch on a machine without a GPU (200 MB instead of
3 GB). That torch cannot build CUDA extensions, so `popkit test` of a CUDA file, `popkit compile` and
`popkit doctor` must all say the same thing about it: the CUDA build of torch goes into a second virtual
environment and `popkit compile FILE --python VENV/bin/python` builds with it (compile imports the file in
that interpreter; popkit itself stays where it is). Which build an interpreter has is read from its
`torch/version.py` without importing torch (milliseconds instead of seconds).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

# The one wording, in docs/cpu.md's "CUDA builds on a CPU machine" too (tests/test_cli_cpu_torch.py checks it).
SECOND_VENV = ("put the CUDA build of torch in a second venv (about 3 GB): python3 -m venv ~/popkit-cuda && "
               "~/popkit-cuda/bin/pip install torch ninja numpy, then build with `popkit compile FILE --python "
               "~/popkit-cuda/bin/python` (docs/cpu.md: CUDA builds on a CPU machine)")
CANNOT_BUILD = "a CPU-only torch cannot build CUDA extensions"

_FIND = ("import importlib.util, sys\ns = importlib.util.find_spec('torch')\n"
         "print(list(s.submodule_search_locations or [])[0] if s else '')")
_UNKNOWN = "unknown"


def version_file_backend(text: str) -> str | None:
    """`cuda`, `hip` or `cpu` from the text of torch/version.py (its `cuda = '13.0'` / `hip = ...` lines);
    None when the file says neither (not a torch version file)."""
    values: dict[str, object] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
            values[target.id] = node.value.value  # type: ignore[union-attr]
    if "cuda" not in values and "hip" not in values:
        return None
    return "cuda" if values.get("cuda") else "hip" if values.get("hip") else "cpu"


def torch_folder(python: str = sys.executable, timeout_s: float = 20.0) -> Path | None:
    """The torch package folder `python` would import, found without importing torch; None without torch."""
    if python == sys.executable:
        spec = importlib.util.find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    try:
        out = subprocess.run([python, "-c", _FIND], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    return Path(line) if line else None


def torch_backend(python: str = sys.executable) -> str | None:
    """`cuda`, `hip` or `cpu` for the torch `python` imports; None without torch or when unreadable."""
    folder = torch_folder(python)
    try:
        return version_file_backend((folder / "version.py").read_text()) if folder else None
    except OSError:
        return None


def is_cpu_only(python: str = sys.executable) -> bool:
    """True only when `python` has a torch and it is the CPU-only build."""
    return torch_backend(python) == "cpu"


def no_gpu_message(submission: Path | str, command: str, cpu_only: bool, target: str = "cuda") -> tuple[str, str]:
    """(message, hint) for `popkit test|bench` of a file that builds a kernel, on a machine without a GPU.

    `target` is the file's (hipcheck.detect_target: `cuda` or `hip`). A HIP file needs an AMD GPU with a ROCm
    torch, and says so. For CUDA: with a CUDA build of torch here, `popkit compile` checks the build on this
    machine; with a CPU-only torch it cannot, and the hint says what can (the second venv) instead of sending the
    user to a refusal.
    """
    if target == "hip":
        return (f"this machine has no AMD GPU: a HIP file's kernels run on an AMD GPU with a ROCm build of torch, "
                f"and `popkit {command}` needs one",
                f"`popkit compile {submission}` checks it here (its kernels built for the AMD GPU where clang's AMDGPU "
                f"backend is installed: popkit doctor checks); `popkit test --hip-on-cuda {submission}` runs their "
                "logic on an NVIDIA GPU")
    message = f"this machine has no CUDA GPU: `popkit compile` builds it, `popkit {command}` needs a GPU"
    elsewhere = f"run `popkit {command}` on a machine with a GPU (a pure-PyTorch submission runs on the CPU)"
    if cpu_only:
        return message, f"{CANNOT_BUILD}, so `popkit compile` cannot check it here either: " \
                        f"{SECOND_VENV.replace('FILE', str(submission))}; {elsewhere}"
    return message, f"`popkit compile {submission}` checks the build here; {elsewhere}"
