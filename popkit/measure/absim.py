"""The A/B's decision rule on simulated rounds: how often it names a winner between identical arms, and how
often it names a real difference (popkit/measure/abrounds.py: the code `popkit bench A B` decides with).

Each simulated eval draws what a real one shows on a GPU (docs/timing.md): a process effect shared by its
shapes (the spread between processes that dominates), each shape's own noise, the second eval of a round a
little slower, a drift over the A/B, and host stalls: with probability `stall` a whole eval is slowed by
1.5-5x (its median too), with probability `partial` a few calls stall (its mean moves, its median not).
Evals take `eval_s` seconds of a simulated clock, so the time budget stops the rounds as it would for real.
Seeded: the same arguments give the same counts.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from popkit.measure.abrounds import Rounds, round_order
from popkit.measure.shapes import A_FASTER, B_FASTER
from popkit.model.results import CaseResult, ModeRun


@dataclass(frozen=True)
class Noise:
    """What one simulated eval's time is made of (sd on the log scale; `order`, `drift`: fractions)."""

    process_sd: float = 0.004
    shape_sd: float = 0.002
    order: float = 0.002  # the second eval of a round this much slower
    drift: float = 0.0005  # every eval this much slower than the one before
    stall: float = 0.05  # chance that a whole eval is slowed 1.5-5x
    partial: float = 0.05  # chance that a few calls of an eval stall (mean up 1.3-3x, median not)


@dataclass(frozen=True)
class Outcome:
    """Counts over every shape verdict of every simulated A/B."""

    verdicts: int
    named: int  # a winner named, either way
    right: int  # the winner named is the real one (B slower when ratio > 1, faster when < 1)
    rounds: float  # mean rounds per A/B
    seconds: float  # mean simulated seconds per A/B

    def to_json(self) -> dict:
        return {"verdicts": self.verdicts, "named": self.named, "right": self.right, "rounds": self.rounds,
                "seconds": self.seconds, "named_share": self.named / self.verdicts if self.verdicts else 0.0}


def _eval(rng: random.Random, state: Rounds, factor: float, shift: float, noise: Noise) -> ModeRun:
    whole = rng.uniform(1.5, 5.0) if rng.random() < noise.stall else 1.0
    tail = rng.uniform(1.3, 3.0) if rng.random() < noise.partial else 1.0
    process = rng.gauss(0.0, noise.process_sd) + shift
    cases = []
    for i in state.active:
        median = 1e5 * factor * whole * math.exp(process + rng.gauss(0.0, noise.shape_sd))
        cases.append(CaseResult(kind="benchmark", index=i, spec="", passed=True, runs=100, mean_ns=median * tail,
                                median_ns=median))
    return ModeRun(mode="benchmark", secret=False, seed=None, exit_code=0, duration_s=0.0, timeout_s=1.0,
                   check="pass", benchmarks=tuple(cases))


def simulate(trials: int, ratio: float, noise: Noise = Noise(), shapes: int = 4, max_rounds: int = 8,
             budget_s: float = 60.0, eval_s: float = 5.0, start_s: float = 6.0, seed: int = 0) -> Outcome:
    """`trials` simulated A/Bs of `shapes` shapes where B takes `ratio` times A's time; every shape verdict
    (not the score's) counted. `start_s`: the set-up and the warm-up eval, before the first round."""
    rng = random.Random(seed)
    verdicts = named = right = rounds = 0
    seconds = 0.0
    real = A_FASTER if ratio > 1 else B_FASTER
    for _ in range(trials):
        state = Rounds([{"shape": k} for k in range(shapes)], "geom", max_rounds)
        evals: list[float] = []
        while state.active and not state.over_budget(start_s + len(evals) * eval_s, evals, budget_s):
            runs = {}
            for k, side in enumerate(round_order(state.done)):
                shift = k * noise.order + len(evals) * noise.drift
                runs[side] = _eval(rng, state, ratio if side == "B" else 1.0, shift, noise)
                evals.append(eval_s)
            state.add(runs)
        series, _ = state.final()
        verdicts += len(series)
        named += sum(s.verdict in (A_FASTER, B_FASTER) for s in series)
        right += sum(s.verdict == real for s in series) if ratio != 1 else 0
        rounds += state.done
        seconds += start_s + len(evals) * eval_s
    return Outcome(verdicts, named, right, rounds / trials, seconds / trials)
