"""Nsight Compute for a submission's kernels (`popkit bench FILE --profile --profiler ncu`).

One benchmark case (the last: the one `ranking_by: last` ranks), one call of the submission after a
warm-up call, between cudaProfilerStart/Stop, under `ncu --csv --page raw --profile-from-start off
--metrics ...`. Per kernel: duration, achieved DRAM bandwidth and its share of peak, SM throughput as a
share of peak, registers per thread and achieved occupancy.

The raw CSV page: a header row of quoted column names ("ID", "Kernel Name", ..., one per metric), a row of
units ("nsecond", "Gbyte/second", "%", "register/thread"), then one row per profiled kernel; ncu's own
`==PROF==` lines come before it. Numbers may carry thousands separators.

A `ProfileRequest` carries the fields of a hosted profile request (benchmark_index, ncu_kernel_name of 1 to 1024
characters, ncu_kernel_name_base function/demangled/mangled, ncu_launch_count), refused as the server refuses
them: out of range, and on multi-GPU tasks. The hosted runner pins Nsight Compute 2025.2.1; a local version it
avoids (2026.2.0 gave NaN counters) is named in the report's warnings.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from popkit.errors import EnvironmentProblem, ExitCode, PopkitError, TaskError, UsageError
from popkit.model.tasks import Task
from popkit.run.executor import Executor

METRICS = {  # ncu metric -> field of Kernel
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes.sum.per_second": "dram_bytes_per_s",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "launch__registers_per_thread": "registers",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
}
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
_RATE = {"byte/second": 1.0, "Kbyte/second": 1e3, "Mbyte/second": 1e6, "Gbyte/second": 1e9,
         "Tbyte/second": 1e12}
DRIVER = "popkit_ncu_driver.py"
HOSTED_NCU = "2025.2.1"  # the version the leaderboard's runner pins
AVOIDED_NCU = {"2026.2.0": "it gave NaN counters there"}  # versions the hosted runner moved away from, and why
KERNEL_NAME_BASES = ("function", "demangled", "mangled")
KERNEL_NAME_MAX = 1024  # characters, as the server takes ncu_kernel_name
_DRIVER_SOURCE = '''"""popkit: one warmed-up call of the submission between cudaProfilerStart and Stop (for ncu)."""
import json
import sys

import torch
from reference import generate_input
from submission import custom_kernel

data = generate_input(**json.loads(sys.argv[1]))
custom_kernel(data)  # warm-up: builds, autotunes, first-call work
torch.cuda.synchronize()
torch.cuda.profiler.start()
custom_kernel(data)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
'''


@dataclass(frozen=True)
class ProfileRequest:
    """A profile request's fields as the server takes them; `benchmark_index` None is the last benchmark."""

    benchmark_index: int | None = None
    kernel_name: str | None = None
    kernel_name_base: str | None = None
    launch_count: int | None = None

    def validate(self, task: Task) -> int:
        """The benchmark index this request profiles; UsageError for what the server refuses."""
        if task.multi_gpu:
            raise UsageError(f"{task.name} is a multi-GPU task: the leaderboard refuses profile requests for it",
                             "profile a single-GPU task")
        if not task.benchmarks:
            raise TaskError(f"{task.yml}: no `benchmarks` to profile", "add benchmark cases to task.yml")
        count = len(task.benchmarks)
        index = count - 1 if self.benchmark_index is None else self.benchmark_index
        if not 0 <= index < count:
            raise UsageError(f"--benchmark-index {self.benchmark_index}: {task.name} has {count} benchmark(s), "
                             f"indices 0 to {count - 1}", f"pick one of 0..{count - 1}")
        if self.kernel_name is not None and not 1 <= len(self.kernel_name) <= KERNEL_NAME_MAX:
            raise UsageError(f"--ncu-kernel-name has {len(self.kernel_name)} characters; the server takes 1 to "
                             f"{KERNEL_NAME_MAX}", "give the kernel's name (or a part ncu matches)")
        if self.kernel_name_base is not None:
            if self.kernel_name_base not in KERNEL_NAME_BASES:
                raise UsageError(f"--ncu-kernel-name-base `{self.kernel_name_base}`: not one of "
                                 f"{', '.join(KERNEL_NAME_BASES)}", "use function, demangled or mangled")
            if self.kernel_name is None:
                raise UsageError("--ncu-kernel-name-base goes with --ncu-kernel-name", "add --ncu-kernel-name NAME")
        if self.launch_count is not None and self.launch_count < 1:
            raise UsageError(f"--ncu-launch-count {self.launch_count}: must be 1 or more", "e.g. --ncu-launch-count 1")
        return index

    def ncu_args(self) -> list[str]:
        """The ncu options that select kernels as this request asks."""
        args = []
        if self.kernel_name is not None:
            args += ["--kernel-name", self.kernel_name, "--kernel-name-base", self.kernel_name_base or "function"]
        if self.launch_count is not None:
            args += ["--launch-count", str(self.launch_count)]
        return args

    def to_json(self) -> dict:
        return asdict(self)


def version_of(ncu: str) -> str:
    """`ncu --version`'s version (`2025.2.1`), or "" when it does not say."""
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    found = re.search(r"Version (\d+\.\d+\.\d+)", done.stdout)
    return found.group(1) if found else ""


def version_warnings(version: str) -> tuple[str, ...]:
    """What a local ncu version means for numbers compared with the hosted runner's."""
    if version in AVOIDED_NCU:
        return (f"local ncu {version}: the leaderboard's runner avoids this version ({AVOIDED_NCU[version]}); "
                f"it pins {HOSTED_NCU}, so counters here may not match a hosted profile",)
    return ()


@dataclass(frozen=True)
class Kernel:
    name: str
    duration_ns: float | None = None
    dram_bytes_per_s: float | None = None
    dram_pct: float | None = None
    sm_pct: float | None = None
    registers: float | None = None
    occupancy_pct: float | None = None


@dataclass(frozen=True)
class NcuReport:
    task: str
    submission: str
    case: Mapping[str, Any]
    kernels: tuple[Kernel, ...]
    device: str = ""
    request: ProfileRequest = ProfileRequest()
    ncu_version: str = ""
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"task": self.task, "submission": self.submission, "case": dict(self.case), "device": self.device,
                "kernels": [asdict(k) for k in self.kernels], "request": self.request.to_json(),
                "ncu_version": self.ncu_version, "hosted_ncu": HOSTED_NCU, "warnings": list(self.warnings)}


def _number(text: str, unit: str, field: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None  # "n/a" and the like
    if field == "duration_ns":
        return value * _TIME.get(unit, 1.0)
    if field == "dram_bytes_per_s":
        return value * _RATE.get(unit, 1.0)
    return value


def parse_raw_csv(text: str) -> tuple[Kernel, ...]:
    """Kernels from `ncu --csv --page raw` output (lines before the header are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return ()
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, units, body = rows[0], rows[1] if len(rows) > 1 else [], rows[2:]
    column = {name: i for i, name in enumerate(header)}
    kernels = []
    for row in body:
        if len(row) != len(header):
            continue
        values = {field: _number(row[column[metric]], units[column[metric]] if units else "", field)
                  for metric, field in METRICS.items() if metric in column}
        kernels.append(Kernel(name=row[column.get("Kernel Name", 0)], **values))
    return tuple(kernels)


def profile(task: Task, submission: Path, content: bytes, python: str, ncu: str | None = None,
            request: ProfileRequest = ProfileRequest()) -> NcuReport:
    """Run the submission's kernels under ncu on one benchmark case (the request's; default the last);
    UsageError for a request the server refuses, EnvironmentProblem when ncu cannot run."""
    case = task.benchmarks[request.validate(task)]
    ncu = ncu or shutil.which("ncu")
    if not ncu:
        raise EnvironmentProblem("ncu (Nsight Compute) is not installed or not on PATH",
                                 "install Nsight Compute (part of the CUDA toolkit) or use --profiler torch")
    version = version_of(ncu)
    with tempfile.TemporaryDirectory(prefix="popkit-ncu-") as tmp:
        workdir = Path(tmp)
        Executor().new_workspace(workdir).prepare(task, content)
        (workdir / DRIVER).write_text(_DRIVER_SOURCE)
        argv = [ncu, "--csv", "--page", "raw", "--profile-from-start", "off", "--metrics", ",".join(METRICS),
                *request.ncu_args(), python, DRIVER, json.dumps(dict(case))]
        try:
            done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True,
                                  timeout=task.benchmark_timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise PopkitError(f"ncu ran past the task's benchmark_timeout ({task.benchmark_timeout:g} s)",
                              "profile a smaller case, or raise benchmark_timeout", exit_code=ExitCode.TIMED_OUT) from None
    kernels = parse_raw_csv(done.stdout)
    if done.returncode != 0 or not kernels:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        if any("ERR_NVGPUCTRPERM" in line for line in done.stdout.splitlines() + done.stderr.splitlines()):
            raise EnvironmentProblem("ncu may not read the GPU's performance counters on this machine",
                                     "run as root or allow profiling (NVreg_RestrictProfilingToAdminUsers=0)")
        raise PopkitError(f"ncu found no kernels (exit {done.returncode}): {' / '.join(tail) or 'no output'}",
                          "run the submission with popkit test first; ncu profiles only CUDA kernels",
                          exit_code=ExitCode.CRASHED)
    return NcuReport(task=task.name, submission=str(submission), case=case, kernels=kernels, request=request,
                     ncu_version=version, warnings=version_warnings(version))
