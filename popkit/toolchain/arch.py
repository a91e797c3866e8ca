"""Which NVIDIA architecture a compile-only build targets (`popkit compile`), and why, in words.

torch's load_inline builds for TORCH_CUDA_ARCH_LIST, else for the GPUs it sees. With no GPU and no list
it raises a bare `IndexError: list index out of range` from inside torch (`_get_cuda_arch_flags`), which
is where every public problem-set example landed on a CPU machine with a CUDA build of torch. popkit
therefore always decides, in this order, and the report says which rule picked the architecture:

1. TORCH_CUDA_ARCH_LIST set in the environment: kept as it is;
2. a GPU on this machine: its architecture (NVML names it; where it cannot, torch picks);
3. the file's `#!POPCORN gpu NAME` directive;
4. the task's GPU list (its problem set's `gpus:`), the first one the toolkit can build for;
5. popkit's default, H100 (sm_90a).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from popkit.model.gpus import DEFAULT_GPU, NVIDIA, Gpu, leaderboard_gpu

_COMPUTE = re.compile(r"compute_(\d+)([a-z]?)")


@dataclass(frozen=True)
class ArchChoice:
    """TORCH_CUDA_ARCH_LIST for the build (None: let torch pick from the local GPU) and the rule that chose it."""

    arch_list: str | None
    why: str  # e.g. "from `#!POPCORN gpu H100` (line 2)"

    @property
    def note(self) -> str:
        shown = f"TORCH_CUDA_ARCH_LIST={self.arch_list}" if self.arch_list else "torch's choice"
        return f"architecture: {shown}, {self.why}"


def gpu_for(name: str | None) -> Gpu | None:
    """The NVIDIA GPU a leaderboard name stands for; a runner's variant (`B200_Nebius`) counts as its card."""
    if not name:
        return None
    gpu = leaderboard_gpu(name) or leaderboard_gpu(re.split(r"[_\s-]", name, maxsplit=1)[0])
    return gpu if gpu is not None and gpu.vendor == NVIDIA else None


def cc_arch(sm: str) -> str:
    """`sm_90` (NVML's spelling) -> `9.0a` (TORCH_CUDA_ARCH_LIST's), the arch-specific variant from 9.0 on as
    gpus.Gpu.torch_arch builds for a leaderboard GPU, so that wgmma/tcgen05 code builds for the local card too."""
    digits = sm.removeprefix("sm_").rstrip("a")
    major, minor = digits[:-1], digits[-1]
    return f"{major}.{minor}" + ("a" if int(major) >= 9 else "")


def supported_archs(nvcc: str | None, timeout_s: float = 20.0) -> set[str] | None:
    """The architectures nvcc can build for, as TORCH_CUDA_ARCH_LIST entries without the `a` (`9.0`);
    None when unknown (no nvcc, or one too old for --list-gpu-arch)."""
    if not nvcc:
        return None
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return None
    found = {f"{m.group(1)[:-1]}.{m.group(1)[-1]}" for m in _COMPUTE.finditer(out.stdout)}
    return found or None


def _buildable(gpu: Gpu, supported: set[str] | None) -> bool:
    return supported is None or (gpu.torch_arch or "").rstrip("a") in supported


def choose_arch(*, env_list: str | None, local_archs: Sequence[str] | None, local_gpu: bool,
                directive_gpu: str | None, directive_line: int | None, task_gpus: Iterable[str],
                task_label: str, supported: Callable[[], set[str] | None] = lambda: None) -> ArchChoice:
    """Apply the module doc's order. `local_archs`: the local GPUs' `sm_XY` as NVML reports them (None when
    NVML cannot say); `local_gpu`: a GPU may be here; `task_label`: how to name the task (`vectoradd_v2`);
    `supported`: what the toolkit builds (supported_archs), asked only when the task's GPU list decides."""
    if env_list:
        return ArchChoice(env_list, "from TORCH_CUDA_ARCH_LIST in the environment")
    if local_archs:
        archs = sorted({cc_arch(sm) for sm in local_archs})
        return ArchChoice(";".join(archs), f"this machine's GPU ({', '.join(sorted(set(local_archs)))})")
    if local_gpu:
        return ArchChoice(None, "this machine's GPU (torch reads its architecture)")
    directive = gpu_for(directive_gpu)
    if directive is not None:
        where = f" (line {directive_line})" if directive_line else ""
        return ArchChoice(directive.torch_arch, f"no GPU here: from `#!POPCORN gpu {directive_gpu}`{where}")
    names = [n for n in task_gpus if gpu_for(n) is not None]
    buildable = supported() if names else None
    for name in names:
        gpu = gpu_for(name)
        if gpu is not None and _buildable(gpu, buildable):
            others = f" (its GPUs: {', '.join(names)})" if len(names) > 1 else ""
            return ArchChoice(gpu.torch_arch, f"no GPU here and no `#!POPCORN gpu` line: {name}, the first GPU "
                                              f"of task `{task_label}`{others}")
    default = gpu_for(DEFAULT_GPU[NVIDIA])
    assert default is not None  # the table has H100
    return ArchChoice(default.torch_arch, f"no GPU here, no `#!POPCORN gpu` line and no GPU in the task: "
                                          f"popkit's default, {default.name} ({default.arch}); add "
                                          "`#!POPCORN gpu NAME` to build for another")
