"""What `popkit tune` found: every variant's verdict and times, the winner, the file written (frozen, JSON)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

from popkit.errors import ExitCode
from popkit.measure.ab import B_FASTER, ABReport
from popkit.model.results import OUTCOME_EXIT, score_s
from popkit.model.stats import Interval

TUNE_SCHEMA = "popkit/tune/1"
PER_SHAPE = -1  # the index of the per-shape file tune may compose from the finalists


@dataclass(frozen=True)
class Variant:
    """One point of the grid (or the per-shape file) and what happened to it. Times: ns per shape, s per score."""

    index: int  # position among the points tune ran (PER_SHAPE: the per-shape file)
    label: str  # "BLOCK=256 ROWS=2"
    values: Mapping[str, Any]  # parameter -> value, in declaration order
    sha256: str  # of the variant's bytes
    build: str = ""  # key of the build it shares ("": nothing to build)
    outcome: str = ""  # its check (test mode): passed, failed, compile_failed, crashed, timed_out, ...; "": not run
    message: str = ""  # why it failed or left: the first mismatch, the first compiler error, the budget
    check_s: float | None = None  # wall time of its check
    rounds: tuple[tuple[float, ...], ...] = ()  # race: per round, each benchmark shape's time (median, else mean)
    scores_s: tuple[float, ...] = ()  # race: per round, the task's score over those times
    left_after: int | None = None  # race: the round after which it was in the slower half
    race_failure: str = ""  # a benchmark-mode eval that did not pass
    ab: ABReport | None = None  # its confirmation against the incumbent (B = this variant)
    race_ratio: Interval | None = None  # decided by the race, no A/B: its score / the incumbent's, paired by round
    resumed: tuple[str, ...] = ()  # what came from the history instead of a run ("check", "round 1", ...)
    incumbent: bool = False  # its bytes are the incumbent's

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def score_s(self) -> float | None:
        """The geometric mean of its race scores (None before it raced)."""
        if not self.scores_s:
            return None
        return math.exp(sum(math.log(s) for s in self.scores_s) / len(self.scores_s))

    def shape_ns(self, shape: int) -> float | None:
        """Its time at one benchmark shape: the median over its race rounds."""
        values = sorted(r[shape] for r in self.rounds if shape < len(r))
        if not values:
            return None
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2

    @property
    def ratio(self) -> Interval | None:
        """Its score ratio against the incumbent (time this / time incumbent) from its A/B, else from the race."""
        if self.ab is not None:
            return self.ab.score.ratio if self.ab.score is not None else None
        return self.race_ratio

    @property
    def faster(self) -> bool:
        """Confirmed faster than the incumbent: its A/B's score interval lies below 1 (or the race's, with no A/B)."""
        if self.ab is None:
            return self.race_ratio is not None and self.race_ratio.defined and self.race_ratio.high < 1  # type: ignore
        return not self.ab.failed_side and self.ab.verdict == B_FASTER

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(values=dict(self.values), rounds=[list(r) for r in self.rounds], scores_s=list(self.scores_s),
                    resumed=list(self.resumed), ab=self.ab.to_json() if self.ab is not None else None,
                    race_ratio=self.race_ratio.to_json() if self.race_ratio is not None else None,
                    score_s=self.score_s, shape_ns=[self.shape_ns(i) for i in range(len(self.rounds[0]))]
                    if self.rounds else [])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Variant":
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kwargs.update(values=dict(data.get("values") or {}), rounds=tuple(tuple(r) for r in data.get("rounds", ())),
                      scores_s=tuple(data.get("scores_s", ())), resumed=tuple(data.get("resumed", ())),
                      ab=ABReport.from_json(data["ab"]) if data.get("ab") else None,
                      race_ratio=Interval.from_json(data["race_ratio"]) if data.get("race_ratio") else None)
        return cls(**kwargs)


@dataclass(frozen=True)
class ShapeChoice:
    """The values the written file uses for one benchmark shape."""

    spec: str  # the benchmark case
    shapes: tuple[tuple[int, ...], ...]  # its input's tensor shapes (the dispatch key)
    label: str  # the values chosen for it

    def to_json(self) -> dict:
        return {"spec": self.spec, "shapes": [list(s) for s in self.shapes], "label": self.label}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ShapeChoice":
        return cls(data["spec"], tuple(tuple(s) for s in data.get("shapes", ())), data["label"])


@dataclass(frozen=True)
class DispatchGain:
    """What picking the values per shape gains over the best single variant, by the race's per-shape medians."""

    best_single: str  # the label of the variant with the best score over every shape
    best_single_s: float  # its score (the task's ranking_by over its shape medians)
    per_shape_s: float  # the score of the fastest variant at each shape
    per_shape: tuple[str, ...]  # which variant is fastest at each shape

    @property
    def gain(self) -> float:
        """best single / per shape: 1.0 when one variant is the fastest everywhere."""
        return self.best_single_s / self.per_shape_s

    def to_json(self) -> dict:
        return {"best_single": self.best_single, "best_single_s": self.best_single_s,
                "per_shape_s": self.per_shape_s, "per_shape": list(self.per_shape), "gain": self.gain}


def dispatch_gain(variants: Sequence[Variant], shapes: int, ranking_by: str) -> DispatchGain | None:
    """The gain of per-shape dispatch over the best single variant among `variants` timed at every shape."""
    timed = [(v, [v.shape_ns(i) for i in range(shapes)]) for v in variants if v.index != PER_SHAPE and v.rounds]
    timed = [(v, times) for v, times in timed if all(t is not None and t > 0 for t in times)]
    if not timed or not shapes:
        return None
    scored = [(score_s(times, ranking_by), v, times) for v, times in timed]  # type: ignore[arg-type]
    best_s, best, _ = min(((s, v, t) for s, v, t in scored if s is not None), key=lambda x: (x[0], x[1].index))
    fastest = [min(timed, key=lambda vt, i=i: (vt[1][i], vt[0].index)) for i in range(shapes)]
    oracle = score_s([times[i] for i, (_v, times) in enumerate(fastest)], ranking_by)  # type: ignore[index]
    return DispatchGain(best.label, best_s, oracle or best_s, tuple(v.label for v, _t in fastest))


@dataclass(frozen=True)
class Phase:
    """Where tune's wall time went: one phase (probe, build, check, race, A/B, final check), its evals."""

    name: str
    seconds: float
    evals: int = 0  # evals (builds, for the build phase) it ran; the A/B's counted evals

    def to_json(self) -> dict:
        return {"name": self.name, "seconds": self.seconds, "evals": self.evals}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Phase":
        return cls(str(data["name"]), float(data["seconds"]), int(data.get("evals", 0)))


@dataclass(frozen=True)
class TuneReport:
    """`popkit tune FILE -o OUT`: the grid, every variant, the race, the A/B confirmations and the file written."""

    task: str
    submission: str
    sha256: str
    incumbent: str  # the file the finalists were confirmed against (the input, or --against)
    harness: str
    ranking_by: str
    engine: str  # grid or optuna
    parameters: tuple[Mapping[str, Any], ...]  # name, values, default, line
    constraints: tuple[str, ...]
    grid_points: int | None  # points of the grid the constraints keep (None: not enumerated, optuna)
    started_at: str
    duration_s: float
    variants: tuple[Variant, ...] = ()
    builds: int = 0  # toolchain runs (compile pre-steps) tune started
    race_rounds: int = 0
    winner: int | None = None  # a variant's index (PER_SHAPE for the per-shape file); None: the incumbent's values
    winner_label: str = ""
    confirmed: bool = False  # decided by A/B: the winner's interval lies below 1, or no variant was faster (input kept)
    decided_by: str = ""  # "A/B"; "race": its rounds separated the leader from every finalist, no A/B ran; "": neither
    per_shape: tuple[ShapeChoice, ...] = ()
    output: str = ""  # the file written ("": none)
    output_sha256: str = ""
    final_check: str = ""  # the written file's test-mode outcome
    stopped: str = "done"  # done; budget (the time budget cut a stage short); interrupted (Ctrl-C, SIGTERM)
    signal: int = 0  # the signal that stopped it (stopped == "interrupted")
    system: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    phases: tuple[Phase, ...] = ()  # where the wall time went, in the order the phases began
    build_root: str = ""  # where the builds live: a variant's extensions folder is BUILD_ROOT/tune-<its build>
    benchmarks: tuple[str, ...] = ()  # the benchmark shapes the race timed (specs, in the order of `rounds`)
    race_evals: str = ""  # "warm, N ahead" (warm pairs started N at a time), or "cold: why" (Tuner.warm_reason)
    schema: str = TUNE_SCHEMA

    @property
    def survivors(self) -> list[Variant]:
        return [v for v in self.variants if v.passed and v.index != PER_SHAPE]

    @property
    def winner_variant(self) -> Variant | None:
        return next((v for v in self.variants if v.index == self.winner), None) if self.winner is not None else None

    @property
    def dispatch_gain(self) -> DispatchGain | None:
        """Per-shape dispatch against the best single variant, over every variant the race timed."""
        return dispatch_gain(self.variants, len(self.benchmarks), self.ranking_by)

    @property
    def exit_code(self) -> ExitCode:
        """0 when the file was written and passed its check; 128 + the signal when stopped by one; else the outcome
        that stopped tune."""
        if self.stopped == "interrupted":
            known = {int(code) for code in ExitCode}
            return ExitCode(128 + self.signal) if 128 + self.signal in known else ExitCode.INTERRUPTED
        if self.output and self.final_check in ("passed", "skipped"):
            return ExitCode.OK
        if self.final_check and self.final_check != "passed":
            return OUTCOME_EXIT.get(self.final_check, ExitCode.FAILED)
        checked = {v.outcome for v in self.variants if v.outcome and v.index != PER_SHAPE}
        if len(checked) == 1 and "passed" not in checked:  # every variant failed the same way
            return OUTCOME_EXIT.get(checked.pop(), ExitCode.FAILED)
        return ExitCode.FAILED

    def to_json(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(parameters=[dict(p) for p in self.parameters], constraints=list(self.constraints),
                    variants=[v.to_json() for v in self.variants], per_shape=[c.to_json() for c in self.per_shape],
                    system=dict(self.system), notes=list(self.notes), exit_code=int(self.exit_code),
                    phases=[p.to_json() for p in self.phases], benchmarks=list(self.benchmarks),
                    dispatch_gain=gain.to_json() if (gain := self.dispatch_gain) is not None else None)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TuneReport":
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kwargs.update(parameters=tuple(dict(p) for p in data.get("parameters", ())),
                      constraints=tuple(data.get("constraints", ())),
                      variants=tuple(Variant.from_json(v) for v in data.get("variants", ())),
                      per_shape=tuple(ShapeChoice.from_json(c) for c in data.get("per_shape", ())),
                      system=dict(data.get("system") or {}), notes=tuple(data.get("notes", ())),
                      phases=tuple(Phase.from_json(p) for p in data.get("phases", ())),
                      benchmarks=tuple(data.get("benchmarks", ())))
        return cls(**kwargs)


__all__ = ["DispatchGain", "PER_SHAPE", "Phase", "dispatch_gain", "ShapeChoice", "TUNE_SCHEMA", "TuneReport", "Variant"]
