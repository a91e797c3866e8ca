"""Statistics on raw timing samples (nanoseconds): mean, spread, 95% intervals, ratios.

Pure functions, no randomness: intervals are t-based, so the same samples always give the same
answer and tests can check them against values worked out by hand. Times and ratios are positive
and skewed, so their intervals are built on the log scale and exponentiated: never below zero, and
asymmetric around the estimate. The A/B's interval (`paired_ratio_interval`) takes one ratio per
round, paired (Student t on the log ratios); `ratio_ci95` compares two samples of calls (delta method,
Welch-Satterthwaite degrees of freedom).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

CONFIDENCE = 0.95


def quantile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of the samples, linear between order statistics."""
    if not samples:
        raise ValueError("quantile of no samples")
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def mean(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("mean of no samples")
    return math.fsum(samples) / len(samples)


def std(samples: Sequence[float]) -> float:
    """Sample standard deviation (n - 1 in the denominator), as the leaderboard's eval computes it; 0 for n < 2."""
    n = len(samples)
    if n < 2:
        return 0.0
    m = mean(samples)
    return math.sqrt(math.fsum((x - m) ** 2 for x in samples) / (n - 1))


def err(samples: Sequence[float]) -> float:
    """Standard error of the mean: std / sqrt(n) (the protocol's `err`)."""
    return std(samples) / math.sqrt(len(samples)) if samples else 0.0


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("median of no samples")
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# ------------------------------------------------------------------------- Student's t quantile


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (df may be fractional, as Welch's is)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0 (got p={p}, df={df})")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):  # bisection: the cdf is monotone, and 200 halvings reach machine precision
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def normal_quantile(p: float) -> float:
    """The p-quantile of the standard normal (the limit of Student's t as df grows)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"normal_quantile needs 0 < p < 1 (got {p})")
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


# ------------------------------------------------------------------------------------ intervals


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95% interval; low/high are None when too few samples define one."""

    estimate: float
    low: float | None
    high: float | None

    def __iter__(self):
        """Unpacks as `low, high`, the way an interval is usually written."""
        return iter((self.low, self.high))

    @property
    def defined(self) -> bool:
        return self.low is not None and self.high is not None

    def contains(self, value: float) -> bool:
        """Whether `value` lies inside; an undefined interval contains everything (nothing is shown)."""
        if not self.defined:
            return True
        return self.low <= value <= self.high  # type: ignore[operator]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Interval":
        return cls(estimate=data["estimate"], low=data.get("low"), high=data.get("high"))


@dataclass(frozen=True)
class Summary:
    """What an interval needs from a sample: its size, mean and sample standard deviation (ns)."""

    n: int
    mean: float
    std: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Summary":
        return cls(n=len(samples), mean=mean(samples), std=std(samples))


def pooled_summary(parts: Sequence[Summary]) -> Summary:
    """The summary of several samples taken together, from their summaries alone.

    Exact: the same n, mean and sample std as concatenating the raw samples would give. Used when
    an eval reports only runs/mean/std per process and several processes timed the same shape.
    """
    if not parts:
        raise ValueError("pooled summary of nothing")
    n = sum(p.n for p in parts)
    if n == 0:
        raise ValueError("pooled summary of empty samples")
    m = math.fsum(p.n * p.mean for p in parts) / n
    squares = math.fsum((p.n - 1) * p.std ** 2 + p.n * (p.mean - m) ** 2 for p in parts if p.n)
    return Summary(n=n, mean=m, std=math.sqrt(squares / (n - 1)) if n > 1 else 0.0)


def mean_ci95(samples: Sequence[float]) -> Interval:
    """t-based 95% interval of the mean: mean ± t(0.975, n-1) · std/sqrt(n)."""
    m = mean(samples)
    n = len(samples)
    if n < 2:
        return Interval(m, None, None)
    half = t_quantile(0.5 + CONFIDENCE / 2, n - 1) * err(samples)
    return Interval(m, m - half, m + half)


def positive_mean_interval(mean_: float, err_: float, n: int, confidence: float = CONFIDENCE) -> Interval:
    """Interval of the mean of positive samples, on the log scale: mean · exp(±t(n-1) · err/mean).

    The delta method gives var(log mean) ≈ (err/mean)²; exponentiating keeps both ends positive
    (mean ± t·err can go below zero when a few stalled calls make the spread larger than the mean).
    For a small relative error it agrees with mean ± t·err to first order. Undefined for n < 2.
    """
    if mean_ <= 0:
        raise ValueError("a positive-mean interval needs a positive mean")
    if n < 2:
        return Interval(mean_, None, None)
    half = t_quantile(0.5 + confidence / 2, n - 1) * err_ / mean_
    return Interval(mean_, mean_ * math.exp(-half), mean_ * math.exp(half))


def positive_mean_ci95(samples: Sequence[float]) -> Interval:
    """95% interval of the mean of positive samples (times), never below zero: see positive_mean_interval."""
    return positive_mean_interval(mean(samples), err(samples), len(samples))


def paired_ratio_interval(ratios: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Interval of the typical ratio from independent per-round ratios (one per round, paired).

    Student t on the log ratios: exp(mean ± t(1-α/2, n-1) · sd/√n), where α = 1 - confidence. The
    estimate is the geometric mean of the ratios. Only the rounds are counted as independent, so the
    spread between rounds (between processes) is the spread the interval is built from.
    """
    if any(r <= 0 for r in ratios):
        raise ValueError("ratios must be positive")
    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return Interval(math.exp(mean(logs)), None, None)
    return _interval(mean(logs), err(logs) ** 2, len(logs) - 1, confidence)


@dataclass(frozen=True)
class _LogRatio:
    value: float  # log of the ratio of means
    var: float  # its variance (delta method)
    df: float  # Welch-Satterthwaite degrees of freedom; inf when the variance is exactly 0


def _log_ratio(a: Summary, b: Summary) -> _LogRatio | None:
    if a.mean <= 0 or b.mean <= 0:
        raise ValueError("ratios need positive means")
    if a.n < 2 or b.n < 2:
        return None
    va = a.std ** 2 / (a.n * a.mean ** 2)  # var(log mean) ≈ (relative standard error)^2
    vb = b.std ** 2 / (b.n * b.mean ** 2)
    var = va + vb
    denom = (va ** 2 / (a.n - 1) if va else 0.0) + (vb ** 2 / (b.n - 1) if vb else 0.0)
    return _LogRatio(math.log(a.mean / b.mean), var, var ** 2 / denom if denom else math.inf)


def _interval(value: float, var: float, df: float, confidence: float = CONFIDENCE) -> Interval:
    estimate = math.exp(value)
    if var == 0:
        return Interval(estimate, estimate, estimate)
    q = t_quantile(0.5 + confidence / 2, df) if math.isfinite(df) else normal_quantile(0.5 + confidence / 2)
    half = q * math.sqrt(var)
    return Interval(estimate, math.exp(value - half), math.exp(value + half))


def ratio_ci95_summary(a: Summary, b: Summary) -> Interval:
    """95% interval of mean(a) / mean(b) from summaries (the fallback when raw samples are absent)."""
    part = _log_ratio(a, b)
    if part is None:
        return Interval(a.mean / b.mean, None, None)
    return _interval(part.value, part.var, part.df)


def ratio_ci95(a: Sequence[float], b: Sequence[float]) -> Interval:
    """95% interval of mean(a) / mean(b) on raw samples: exp(log r ± t · se), se by the delta method."""
    return ratio_ci95_summary(Summary.of(a), Summary.of(b))


def geomean_ratio_ci95(pairs: Sequence[tuple[Summary, Summary]]) -> Interval:
    """95% interval of the geometric mean of per-shape ratios mean(a_i) / mean(b_i).

    The log of the geomean is the average of the per-shape log ratios; their variances add
    (shapes are timed independently), divided by k², with Satterthwaite's degrees of freedom.
    """
    if not pairs:
        raise ValueError("geomean of no ratios")
    parts = [_log_ratio(a, b) for a, b in pairs]
    k = len(pairs)
    if any(p is None for p in parts):
        estimate = math.exp(math.fsum(math.log(a.mean / b.mean) for a, b in pairs) / k)
        return Interval(estimate, None, None)
    value = math.fsum(p.value for p in parts) / k  # type: ignore[union-attr]
    scaled = [p.var / k ** 2 for p in parts]  # type: ignore[union-attr]
    var = math.fsum(scaled)
    denom = math.fsum(v ** 2 / p.df for v, p in zip(scaled, parts) if v and math.isfinite(p.df))  # type: ignore
    return _interval(value, var, var ** 2 / denom if denom else math.inf)


def sum_ratio_ci95(pairs: Sequence[tuple[Summary, Summary]]) -> Interval:
    """95% interval of sum(mean(a_i)) / sum(mean(b_i)): the ratio of two `ranking_by: mean` scores.

    Delta method on the log of each sum: var(log Σ) ≈ Σ var(mean_i) / (Σ mean_i)², with var(mean_i) = std²/n;
    the two sides add, with Satterthwaite's degrees of freedom over every shape of both sides.
    """
    if not pairs:
        raise ValueError("ratio of no sums")
    a_sum = math.fsum(a.mean for a, _ in pairs)
    b_sum = math.fsum(b.mean for _, b in pairs)
    if a_sum <= 0 or b_sum <= 0:
        raise ValueError("ratios need positive means")
    estimate = math.log(a_sum / b_sum)
    if any(s.n < 2 for pair in pairs for s in pair):
        return Interval(math.exp(estimate), None, None)
    parts = [(s.std ** 2 / s.n / total ** 2, s.n - 1)
             for pair in pairs for s, total in zip(pair, (a_sum, b_sum))]
    var = math.fsum(v for v, _ in parts)
    denom = math.fsum(v ** 2 / df for v, df in parts if v)
    return _interval(estimate, var, var ** 2 / denom if denom else math.inf)


def score_ratio_ci95(pairs: Sequence[tuple[Summary, Summary]], ranking_by: str) -> Interval:
    """95% interval of score(a) / score(b) for a task's `ranking_by`, from per-shape (a_i, b_i) summaries in the
    task's order: the geometric mean of the ratios (geom), the ratio of sums (mean), the last shape's (last)."""
    if ranking_by == "last":
        return ratio_ci95_summary(*pairs[-1])
    if ranking_by == "mean":
        return sum_ratio_ci95(pairs)
    return geomean_ratio_ci95(pairs)


# Statistics popkit derives from a case's raw timed calls (CaseResult.samples_ns, ns), never asked of the harness:
# every report's JSON carries them per case (`derived`). A new one is one entry here (docs/design.md, extension points).
DERIVED: dict[str, Callable[[Sequence[float]], float]] = {
    "median": lambda s: median(s),
    "p10": lambda s: quantile(s, 0.10),
    "p90": lambda s: quantile(s, 0.90),
    "trimmed_mean": lambda s: mean(sorted(s)[len(s) // 10:len(s) - len(s) // 10] or list(s)),
}


def derived(samples: Sequence[float]) -> dict[str, float]:
    """Every DERIVED statistic of the samples ({} without samples)."""
    return {name: float(f(samples)) for name, f in DERIVED.items()} if samples else {}
