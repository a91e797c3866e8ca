"""Independent runs spread over local GPUs (`popkit bench a.py b.py c.py --gpus 0,1`).

One worker per GPU; run j goes to GPU j mod n, and each worker runs its share one after another with
CUDA_VISIBLE_DEVICES set to its GPU for every child (pre-step and evals), so at most one eval uses a GPU
at a time and every run is the same as a single `popkit bench` on that GPU. Results keep the files' order.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from popkit import runner
from popkit.errors import PopkitError, UsageError
from popkit.results import RunReport
from popkit.tasks import Task


@dataclass(frozen=True)
class Job:
    submission: Path
    content: bytes
    task: Task


@dataclass(frozen=True)
class Outcome:
    job: Job
    gpu: str
    report: RunReport | None = None
    error: PopkitError | None = None  # a run stopped before it started (e.g. exit 11, this GPU cannot run it)

    @property
    def exit_code(self) -> int:
        return int(self.report.exit_code if self.report is not None else self.error.exit_code)


def parse_gpus(spec: str) -> tuple[str, ...]:
    """`0,1,3` -> ("0", "1", "3"): distinct device indices as CUDA_VISIBLE_DEVICES takes them."""
    gpus = tuple(part.strip() for part in spec.split(","))
    if not gpus or not all(g.isdigit() for g in gpus):
        raise UsageError(f"--gpus {spec!r}: give device indices separated by commas", "e.g. --gpus 0,1")
    if len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {spec!r}: a GPU appears twice", "one process per GPU: list each GPU once")
    return gpus


def run_spread(jobs: Sequence[Job], mode: str, options: runner.RunOptions, gpus: Sequence[str],
               progress: Callable[[str], None] | None = None) -> list[Outcome]:
    say = progress or (lambda _msg: None)

    def worker(index: int) -> list[tuple[int, Outcome]]:
        gpu = gpus[index]
        opts = replace(options, env={**options.env, "CUDA_VISIBLE_DEVICES": gpu})
        done = []
        for j in range(index, len(jobs), len(gpus)):
            job = jobs[j]
            tell = (lambda msg, name=job.submission.name: say(f"[gpu {gpu}] {name}: {msg}"))
            try:
                report = runner.run_submission(job.task, job.submission, mode, opts, progress=tell,
                                               content=job.content)
                done.append((j, Outcome(job, gpu, report=report)))
            except PopkitError as exc:
                done.append((j, Outcome(job, gpu, error=exc)))
        return done

    with ThreadPoolExecutor(max_workers=len(gpus)) as pool:
        finished = [item for share in pool.map(worker, range(min(len(gpus), len(jobs)))) for item in share]
    return [outcome for _, outcome in sorted(finished, key=lambda item: item[0])]
