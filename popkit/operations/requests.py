"""One way in for every front door: the CLI, popkit.api and the MCP server (which calls popkit.api) build a
run's options here, validated once, and hand the request to `dispatch`, the one function that picks the
workflow: independent runs over local GPUs, an A/B of two files, or one file's chain.

Names for GPUs, one meaning each: a `device` is one local GPU as CUDA_VISIBLE_DEVICES names it (an index or
a UUID), `devices` several of them; a GPU's kind (H100, MI300) is a `gpu` in a task's list or a directive;
how many GPUs one run spans is its `world_size`.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from popkit.errors import UsageError
from popkit.operations import workflows
from popkit.operations.workflows import ABOutcome, Progress, Request, RunOutcome, SpreadRun, first_failure
from popkit.run import sandbox
from popkit.run.protocol import MAX_SECRET_SEED
from popkit.run.runner import RunOptions

HARNESSES = ("task", "popkit")


@dataclass(frozen=True)
class SpreadOutcome:
    """`--gpus`: independent runs, one per file, in the order the files were given."""

    runs: tuple[SpreadRun, ...]

    @property
    def exit_code(self) -> int:
        return first_failure([r.exit_code for r in self.runs])

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.runs]}


Outcome = Union[RunOutcome, ABOutcome, SpreadOutcome]


def in_range(name: str, value: float, low: float | None, high: float | None) -> None:
    """UsageError (exit 2) unless low <= value <= high (an end that is None is open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{name}: {value!r} is not a number", f"give {name} as a number")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low:g} to {high:g}" if low is not None and high is not None else (
            f"at least {low:g}" if low is not None else f"at most {high:g}")
        raise UsageError(f"{name}: {value:g} is out of range", f"give {name} {bounds}")


def interpreter(python: Optional[str]) -> str:
    """`python` as an absolute executable path (the eval runs elsewhere; a bare name is looked up on PATH)."""
    if not python:
        return sys.executable
    found = shutil.which(python)
    if found:
        return os.path.abspath(found)
    path = Path(python)
    what = ("a folder, not an interpreter" if path.is_dir() else "not executable" if path.exists()
            else "no such interpreter" if os.sep in python else "no such interpreter on PATH")
    raise UsageError(f"--python {python}: {what}", "give the path of a Python executable, e.g. --python python3")


def secret_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    for seed in seeds:
        in_range("secret_seeds", seed, 0, MAX_SECRET_SEED)
    return tuple(int(s) for s in seeds)


def run_options(*, python: Optional[str] = None, precompile: Optional[bool] = None, harness: str = "task",
                seeds: Sequence[int] = (), keep_workdir: bool = False, world_size: Optional[int] = None,
                require_isolation: bool = False, label: str = "") -> RunOptions:
    """The options of one run, each checked: the harness by name, world_size at least 1, the interpreter found."""
    if harness not in HARNESSES:
        raise UsageError(f"unknown harness `{harness}`", "use --harness task or --harness popkit")
    if world_size is not None:
        in_range("world_size", world_size, 1, None)
    kwargs = {"python": interpreter(python)} if python else {}
    return RunOptions(precompile=precompile, harness=harness, secret_seeds=secret_seeds(seeds),
                      keep_workdir=keep_workdir, world_size=world_size, label=label,
                      isolation="require" if require_isolation else "auto", **kwargs)


def dispatch(request: Request, *, device: Optional[str] = None, devices: Optional[Sequence[str]] = None,
             progress: Optional[Progress] = None, note: Optional[Progress] = None) -> Outcome:
    """The workflow a request asks for: with `devices`, independent runs spread over those GPUs; else two
    files are an A/B and one file its chain, pinned to `device` when one is given."""
    if devices is not None:
        spread = replace(request, devices=workflows.parse_devices(",".join(str(d) for d in devices)))
        return SpreadOutcome(tuple(workflows.spread(spread, progress=progress)))
    executor = None
    if device is not None:
        (pinned,) = workflows.parse_devices(str(device))
        workflows.check_devices((pinned,))
        executor = sandbox.executor_for(request.options.isolation).on_gpu(pinned)
    if len(request.sources) == 2:
        return workflows.compare(request, progress=progress, executor=executor)
    return workflows.run(request, progress=progress, executor=executor, note=note)


__all__ = ["SpreadOutcome", "Outcome", "in_range", "interpreter", "secret_seeds", "run_options", "dispatch"]
