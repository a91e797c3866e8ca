"""Nsight Compute for a submission's kernels (`popkit bench FILE --profile --profiler ncu`).

One benchmark case (the last: the one `ranking_by: last` ranks), one call of the submission after a
warm-up call, between cudaProfilerStart/Stop, under `ncu --csv --page raw --profile-from-start off
--metrics ...`. Per kernel: duration, achieved DRAM bandwidth and its share of peak, SM throughput as a
share of peak, registers per thread and achieved occupancy.

The raw CSV page: a header row of quoted column names ("ID", "Kernel Name", ..., one per metric), a row of
units ("nsecond", "Gbyte/second", "%", "register/thread"), then one row per profiled kernel; ncu's own
`==PROF==` lines come before it. Numbers may carry thousands separators.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from popkit.errors import EnvironmentProblem, ExitCode, PopkitError, TaskError
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

    def to_json(self) -> dict:
        return {"task": self.task, "submission": self.submission, "case": dict(self.case), "device": self.device,
                "kernels": [asdict(k) for k in self.kernels]}


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
            case_index: int = -1) -> NcuReport:
    """Run the submission's kernels under ncu on one benchmark case; EnvironmentProblem when ncu cannot."""
    ncu = ncu or shutil.which("ncu")
    if not ncu:
        raise EnvironmentProblem("ncu (Nsight Compute) is not installed or not on PATH",
                                 "install Nsight Compute (part of the CUDA toolkit) or use --profiler torch")
    if not task.benchmarks:
        raise TaskError(f"{task.yml}: no `benchmarks` to profile", "add benchmark cases to task.yml")
    case = task.benchmarks[case_index]
    with tempfile.TemporaryDirectory(prefix="popkit-ncu-") as tmp:
        workdir = Path(tmp)
        Executor().new_workspace(workdir).prepare(task, content)
        (workdir / DRIVER).write_text(_DRIVER_SOURCE)
        argv = [ncu, "--csv", "--page", "raw", "--profile-from-start", "off", "--metrics", ",".join(METRICS),
                python, DRIVER, json.dumps(dict(case))]
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
    return NcuReport(task=task.name, submission=str(submission), case=case, kernels=kernels)
