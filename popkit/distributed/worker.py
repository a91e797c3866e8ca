"""What runs on a Ray worker for popkit/distributed/scheduler.py: parity first, then the run a local run would run.

`run_bundle` is the Ray task (its process title: `ray::run_bundle`). It reads the worker's parity facts
(popkit/distributed/parity.py) and refuses a bundle its popkit or GPU kind does not match; otherwise it unpacks the task
files into its cache (popkit/distributed/bundle.py) and runs `runner.run_submission`, or `ab.run_ab` for a pair (both sides
of every round on this worker's GPU). While it runs, the process environment is the worker's own, less what
Ray adds for a task. It returns plain JSON-able data: the worker's identity, and the report or why there is none.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from popkit.distributed import bundle as bundles
from popkit.distributed import parity
from popkit.errors import PopkitError
from popkit.measure import ab
from popkit.model.tasks import Task
from popkit.run import runner
from popkit.toolchain import prestep


@dataclass(frozen=True)
class Worker:
    """Where a run ran: the node, the worker process, the GPUs Ray gave it, and its parity facts."""

    host: str
    node_ip: str
    node_id: str
    pid: int
    gpus: tuple[str, ...]  # Ray's GPU ids (CUDA_VISIBLE_DEVICES of the run); empty on a CPU slot
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.host} GPU {','.join(self.gpus)}" if self.gpus else f"{self.host} CPU"

    def identity(self) -> dict[str, Any]:
        return {"host": self.host, "node_ip": self.node_ip, "node_id": self.node_id, "pid": self.pid,
                "gpus": list(self.gpus)}

    def to_json(self) -> dict[str, Any]:
        return {**self.identity(), "facts": dict(self.facts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Worker":
        return cls(host=data["host"], node_ip=data["node_ip"], node_id=data["node_id"], pid=data["pid"],
                   gpus=tuple(data.get("gpus", ())), facts=dict(data.get("facts") or {}))


def run_bundle(bundle: bundles.Bundle, files: bundles.TaskFiles) -> dict[str, Any]:
    """On a Ray worker: parity, then the run, as a local run would do it. Returns {"worker": ..., and one of
    "report", "ab", "refused" (parity mismatch) or "error" (a PopkitError the run raised)}."""
    import ray

    context = ray.get_runtime_context()
    where = dict(host=socket.gethostname(), node_ip=ray.util.get_node_ip_address(), node_id=context.get_node_id(),
                 pid=os.getpid(), gpus=tuple(str(g) for g in ray.get_gpu_ids()))
    with _as_a_local_run():
        return _run_here(bundle, files, where)


@contextlib.contextmanager
def _as_a_local_run() -> Iterator[None]:
    """The worker's environment, less what Ray adds for a task, while the run runs: its own variables (RAY_*,
    a token among them) and OMP_NUM_THREADS=1, which would slow every CPU-side torch op of the run. Ray's
    CUDA_VISIBLE_DEVICES stays: it is the GPU the run was given."""
    added = {k: v for k, v in os.environ.items() if k.startswith("RAY_") or (k, v) == ("OMP_NUM_THREADS", "1")}
    for key in added:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(added)


def _run_here(bundle: bundles.Bundle, files: bundles.TaskFiles, where: Mapping[str, Any]) -> dict[str, Any]:
    options = replace(bundle.options, python=bundle.options.python or sys.executable)
    found = parity.facts(options.python, runner.child_env(options))
    worker = Worker(**where, facts=found)
    out: dict[str, Any] = {"worker": worker.to_json()}
    refused = parity.refusal(found, bundle.popkit, bundle.require_gpu)
    if refused:
        return {**out, "refused": refused}
    try:
        task = bundles.task_in(bundle, files, bundles.unpack(files, prestep.cache_dir()))
        if bundle.kind == "ab":
            return {**out, "ab": _run_ab(bundle, task, options, found).to_json()}
        (path, content), = bundle.submissions
        report = runner.run_submission(task, Path(path), bundle.mode, options, system=found, content=content)
        return {**out, "report": report.to_json()}
    except PopkitError as exc:
        return {**out, "error": exc.to_json()}


def _run_ab(bundle: bundles.Bundle, task: Task, options: runner.RunOptions, found: Mapping[str, Any]) -> ab.ABReport:
    """ab.run_ab on this worker: the A/B's run session takes both sides' bytes as the bundle carries them, each
    under its own name (its language is read from it)."""
    (a, a_bytes), (b, b_bytes) = bundle.submissions
    report = ab.run_ab(task, Path(a) if Path(a).name else Path("submission.py"),
                       Path(b) if Path(b).name else Path("submission.py"), options, max_rounds=bundle.max_rounds,
                       budget_s=bundle.budget_s, system=found, contents={"A": a_bytes, "B": b_bytes})
    return replace(report, a_path=a, b_path=b)
