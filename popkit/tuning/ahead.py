"""Race evals through warm pairs started a batch at a time ahead (run.warm.Ahead): where, how many, and the block.

A race round times its variants one after another, each in a fresh benchmark-mode eval whose fixed cost (a
process tree, torch's import, the device, the inputs) is most of its wall time. Started ahead, those start-ups
overlap one another and each eval pays its `go` alone; the verdict is the cold eval's (docs/design.md, "Warm
pairs ahead"). The checks, the A/Bs and the final check stay cold.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Iterator, Sequence

from popkit.run import runner
from popkit.run import sandbox
from popkit.run import warm
from popkit.run.warm import ahead_depth  # re-exported: tune's tests set it per run


def warm_reason(tuner: Any) -> str:
    """Why a tune's race evals run cold ('' when they run through warm pairs): warm pairs are popkit's harness on
    one GPU (this machine's, or the one GPU tune was given), with what a cold benchmark eval of the variant would
    get. `tuner`: workflow.Tuner."""
    if not tuner.settings.warm_race:
        return "asked to run cold"
    if len(tuner.devices) > 1 or tuner.backend.run is not runner.run_submission:
        return "its evals run on several GPUs or another executor"
    return warm.cold_reason(tuner.task, tuner.options, ahead_depth())


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
