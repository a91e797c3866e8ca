"""Race evals through warm pairs started a batch at a time ahead (run.warm.Ahead): where, how many, and the block.

A race round times its variants one after another, each in a fresh benchmark-mode eval whose fixed cost (a
process tree, torch's import, the device, the inputs) is most of its wall time. Started ahead, those start-ups
overlap one another and each eval pays its `go` alone; the verdict is the cold eval's (docs/design.md, "Warm
pairs ahead"). The checks, the A/Bs and the final check stay cold.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Any, Iterator, Sequence

from popkit.run import runner
from popkit.run import sandbox
from popkit.run import warm


def ahead_depth(cpus: int | None = None) -> int:
    """Warm pairs a race round starts at once: one per 4 CPUs, at most warm.AHEAD, and 0 (cold evals) below 2. A
    pair's start-up is two processes importing torch; on too few CPUs the start-ups queue and a warm round costs
    more than a cold one (a 2-core machine: 28.5 s against 24.6 s for the 9 race evals of the chunksum fixture,
    each warm `go` 0.5-0.6 s against 2.7 s for a cold eval)."""
    depth = min(warm.AHEAD, (os.cpu_count() or 1 if cpus is None else cpus) // 4)
    return depth if depth >= 2 else 0


def warm_reason(tuner: Any) -> str:
    """Why a tune's race evals run cold ('' when they run through warm pairs): warm pairs are popkit's harness on
    one GPU (this machine's, or the one GPU tune was given), with what a cold benchmark eval of the variant would
    get. `tuner`: workflow.Tuner."""
    if not tuner.settings.warm_race:
        return "asked to run cold"
    if len(tuner.devices) > 1 or tuner.backend.run is not runner.run_submission:
        return "its evals run on several GPUs or another executor"
    if tuner.options.harness != "popkit" and warm.harness_for(tuner.task) != "task":
        return "the task's own eval judges it, not popkit's harness"
    if tuner.options.world_size is not None or tuner.options.keep_workdir:
        return "a scaled world size or a kept working folder runs cold"
    if not ahead_depth():
        return "this machine has too few CPUs for start-ups side by side"
    return warm.unfit_reason(tuner.task)


def race_evals(tuner: Any) -> str:
    """What the report says of the race's evals: `warm, N ahead`, or `cold: why`."""
    why = warm_reason(tuner)
    return f"cold: {why}" if why else f"warm, {ahead_depth()} ahead"


@contextlib.contextmanager
def warm_evals(tuner: Any, states: Sequence[Any]) -> Iterator[warm.Ahead | None]:
    """For the block, the tuner's benchmark evals of `states` (race.State) through warm pairs started ahead
    (tuner.ahead, which Tuner.run uses); None where they run cold."""
    if warm_reason(tuner):
        yield None
        return
    executor = sandbox.executor_for(tuner.options.isolation)
    by_index = {s.index: s for s in states}

    def make(index: int) -> warm.WarmPair:
        state = by_index[index]
        options = tuner.options_for(state)
        if tuner.devices:  # the one GPU tune was given, as a cold eval of tune's gets it (Tuner.run)
            options = replace(options, env={**options.env, "CUDA_VISIBLE_DEVICES": tuner.devices[0]})
        return warm.WarmPair(tuner.bounded(tuner.task)[0], "benchmark", state.content, options,
                             executor, path=state.path, system=tuner.sysinfo)

    with warm.Ahead(make, ahead_depth()) as pairs:
        tuner.ahead = pairs
        try:
            yield pairs
        finally:
            tuner.ahead = None


__all__ = ["ahead_depth", "race_evals", "warm_evals", "warm_reason"]
