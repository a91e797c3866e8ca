"""`popkit doctor --timing`: what timing costs on this machine, measured (the floors a time is judged against).

The measurements run in a child (popkit/operations/timingchild.py, through proc, so popkit never imports torch):
on the CPU the timer's resolution and cost and the memory's copy bandwidth; on a GPU the launch floor (a
one-element kernel between CUDA events, the least a timed call can take), the event pair's own time,
back-to-back launches and the device's copy bandwidth. The parent samples the GPU's clocks meanwhile
(gpustate). No submission code runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from popkit.machine import gpustate
from popkit.run import proc

CHILD = Path(__file__).with_name("timingchild.py")
TIMEOUT_S = 180.0


@dataclass(frozen=True)
class TimingReport:
    python: str
    duration_s: float
    cpu: Mapping[str, Any] = field(default_factory=dict)
    gpu: Mapping[str, Any] = field(default_factory=dict)  # {"error": why} where no GPU was measured
    gpu_state: Mapping[str, Any] = field(default_factory=dict)  # gpustate.GpuState.to_json during the GPU part
    error: str = ""  # why nothing could be measured

    @property
    def ok(self) -> bool:
        return not self.error

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "python": self.python, "duration_s": self.duration_s, "cpu": dict(self.cpu),
                "gpu": dict(self.gpu), "gpu_state": dict(self.gpu_state), "error": self.error}


def measure(python: str | None = None, timeout_s: float = TIMEOUT_S) -> TimingReport:
    """Run the measurements in a child of `python` (default: this interpreter) and read its one JSON line."""
    python = python or sys.executable
    t0 = time.monotonic()
    try:
        with proc.WorkDir("popkit-timing-") as folder, gpustate.Sampler(dict(os.environ)) as watch:
            done = proc.completed([python, "-c", CHILD.read_text(encoding="utf-8")], timeout_s, cwd=folder)
    except subprocess.TimeoutExpired:
        return TimingReport(python, time.monotonic() - t0, error=f"the measurements took over {timeout_s:.0f} s")
    except OSError as exc:
        return TimingReport(python, time.monotonic() - t0, error=f"cannot run {python}: {exc}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        data = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return TimingReport(python, time.monotonic() - t0, error=f"{python} exited with code {done.returncode}: {tail}")
    state = watch.state.to_json() if watch.state is not None else {}
    return TimingReport(python, time.monotonic() - t0, cpu=data.get("cpu", {}), gpu=data.get("gpu", {}),
                        gpu_state=state)
