"""Many runs on a Ray cluster: `popkit bench FILES... --cluster ray[:ADDRESS]` and `popkit test FILES... --cluster ...`.

One code path for one machine and for a cluster (popkit/distributed/ray_session.py): `--cluster ray` starts a local Ray
instance over this machine's CPUs and GPUs and shuts it down at the end; `ray:ADDRESS` (or RAY_ADDRESS) joins
a running cluster and leaves it running.

The unit of work is a content-addressed bundle (popkit/distributed/bundle.py); a worker runs it as a local run runs
(popkit/distributed/worker.py) and returns the report with the worker's identity and parity facts. A run takes one
GPU (`num_gpus=1`: Ray sets CUDA_VISIBLE_DEVICES for it; a multi-GPU task takes its world size) or, for a task
that runs on the CPU, one CPU slot.

The scheduler keeps at most as many runs in flight as the cluster has slots for them, so a run in flight is
a run that is running and its deadline counts from its start. Results come back through `ray.wait` as they
finish and go to `on_result` at once: this process is the only one that writes the history. A run whose
worker died fails as `worker lost`, one past its deadline as `timed out` (cancelled), one a worker refused as
`parity mismatch`; no run's failure touches another's. Whatever ends the loop (the last result, an error,
Ctrl-C), every run still in flight is cancelled with force, which kills its worker process and with it the
run's processes (their watchdog's lifeline closes), and an instance started here is shut down.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit.distributed import bundle as bundles
from popkit.distributed import parity
from popkit.distributed.ray_session import connect
from popkit.distributed.worker import Worker, run_bundle
from popkit.errors import EnvironmentProblem, ExitCode, PopkitError
from popkit.machine import nvml
from popkit.measure import ab
from popkit.model.contract import entry_points
from popkit.model.results import RunReport
from popkit.model.tasks import Task, scale_world_size
from popkit.progress import Progress, live_of
from popkit.run import runner
from popkit.run.protocol import chain_modes
from popkit.submission.source import check_language, needs_gpu, validate_submission

SCHEMA = "cluster"  # popkit/cluster/1: the --json document; popkit/cluster-result/1: one --json-lines line
GRACE_S = 180.0  # on top of a run's timeouts: the worker's probe, unpacking, killing children (deadline_for)
TICK_S = 1.0  # how often the progress line is refreshed while runs are in flight


@dataclass(frozen=True)
class Job:
    """One unit of work: a run of one file, or an A/B of two files (both sides on one worker)."""

    files: tuple[Path, ...]
    contents: tuple[bytes, ...]
    task: Task

    @property
    def kind(self) -> str:
        return "ab" if len(self.files) == 2 else "run"

    @property
    def name(self) -> str:
        return " vs ".join(str(f) for f in self.files)


# Why a run has no report, each with its exit code.
WORKER_LOST, TIMED_OUT, PARITY_MISMATCH, ERROR = "worker_lost", "timed_out", "parity_mismatch", "error"
_FAILURE_EXIT = {WORKER_LOST: ExitCode.CRASHED, TIMED_OUT: ExitCode.TIMED_OUT,
                 PARITY_MISMATCH: ExitCode.ENVIRONMENT, ERROR: ExitCode.INTERNAL}


@dataclass(frozen=True)
class Result:
    """One job's end: its report (a run) or A/B report, or why there is none (`failed`, `failure`)."""

    index: int  # the job's place in the order given
    job: Job
    worker: Worker | None = None
    report: RunReport | None = None
    ab: ab.ABReport | None = None
    failed: str = ""  # worker_lost | timed_out | parity_mismatch | error
    failure: str = ""  # its one line
    code: int = 0  # its exit code (an error raised on the worker keeps its own)

    @property
    def outcome(self) -> str:
        if self.report is not None:
            return self.report.outcome
        if self.ab is not None:
            return self.ab.failure_outcome
        return self.failed

    @property
    def exit_code(self) -> int:
        if self.report is not None:
            return int(self.report.exit_code)
        if self.ab is not None:
            return int(self.ab.exit_code)
        return int(self.code)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.job.kind, "files": [str(f) for f in self.job.files],
                "task": self.job.task.name, "outcome": self.outcome, "exit_code": self.exit_code,
                "failure": self.failure, "worker": self.worker.to_json() if self.worker else None,
                "report": self.report.to_json() if self.report else None,
                "ab": self.ab.to_json() if self.ab else None}

    def history_reports(self) -> list[tuple[RunReport, bytes]]:
        """What goes into the history: a run's report, or each side of an A/B (ab.side_report); none without."""
        if self.report is not None:
            return [(self.report, self.job.contents[0])]
        if self.ab is None:
            return []
        sides = [(ab.side_report(self.ab, side, self.job.task), content)
                 for side, content in zip(ab.SIDES, self.job.contents)]
        return [(_labelled(report, self.worker), content) for report, content in sides if report is not None]


@dataclass(frozen=True)
class ClusterRun:
    """Every job's result in the order given, and the cluster they ran on."""

    address: str  # "local" for an instance started here
    embedded: bool
    resources: Mapping[str, float]  # the cluster's CPU and GPU count when the runs started
    results: tuple[Result, ...]

    @property
    def exit_code(self) -> int:
        """The exit code of the first job, in the order given, that did not pass; 0 when all passed."""
        return next((r.exit_code for r in self.results if r.exit_code), 0)

    @property
    def differences(self) -> list[str]:
        """Parity facts that differ between the workers that ran these results (parity.differences)."""
        return parity.differences([r.worker.facts for r in self.results if r.worker is not None])

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "embedded": self.embedded, "resources": dict(self.resources),
                "results": [r.to_json() for r in self.results], "workers_differ": self.differences,
                "exit_code": self.exit_code}


# ----------------------------------------------------------------------------------- planning


def _world(job: Job, options: runner.RunOptions) -> int:
    if not job.task.multi_gpu:
        return 1
    if options.world_size:
        return options.world_size
    return max([int(c.get("world_size", 1)) for c in job.task.tests + job.task.benchmarks] or [1])


def gpus_for(job: Job, mode: str, options: runner.RunOptions, cluster_gpus: float, node_gpus: float,
             allow_cpu: bool) -> int:
    """GPUs one worker needs for `job`: 0 for a run on a CPU slot; raises what cannot run on this cluster."""
    builds = any(needs_gpu(c) for c in job.contents)
    task = job.task
    if not cluster_gpus:
        if builds:
            raise EnvironmentProblem(f"{job.files[0]}: builds a CUDA extension, and the Ray cluster has no GPU",
                                     "join a cluster with GPUs (--cluster ray:ADDRESS); a pure-PyTorch submission "
                                     "runs on CPU workers")
        if task.gpus and mode != "test" and not allow_cpu:
            raise EnvironmentProblem(
                f"the Ray cluster has no GPU, and the benchmarks of `{task.name}` are sized for "
                f"{'/'.join(task.gpus[:2])} GPUs: on the CPU they can run past the "
                f"{task.timeout_for(mode):g} s timeout", "pass --allow-cpu to run them on CPU workers anyway")
        return 0
    if not (builds or task.gpus or task.multi_gpu):
        return 0
    world = _world(job, options)
    if world > node_gpus:
        raise EnvironmentProblem(f"{task.name}: a run needs {world} GPUs on one worker; the largest node of the "
                                 f"Ray cluster has {node_gpus:g}",
                                 "--world-size N runs the cases at a smaller world size (not leaderboard-faithful)")
    return world


def local_slots(jobs: Sequence[Job], mode: str, options: runner.RunOptions, allow_cpu: bool,
                gpus: int | None) -> int:
    """CPU slots for a local instance over this machine's `gpus` (None: not known): the most runs that can go at
    once. Ray starts a worker process per slot as the instance starts; 8 runs on 2 GPUs go two at a time, and 6
    more workers importing Ray beside the first evals cost an H100 host 0.4-0.6 s (benchmarks section 18). Where a
    run takes a CPU slot, or the GPUs are not known, one slot per run (connect bounds it by the cores)."""
    if gpus and jobs:
        try:
            need = [gpus_for(job, mode, options, gpus, gpus, allow_cpu) for job in jobs]
        except PopkitError:  # said with Ray's own count once the instance runs
            return len(jobs)
        if min(need) > 0:
            return max(1, min(len(jobs), gpus // min(need)))
    return len(jobs)


def visible_gpus() -> int | None:
    """How many GPUs a local Ray instance will count here: the NVIDIA GPUs CUDA would see (popkit.machine.nvml), None
    where NVML cannot tell (no NVIDIA driver, GPUs named by UUID, MIG, mixed models)."""
    driver = nvml.visible_gpus(os.environ)
    return len(driver.gpus) if driver is not None else None


def deadline_for(job: Job, mode: str, options: runner.RunOptions, max_rounds: int) -> float:
    """Seconds a job may take on its worker: the sum of every timeout its processes run under, plus GRACE_S."""
    task = job.task
    pre = runner.PRECOMPILE_TIMEOUT_S if options.precompile is not False else 0.0
    if job.kind == "ab":
        return 2 * pre + (2 * max_rounds + 1) * task.timeout_for("benchmark") + GRACE_S
    chain = sum(task.timeout_for(m) * (len(task.cases_for(m)) if m == "profile" else 1)
                for m in chain_modes(mode, options.chain))
    return pre + chain * (1 + len(options.secret_seeds)) + GRACE_S


def check_job(job: Job, mode: str, options: runner.RunOptions) -> None:
    """What a local run refuses before it runs, refused here before anything is sent (exit 2, 3 or 4)."""
    chain_modes("benchmark" if job.kind == "ab" else mode)
    if options.world_size is not None:
        scale_world_size(job.task, options.world_size)
    for path, content in zip(job.files, job.contents):
        check_language(job.task, path)
        validate_submission(path, content, entry_points(job.task, options.harness))


def bundle_for(job: Job, mode: str, options: runner.RunOptions, files: bundles.TaskFiles,
               require_gpu: str | None, max_rounds: int, budget_s: float) -> bundles.Bundle:
    # The worker runs its own interpreter unless --python named one.
    python = None if options.python == sys.executable else options.python
    return bundles.Bundle(task=job.task, files_digest=files.digest,
                          submissions=tuple((str(p), c) for p, c in zip(job.files, job.contents)),
                          mode="benchmark" if job.kind == "ab" else mode, options=replace(options, python=python),
                          popkit=parity.popkit_identity(), require_gpu=require_gpu, max_rounds=max_rounds,
                          budget_s=budget_s)


# ---------------------------------------------------------------------------------- the results


def _labelled(report: RunReport, worker: Worker | None) -> RunReport:
    """The report as recorded here: its label and a note name the worker and GPU, `system` holds both."""
    if worker is None:
        return report
    where = f"ray {worker.where}"
    return replace(report, label=f"{report.label}; {where}" if report.label else where,
                   system={**report.system, "worker": worker.identity()},
                   notes=report.notes + (f"ran on Ray worker {worker.where} (pid {worker.pid}, node "
                                         f"{worker.node_id[:12]}): {parity.describe(worker.facts)}",))


def from_worker(index: int, job: Job, out: Mapping[str, Any]) -> Result:
    """A Result from what run_bundle returned."""
    worker = Worker.from_json(out["worker"])
    if "refused" in out:
        return Result(index, job, worker, failed=PARITY_MISMATCH, failure=out["refused"],
                      code=_FAILURE_EXIT[PARITY_MISMATCH])
    if "error" in out:
        error = out["error"]
        hint = f" ({error['hint']})" if error.get("hint") else ""
        return Result(index, job, worker, failed=ERROR, failure=f"{error['message']}{hint}", code=error["exit_code"])
    if "ab" in out:
        report = ab.ABReport.from_json(out["ab"])
        return Result(index, job, worker, ab=replace(report, system={**report.system, "worker": worker.identity()}))
    return Result(index, job, worker, report=_labelled(RunReport.from_json(out["report"]), worker))


def collect(ray: Any, ref: Any, index: int, job: Job) -> Result:
    """The Result of a finished Ray task: what run_bundle returned, or why there is nothing."""
    try:
        out = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # run_bundle raised, or the worker could not load it
        cause = getattr(exc, "cause", None) or exc
        text = (str(cause).strip().splitlines() or [""])[-1]
        # Where the worker cannot unpickle run_bundle, Ray raises its own error (a RuntimeError, a RaySystemError)
        # around the worker's traceback, whose last line names the ImportError.
        cannot_import = text.startswith(("ImportError: ", "ModuleNotFoundError: "))
        said = text if cannot_import else f"{type(cause).__name__}: {text}"
        if isinstance(cause, ImportError) or cannot_import:  # no popkit there, or one without this module
            return Result(index, job, failed=PARITY_MISMATCH, code=_FAILURE_EXIT[PARITY_MISMATCH],
                          failure=f"parity mismatch: the worker cannot load popkit's worker function ({said}); "
                                  "install the same popkit on every node")
        return Result(index, job, failed=ERROR, code=_FAILURE_EXIT[ERROR],
                      failure=f"worker error: {said} (a popkit bug: please report it)")
    except ray.exceptions.RayError as exc:  # the worker process or its node died: the run has no result
        text = (str(exc).strip().splitlines() or [""])[0]
        return Result(index, job, failed=WORKER_LOST, code=_FAILURE_EXIT[WORKER_LOST],
                      failure=f"worker lost: {type(exc).__name__}: {text}")
    return from_worker(index, job, out)


# ---------------------------------------------------------------------------------- the scheduler


@dataclass
class _Counts:
    total: int
    passed: int = 0
    failed: int = 0
    running: int = 0

    def text(self, elapsed_s: float, width: int = 20) -> str:
        done = self.passed + self.failed
        filled = round(width * done / self.total) if self.total else width
        return (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} · {self.passed} passed · "
                f"{self.failed} failed · {self.running} running · {elapsed_s:.0f} s")


def run_jobs(jobs: Sequence[Job], mode: str, options: runner.RunOptions, address: str | None = None, *,
             require_gpu: str | None = None, allow_cpu: bool = False, max_rounds: int = ab.DEFAULT_MAX_ROUNDS,
             budget_s: float = ab.DEFAULT_BUDGET_S, progress: Progress | None = None,
             on_result: Callable[[Result], None] | None = None, deadline_s: float | None = None) -> ClusterRun:
    """Run every job on the cluster at `address` (None: a local Ray instance started for this call).

    Each result goes to `on_result` as it arrives, in the order the runs finish; the return value has them
    in the order given. `deadline_s` replaces each job's deadline (deadline_for, seconds from its start).
    Raises before anything runs when a job cannot run on this cluster; a job that fails on its worker is a
    Result, never an exception.
    """
    say = progress or (lambda _msg: None)
    live = live_of(progress)
    for job in jobs:
        check_job(job, mode, options)
    files: dict[int, bundles.TaskFiles] = {}  # read once per task object; put in the object store once per digest
    for job in jobs:
        if id(job.task) not in files:
            files[id(job.task)] = bundles.task_files(job.task)
    slots = local_slots(jobs, mode, options, allow_cpu, visible_gpus()) if address is None else None
    with connect(address, say, slots=slots) as session:
        ray = session.ray
        total = ray.cluster_resources()
        capacity = {"CPU": float(total.get("CPU", 0)), "GPU": float(total.get("GPU", 0))}
        node_gpus = max([float(n.get("Resources", {}).get("GPU", 0)) for n in ray.nodes() if n.get("Alive")] or [0])
        if capacity["CPU"] < 1:
            raise EnvironmentProblem(f"the Ray cluster at {session.address} offers no CPU to run on",
                                     "start its nodes with at least one CPU (`ray start --num-cpus N`)")
        need = [gpus_for(job, mode, options, capacity["GPU"], node_gpus, allow_cpu) for job in jobs]
        kinds = set(need)
        say(f"{len(jobs)} job(s) on {capacity['CPU']:g} CPU(s), {capacity['GPU']:g} GPU(s): "
            + ", ".join("one GPU per run" if g == 1 else f"{g} GPUs per run" if g else "one CPU slot per run"
                        for g in sorted(kinds)))
        remote = ray.remote(run_bundle)
        stored: dict[str, Any] = {}  # task files put in the object store once per task
        pending, inflight = deque(range(len(jobs))), {}
        used = {"CPU": 0.0, "GPU": 0.0}
        results: list[Result | None] = [None] * len(jobs)
        counts, t0 = _Counts(len(jobs)), time.monotonic()

        def finish(ref: Any, result: Result) -> None:
            index, _, _, gpus = inflight.pop(ref)
            used["CPU"] -= 1
            used["GPU"] -= gpus
            results[index] = result
            counts.running -= 1
            if result.exit_code:
                counts.failed += 1
            else:
                counts.passed += 1
            place = f" on {result.worker.where}" if result.worker else ""
            say(f"[{counts.passed + counts.failed}/{counts.total}] {result.job.name}: {result.outcome}{place}")
            if on_result is not None:
                on_result(result)

        try:
            while pending or inflight:
                # In the order given, while the cluster has room: every run in flight is a running run.
                while (pending and used["CPU"] + 1 <= capacity["CPU"]
                       and used["GPU"] + need[pending[0]] <= capacity["GPU"]):
                    index = pending.popleft()
                    job = jobs[index]
                    task_files = files[id(job.task)]
                    if task_files.digest not in stored:
                        stored[task_files.digest] = ray.put(task_files)
                    bundle = bundle_for(job, mode, options, task_files, require_gpu, max_rounds, budget_s)
                    ref = remote.options(num_cpus=1, num_gpus=need[index], max_retries=0).remote(
                        bundle, stored[task_files.digest])
                    limit = deadline_s if deadline_s is not None else deadline_for(job, mode, options, max_rounds)
                    inflight[ref] = (index, time.monotonic() + limit, limit, need[index])
                    used["CPU"] += 1
                    used["GPU"] += need[index]
                    counts.running += 1
                next_deadline = min(deadline for _, deadline, _, _ in inflight.values())
                wait_s = max(0.0, min(TICK_S, next_deadline - time.monotonic()))
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=wait_s)
                for ref in ready:
                    index = inflight[ref][0]
                    finish(ref, collect(ray, ref, index, jobs[index]))
                now = time.monotonic()
                for ref, (index, deadline, limit, _) in list(inflight.items()):
                    if now >= deadline:
                        ray.cancel(ref, force=True)
                        finish(ref, Result(index, jobs[index], failed=TIMED_OUT, code=_FAILURE_EXIT[TIMED_OUT],
                                           failure=f"timed out: no result from its worker within {limit:.0f} s "
                                                   "(cancelled; the worker process was killed)"))
                if live is not None and inflight:
                    live(counts.text(now - t0), "cluster")
        finally:
            for ref in inflight:  # Ctrl-C, or an error here: nothing of ours keeps running on the cluster
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
        return ClusterRun(session.address, session.embedded, capacity, tuple(r for r in results if r is not None))
