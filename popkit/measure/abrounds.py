"""The A/B's decision over rounds: each shape's series, stalled rounds replaced, the looks and their intervals.

Pure (no processes): popkit/measure/ab.py feeds it one round at a time, and the simulation
(popkit/measure/absim.py) feeds it synthetic rounds to check the guarantee against false winners and the
power it keeps.

A host stall can slow a whole eval process (every call of it, so its median too): one such round among
four turned a consistent 1.7x slowdown into "no significant difference" (its log ratio three times the
others' widened the Student t interval past 1). So a round is **stalled** on a side when that side's
statistic there (the eval's median of its timed calls, else its mean) is more than STALL_FACTOR times the
median of the same side's other rounds. A few stalled calls inside an eval (its mean far above its median,
the report's noise warning) do not make a stall here: the median the A/B decides on already ignores them.
Each side is judged against itself, never against the other side, so a real difference between A and B is
never a stall; a stall only slows, so only the slow side of the distribution is tested. A stalled round is
left out of that shape's interval (kept in the record, with its reason) and the shape gets a replacement
round, at most `replacements(max_rounds)` of them. Looks happen at counts of kept rounds, so the interval
of every look still counts only the rounds it uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

from popkit.measure.shapes import A_FASTER, B_FASTER, INCOMPLETE, OK, UNKNOWN, verdict
from popkit.model import stats
from popkit.model.results import CaseResult, ModeRun, score_s
from popkit.model.stats import Interval

FIRST_LOOK = 4  # kept rounds before the first interval: two ABBA blocks, t with 3 degrees of freedom
ALPHA = 1.0 - stats.CONFIDENCE
EQUIVALENCE = 0.01  # an interval inside [1/1.01, 1.01] settles a shape: no difference above 1%
STALL_FACTOR = 1.25  # a round's time this far above the side's other rounds (or an eval's mean above its median)
SIDES = ("A", "B")


def looks(max_rounds: int) -> dict[int, float]:
    """The counts of kept rounds at which the A/B looks at a series, each with the share of α it spends.

    One look after every ABBA block from FIRST_LOOK rounds on. The first look, where the default
    time budget usually ends an A/B, spends half of α; the later looks share the other half. The
    shares are fixed before any data and sum to α, so by the union bound the intervals of all looks
    cover the true ratio together with probability at least 1 - α: the interval shown at whatever
    look the A/B stopped is a 95% interval, whatever made it stop (repeated confidence intervals).
    """
    if max_rounds < FIRST_LOOK or max_rounds % 2:
        raise ValueError(f"the rounds must be even and at least {FIRST_LOOK} (got {max_rounds})")
    rounds = list(range(FIRST_LOOK, max_rounds + 1, 2))
    if len(rounds) == 1:
        return {rounds[0]: ALPHA}
    return {n: ALPHA / 2 if i == 0 else ALPHA / 2 / (len(rounds) - 1) for i, n in enumerate(rounds)}


def replacements(max_rounds: int) -> int:
    """How many stalled rounds a series may leave out and replace: half its rounds (with more, slow rounds
    are the machine's normal state, which the interval must then show; the median of the other rounds a
    stall is judged against stays a clean round's while most are clean)."""
    return max_rounds // 2


def round_order(round_index: int) -> tuple[str, str]:
    """ABBA: A first in even rounds (0, 2, ...), B first in odd ones; each look sees both first equally often."""
    return SIDES if round_index % 2 == 0 else SIDES[::-1]


def stalled_rounds(values: Sequence[float], limit: int | None = None) -> dict[int, str]:
    """The rounds (index -> reason) whose value is more than STALL_FACTOR x the median of the other rounds (at
    least two); at most `limit`, the farthest first."""
    found: dict[int, float] = {}
    for j, value in enumerate(values):
        others = [v for k, v in enumerate(values) if k != j]
        typical = stats.median(others) if len(others) >= 2 else 0.0
        if typical > 0 and value > STALL_FACTOR * typical:
            found[j] = value / typical
    farthest = sorted(found, key=lambda j: -found[j])[:limit]
    return {j: f"{found[j]:.2f}x the median of its other rounds" for j in sorted(farthest)}


@dataclass(frozen=True)
class Series:
    """One shape (or the score) over the rounds: each side's per-round time (ns) and the interval of B / A.

    `ratio` is the interval at the last look this series took part in, at level 1 - `alpha`, over the
    rounds not in `stalled`; None before the first look. `stalled` maps a left-out round to
    "A: why" / "B: why". `status` is `ok`, or the outcome on side `status_side` (`failed`, `timed_out`,
    `crashed`, ...), or `incomplete` for a score that lacks the shapes in `missing`. `held` is why no
    winner may be named from this series (the arms ran at different clocks, throttled), or "".
    """

    spec: str
    a_ns: tuple[float, ...] = ()
    b_ns: tuple[float, ...] = ()
    a_means_ns: tuple[float, ...] = ()  # each round's eval mean (what the leaderboard ranks), for the history
    b_means_ns: tuple[float, ...] = ()
    ratio: Interval | None = None
    alpha: float | None = None
    status: str = OK
    status_side: str = ""
    missing: tuple[str, ...] = ()
    stalled: Mapping[int, str] | None = None
    held: str = ""

    @property
    def rounds(self) -> int:
        return min(len(self.a_ns), len(self.b_ns))

    @property
    def kept(self) -> list[int]:
        """The rounds the interval uses: all but the stalled ones."""
        return [r for r in range(self.rounds) if r not in (self.stalled or {})]

    def values(self, side: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Side "A" or "B": (each round's statistic, each round's eval mean)."""
        return (self.a_ns, self.a_means_ns) if side == "A" else (self.b_ns, self.b_means_ns)

    def extended(self, side: str, value: float, mean: float) -> "Series":
        """This series with one more round on `side`."""
        ns, means = self.values(side)
        key = side.lower()
        return replace(self, **{f"{key}_ns": ns + (value,), f"{key}_means_ns": means + (mean,)})

    @property
    def mean_ratio(self) -> float | None:
        """B / A of the rounds' eval means, every round included (what the leaderboard would rank), or None."""
        n = min(len(self.a_means_ns), len(self.b_means_ns))
        if not n or not all(self.a_means_ns[:n]) or not all(self.b_means_ns[:n]):
            return None
        return stats.mean(self.b_means_ns[:n]) / stats.mean(self.a_means_ns[:n])

    @property
    def verdict(self) -> str:
        if self.status != OK:
            return INCOMPLETE
        if self.ratio is None:
            return UNKNOWN
        named = verdict(self.ratio)
        return "no_significant_difference" if self.held and named in (A_FASTER, B_FASTER) else named

    @property
    def settled(self) -> bool:
        """A winner, or no difference above EQUIVALENCE: more rounds would not change what to do."""
        if self.status != OK or self.ratio is None or not self.ratio.defined:
            return False
        inside = 1 / (1 + EQUIVALENCE) <= self.ratio.low and self.ratio.high <= 1 + EQUIVALENCE  # type: ignore
        return verdict(self.ratio) in (A_FASTER, B_FASTER) or inside

    def find_stalls(self, limit: int, forced: Mapping[int, str] | None = None) -> dict[int, str]:
        """The stalled rounds of this series (each side against itself), with `forced` ones added first."""
        found = dict(forced or {})
        for side in SIDES:
            for j, why in stalled_rounds(self.values(side)[0][:self.rounds], limit).items():
                found.setdefault(j, f"{side}: {why}")
        farthest = sorted(found)[:limit] if len(found) > limit else sorted(found)
        return {j: found[j] for j in farthest}

    def at_look(self, rounds: int, alpha: float, stalled: Mapping[int, str] | None = None) -> "Series":
        """This series cut to its first `rounds` rounds, with the interval a look there gives over the rounds
        not `stalled` (default: the ones it had)."""
        stalled = {j: w for j, w in (self.stalled if stalled is None else stalled).items() if j < rounds}
        a, b = self.a_ns[:rounds], self.b_ns[:rounds]
        ratio = stats.paired_ratio_interval([b[j] / a[j] for j in range(rounds) if j not in stalled], 1 - alpha)
        return replace(self, a_ns=a, b_ns=b, a_means_ns=self.a_means_ns[:rounds],
                       b_means_ns=self.b_means_ns[:rounds], ratio=ratio, alpha=alpha, stalled=stalled or None)

    def to_json(self) -> dict:
        data = asdict(self)
        data["ratio"] = self.ratio.to_json() if self.ratio is not None else None
        data["stalled"] = {str(j): why for j, why in (self.stalled or {}).items()}
        data.update(rounds=self.rounds, kept=len(self.kept), verdict=self.verdict, mean_ratio=self.mean_ratio)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Series":
        return cls(spec=data["spec"], a_ns=tuple(data["a_ns"]), b_ns=tuple(data["b_ns"]),
                   a_means_ns=tuple(data.get("a_means_ns", ())), b_means_ns=tuple(data.get("b_means_ns", ())),
                   ratio=Interval.from_json(data["ratio"]) if data.get("ratio") else None, alpha=data.get("alpha"),
                   status=data.get("status", OK), status_side=data.get("status_side", ""),
                   missing=tuple(data.get("missing", ())),
                   stalled={int(j): why for j, why in data["stalled"].items()} if data.get("stalled") else None,
                   held=data.get("held", ""))


def _spec(case: Mapping[str, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in case.items())


class Rounds:
    """The A/B's state between rounds: each shape's series, which shapes still run, and the score's series.

    A series looks when its kept rounds reach a look count it has not used yet; it leaves once settled,
    once its kept rounds reach `max_rounds`, or once it has run `max_rounds + replacements` rounds.
    """

    def __init__(self, cases: Sequence[Mapping[str, Any]], ranking_by: str, max_rounds: int):
        self.cases, self.ranking_by, self.max_rounds = list(cases), ranking_by, max_rounds
        self.alphas = looks(max_rounds)
        self.limit = replacements(max_rounds)
        self.shapes = [Series(_spec(c)) for c in cases]
        self.score = Series("score")
        self.scoring = [len(cases) - 1] if ranking_by == "last" else list(range(len(cases)))
        self.active = list(range(len(cases)))
        self.last_look: dict[int | str, tuple[int, int, dict[int, str]]] = {}  # key -> (kept, rounds, stalled)
        self.score_open = True  # the score still takes rounds
        self.statistic = ""
        self.done = 0

    def value(self, case: CaseResult) -> float:
        if not self.statistic:
            self.statistic = "median" if case.median_ns else "mean"
        return float(case.median_ns if self.statistic == "median" and case.median_ns else case.mean_ns)  # type: ignore

    def add(self, runs: Mapping[str, ModeRun]) -> None:
        """One complete round: both sides' evals over the active shapes, every shape timed."""
        for side, run in runs.items():
            for i, case in zip(self.active, run.benchmarks):
                self.shapes[i] = self.shapes[i].extended(side, self.value(case), float(case.mean_ns))  # type: ignore
        if self.score_open:  # every scoring shape is still active: this round has them all
            for side in SIDES:
                rows = [self.shapes[i].values(side) for i in self.scoring]
                value = score_s([ns[-1] for ns, _ in rows], self.ranking_by)
                mean = score_s([means[-1] for _, means in rows], self.ranking_by)
                self.score = self.score.extended(side, value * 1e9, mean * 1e9)  # type: ignore[operator]
        self.done += 1
        self._look()

    def first_looks_done(self) -> bool:
        """Whether every series still running has had its first look (the budget may stop the A/B only then)."""
        keys: list[int | str] = list(self.active) + (["score"] if self.score_open else [])
        return all(k in self.last_look for k in keys)

    def _series(self, key: int | str) -> Series:
        return self.score if key == "score" else self.shapes[key]  # type: ignore[index]

    def _stalls(self, key: int | str) -> dict[int, str]:
        if key != "score":
            return self._series(key).find_stalls(self.limit)
        # the score's rounds are the first len(score) rounds of every scoring shape: a shape's stall is the score's
        forced = {}
        for i in self.scoring:
            for j, why in self.shapes[i].find_stalls(self.limit).items():
                if j < self.score.rounds:
                    forced.setdefault(j, f"{self.shapes[i].spec}: {why}")
        return self.score.find_stalls(self.limit, forced)

    def _due(self, key: int | str) -> tuple[Series, bool] | None:
        """A look at series `key` if its kept rounds reached a look count not used yet: (the series there,
        whether it is finished: settled, out of looks or out of replacements)."""
        series = self._series(key)
        stalled = self._stalls(key)
        kept = series.rounds - len(stalled)
        used = self.last_look.get(key, (0, 0, {}))[0]
        due = [n for n in self.alphas if used < n <= kept]
        if not due:
            return None
        at = series.at_look(series.rounds, self.alphas[max(due)], stalled)
        self.last_look[key] = (max(due), series.rounds, stalled)
        return at, at.settled or kept >= self.max_rounds

    def _look(self) -> None:
        """Looks that are due: settled shapes leave, unless an unsettled score still needs them."""
        if self.score_open:
            look = self._due("score")
            if look is not None and look[1]:
                self.score_open = False
            elif self.score.rounds >= self.max_rounds + self.limit:
                self.score_open = False
        still = []
        for i in self.active:
            look = self._due(i)
            finished = (look is not None and look[1]) or self.shapes[i].rounds >= self.max_rounds + self.limit
            if (self.score_open and i in self.scoring) or not finished:
                still.append(i)
        self.active = still

    def mark_failed(self, side: str, outcome: str, benchmarks: Sequence[CaseResult] = ()) -> None:
        """An eval (or the pre-step) of `side` did not pass: the shapes it did not time get its outcome."""
        timed = {i for i, c in zip(self.active, benchmarks) if c.passed and c.mean_ns}
        for pos, i in enumerate(self.active):
            if i in timed:
                continue
            failed_here = pos < len(benchmarks) and not benchmarks[pos].passed
            self.shapes[i] = replace(self.shapes[i], status="failed" if failed_here else outcome, status_side=side)

    def _final(self, key: int | str) -> Series:
        series = self._series(key)
        if key not in self.last_look:
            return series
        kept, rounds, stalled = self.last_look[key]
        return series.at_look(rounds, self.alphas[kept], stalled)

    def final(self, held: str = "") -> tuple[tuple[Series, ...], Series]:
        """Every series at its last look (untouched before the first), and the score, incomplete if a shape is;
        `held` (why no winner may be named) is set on every series."""
        shapes = tuple(replace(self._final(i), held=held) for i in range(len(self.shapes)))
        score = replace(self._final("score"), held=held)
        missing = tuple(shapes[i].spec for i in self.scoring if shapes[i].status != OK)
        if missing:
            score = replace(score, status=INCOMPLETE, missing=missing)
        return shapes, score

    def all_settled(self) -> bool:
        """Whether every shape (and the score) that had a look ended settled: the A/B stopped on its evidence."""
        keys = [k for k in list(range(len(self.shapes))) + ["score"] if k in self.last_look]
        return bool(keys) and all(self._final(k).settled for k in keys)

    def extra(self) -> str:
        """' (+n replacing stalled rounds)' while rounds beyond `max_rounds` run, else ''."""
        return f" (+{self.done + 1 - self.max_rounds} replacing stalled rounds)" if self.done >= self.max_rounds else ""

    def over_budget(self, elapsed_s: float, eval_s: Sequence[float], budget_s: float) -> bool:
        """Whether the A/B stops for its time budget now: only between ABBA blocks, only once every running
        series had its first look, and only when a block (four evals of the mean time so far) would not fit."""
        if not budget_s or self.done % 2 or not self.first_looks_done():
            return False
        return elapsed_s + (4 * stats.mean(eval_s) if eval_s else 0.0) > budget_s
