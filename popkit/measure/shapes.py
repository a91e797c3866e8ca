"""Timings compared shape by shape: the ratio time B / time A with its 95% interval, and the verdict.

Used by the A/B (ab.py, one series per shape over rounds) and by `popkit compare` (runcompare.py, two
recorded runs from their timed calls).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from popkit.model import stats
from popkit.model.results import CaseResult
from popkit.model.stats import Interval, Summary

A_FASTER, B_FASTER, SAME, UNKNOWN = "a_faster", "b_faster", "no_significant_difference", "too_few_samples"
INCOMPLETE = "incomplete"  # a shape failed or timed out on a side; for the score, a shape is missing
OK = "ok"


def verdict(ratio: Interval) -> str:
    """Which is faster, from the interval of time B / time A; spanning 1 means no significant difference."""
    if not ratio.defined:
        return UNKNOWN
    if ratio.high < 1.0:  # type: ignore[operator]
        return B_FASTER
    if ratio.low > 1.0:  # type: ignore[operator]
        return A_FASTER
    return SAME


@dataclass(frozen=True)
class ShapeComparison:
    """One benchmark shape timed for both candidates (ns); `ratio` is time B / time A."""

    spec: str
    a: Summary
    b: Summary
    ratio: Interval
    from_samples: bool  # False: the interval comes from runs/mean/std (no raw samples reported)
    a_samples_ns: tuple[float, ...] = ()
    b_samples_ns: tuple[float, ...] = ()

    @property
    def verdict(self) -> str:
        return verdict(self.ratio)

    def to_json(self) -> dict:
        data = asdict(self)
        data["ratio"] = self.ratio.to_json()
        data["a_samples_ns"], data["b_samples_ns"] = list(self.a_samples_ns), list(self.b_samples_ns)
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ShapeComparison":
        return cls(spec=data["spec"], a=Summary(**data["a"]), b=Summary(**data["b"]),
                   ratio=Interval.from_json(data["ratio"]), from_samples=data["from_samples"],
                   a_samples_ns=tuple(data.get("a_samples_ns", ())), b_samples_ns=tuple(data.get("b_samples_ns", ())))


@dataclass(frozen=True)
class Comparison:
    """Per-shape ratios and the score ratio (geometric mean of the per-shape ratios)."""

    a_label: str
    b_label: str
    shapes: tuple[ShapeComparison, ...] = ()
    score: Interval | None = None
    missing: tuple[str, ...] = ()  # shapes timed on one side only: the score leaves them out

    @property
    def verdict(self) -> str:
        if self.missing:
            return INCOMPLETE
        return verdict(self.score) if self.score is not None else UNKNOWN

    def to_json(self) -> dict:
        return {"a_label": self.a_label, "b_label": self.b_label, "shapes": [s.to_json() for s in self.shapes],
                "score": self.score.to_json() if self.score else None, "missing": list(self.missing),
                "verdict": self.verdict}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Comparison":
        return cls(a_label=data["a_label"], b_label=data["b_label"],
                   shapes=tuple(ShapeComparison.from_json(s) for s in data.get("shapes", ())),
                   score=Interval.from_json(data["score"]) if data.get("score") else None,
                   missing=tuple(data.get("missing", ())))


def _summary(cases: Sequence[CaseResult]) -> tuple[Summary, tuple[float, ...]]:
    """Pool one shape's timings over rounds: raw samples when every round has them, else summaries."""
    samples = tuple(x for c in cases for x in c.samples_ns)
    if cases and all(len(c.samples_ns) >= 1 for c in cases) and len(samples) >= 2:
        return Summary.of(samples), samples
    parts = [Summary(n=max(c.runs, 1), mean=float(c.mean_ns), std=float(c.std_ns or 0.0))  # type: ignore[arg-type]
             for c in cases]
    return stats.pooled_summary(parts), ()


def compare_shapes(a_rounds: Mapping[str, Sequence[CaseResult]], b_rounds: Mapping[str, Sequence[CaseResult]],
                   a_label: str = "A", b_label: str = "B") -> Comparison:
    """Compare timings shape by shape (keyed by spec, in A's order).

    A shape timed on one side only is named in `missing`, and the score's verdict is then incomplete.
    """
    shapes, missing = [], []
    for spec in list(a_rounds) + [spec for spec in b_rounds if spec not in a_rounds]:
        a_timed = [c for c in a_rounds.get(spec, ()) if c.mean_ns]
        b_timed = [c for c in b_rounds.get(spec, ()) if c.mean_ns]
        if not a_timed or not b_timed:
            missing.append(spec)
            continue
        a_sum, a_samples = _summary(a_timed)
        b_sum, b_samples = _summary(b_timed)
        from_samples = bool(a_samples and b_samples)
        ratio = stats.ratio_ci95_summary(b_sum, a_sum)
        shapes.append(ShapeComparison(spec, a_sum, b_sum, ratio, from_samples,
                                      a_samples if from_samples else (), b_samples if from_samples else ()))
    score = stats.geomean_ratio_ci95([(s.b, s.a) for s in shapes]) if shapes else None
    return Comparison(a_label, b_label, tuple(shapes), score, tuple(missing))
