"""Frozen results of a local run; each serializes itself (`to_json`) and back (`from_json`).

Times are nanoseconds (`_ns`) or seconds (`_s`) as their names say. Raw samples are kept where
the eval reports them; statistics shown beyond the protocol's own are derived from them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from popkit.errors import ExitCode
from popkit.model.diagnostics import Diagnostic
from popkit.model.gpus import CPU_COPY_MARGIN, cpu_copy_peak, peak_bandwidth
from popkit.model.stats import derived, median

RUN_SCHEMA = "popkit/run/1"
# Markers of a failed extension build in a child's output (load_inline, ninja, nvcc, ptxas, the linker).
COMPILE_MARKERS = ("Error building extension", "ninja: build stopped", "nvcc fatal", "ptxas fatal",
                   "collect2: error")
SUCCESS_EXIT_CODES = (0, 112)  # docs/protocol-notes.md §2: a run succeeded when its exit code is 0 or 112
TIMEOUT_EXIT_CODE = 114

# What went wrong, most specific first; each maps to one documented exit code.
OUTCOME_EXIT = {
    "passed": ExitCode.OK,
    "failed": ExitCode.FAILED,
    "bad_submission": ExitCode.BAD_SUBMISSION,
    "bad_task": ExitCode.BAD_TASK,  # the task's reference failed (popkit's harness names it)
    "compile_failed": ExitCode.COMPILE_FAILED,
    "crashed": ExitCode.CRASHED,
    "timed_out": ExitCode.TIMED_OUT,
    "needs_gpu": ExitCode.ENVIRONMENT,  # the code asked torch for CUDA where there is none (protocol.NO_CUDA_MARKERS)
}


def _build(cls, data: Mapping[str, Any], **nested):
    """Construct dataclass `cls` from a JSON mapping, ignoring unknown keys, tuples for lists."""
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        kwargs[f.name] = nested[f.name](value) if f.name in nested else (
            tuple(value) if isinstance(value, list) else value)
    return cls(**kwargs)


@dataclass(frozen=True)
class CaseResult:
    """One test or benchmark case as the eval reported it on the pipe."""

    kind: str  # "test" or "benchmark"
    index: int
    spec: str
    passed: bool
    error: str = ""
    message: str = ""
    runs: int = 0
    mean_ns: float | None = None
    std_ns: float | None = None
    err_ns: float | None = None
    best_ns: float | None = None
    worst_ns: float | None = None
    median_ns: float | None = None  # popkit harness extra
    samples_ns: tuple[float, ...] = ()  # popkit harness extra: every timed call, in order
    stop: str = ""  # popkit harness extra: why timing stopped
    timer: str = ""  # popkit harness extra: cuda-event or cpu-monotonic
    report: str = ""  # profile mode: the profiler table, decoded
    bytes: int | None = None  # popkit harness extra: the fewest bytes one call must move
    # popkit harness extras, one per timed call. From its trace: its kernels' GPU busy time, the idle time between
    # its first kernel's start and last one's end, its launches, its work on another queue its events missed (in
    # its sample). The time witness's: what the trusted clock saw beyond the report and the credited overhead.
    kernel_ns: tuple[float, ...] = ()
    gap_ns: tuple[float, ...] = ()
    launches: tuple[float, ...] = ()
    added_ns: tuple[float, ...] = ()
    unexplained_ns: tuple[float, ...] = ()

    @property
    def breakdown(self) -> dict[str, float]:
        """What a call's time is made of, medians over the timed calls: `kernel_ns` (its kernels' GPU time),
        `gap_ns`, `launches`, `other_ns` (the event time's median less kernels and gaps: launch and event
        overhead) and `kernel_share` of the event time; {} when the harness sent no trace."""
        if not self.kernel_ns:
            return {}
        out = {"kernel_ns": median(self.kernel_ns)}
        if self.gap_ns:
            out["gap_ns"] = median(self.gap_ns)
        if self.launches:
            out["launches"] = median(self.launches)
        event = self.median_ns or (median(self.samples_ns) if self.samples_ns else self.mean_ns)
        if event:
            out["other_ns"] = event - out["kernel_ns"] - out.get("gap_ns", 0.0)
            out["kernel_share"] = out["kernel_ns"] / event
        return out

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """What the mean time implies: bytes that must move over the mean (counting reads and writes)."""
        if not self.bytes or not self.mean_ns:
            return None
        return self.bytes / (self.mean_ns / 1e9)

    @property
    def timed(self) -> bool:
        return self.mean_ns is not None

    def to_json(self) -> dict:
        data = asdict(self)
        data["derived"] = derived(self.samples_ns)  # stats.DERIVED from the raw samples (ignored by from_json)
        data["breakdown"] = self.breakdown  # ignored by from_json
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CaseResult":
        return _build(cls, data)


# A kernel cannot move its inputs and outputs faster than the memory's peak bandwidth (popkit.model.gpus): a mean
# time that implies more missed work (left running after the end event, or on another queue), or a result
# was never computed, so the case fails ("time beats physics", judge_physics).
PHYSICS_SLACK = 1.05  # measurement noise and datasheet rounding, on top of the GPU's peak bandwidth


def beats_physics(case: CaseResult, device: str | None, copy_peak: float | None = None) -> str:
    """One line saying why the case's mean time is impossible (it implies more than the device's peak bandwidth;
    the CPU's: `copy_peak`, gpus.cpu_copy_peak), or "" when it is possible or cannot be judged."""
    cpu, implied = the_device(device) == "the CPU", case.bandwidth_bytes_per_s
    peak = copy_peak if cpu else peak_bandwidth(device)
    if implied is None or peak is None or implied <= peak * (1.0 if cpu else PHYSICS_SLACK):
        return ""
    where = (f"{CPU_COPY_MARGIN:g}x the CPU's measured copy bandwidth ({peak / CPU_COPY_MARGIN / 1e12:.3f} TB/s)"
             if cpu else f"the {device}'s {peak / 1e12:.2f} TB/s peak")
    return (f"{case.spec}: {implied / 1e12:.2f} TB/s implied, above {where}: "
            "this time cannot be right (work left running after the end event, or a result not computed)")


# A mean more than 3% above the median at any shape: the run's tail moved the score. Calibrated on
# 21 `popkit bench` runs on H100s (docs/benchmarks.md): the scores of the runs this does not flag
# agreed within 0.73% per task; the flagged ones were off by up to 134%.
NOISE_LIMIT = 1.03
NOISE_MIN_RUNS = 10


def the_device(device: str | None) -> str:
    """How a report names the device a run timed on: `the CPU`, `the GPU`, or `the device` when unknown."""
    if not device:
        return "the device"
    return "the CPU" if device.strip().lower() == "cpu" else "the GPU"


def _noise_excess(case: CaseResult) -> float | None:
    """How far (a fraction) the case's mean sits above its median when that is noise; None when it is not."""
    if not case.mean_ns or not case.median_ns or case.runs < NOISE_MIN_RUNS:
        return None
    excess = case.mean_ns / case.median_ns - 1
    return excess if excess > NOISE_LIMIT - 1 else None


def _noise_cause(device: str | None) -> str:
    return (f"a few slow calls (other work on {the_device(device)}, clocks, the host) pulled the mean, which is what "
            "ranks; rerun before trusting a difference this size")


def noisy_timing(case: CaseResult, device: str | None = None) -> str:
    """A one-line warning when a few slow calls pulled the case's mean well above its median.

    The leaderboard ranks the mean, so popkit reports it unchanged; on a GPU shared with other work,
    or while clocks settle, one run's mean can land several percent above the next run's. Measured on
    an H100, three `popkit bench` runs of vectoradd at 8192x8192 gave 138, 198 and 138 µs, the middle
    one with a standard error of 14 µs against 0.14 µs for the others.
    Multi-millisecond stalls of the machine, not the kernel, did that; they show up as a mean well above
    the median. `device` (the report's `system.device`, `cpu` on a CPU) names where the other work ran.
    """
    excess = _noise_excess(case)
    if excess is None:
        return ""
    return (f"{case.spec}: mean {case.mean_ns / 1e3:.1f} µs is {excess * 100:.0f}% above the median "  # type: ignore[operator]
            f"{case.median_ns / 1e3:.1f} µs: {_noise_cause(device)}")  # type: ignore[operator]


def folded_noise(cases: Sequence[CaseResult], device: str | None = None) -> str:
    """All noisy cases of a report in one line with their count (a CPU run flags most of its cases; one
    warning each filled a screen); one case keeps noisy_timing's line. "" when none is noisy."""
    noisy = [(case, excess) for case in cases if (excess := _noise_excess(case)) is not None]
    if len(noisy) <= 1:
        return noisy_timing(noisy[0][0], device) if noisy else ""
    low, high = min(e for _, e in noisy), max(e for _, e in noisy)
    specs = list(dict.fromkeys(case.spec for case, _ in noisy))
    return (f"noisy timing in {len(noisy)} timed cases ({', '.join(specs)}): the mean is {low * 100:.0f}–"
            f"{high * 100:.0f}% above the median; {_noise_cause(device)} (--json lists each)")


@dataclass(frozen=True)
class ModeRun:
    """One `python <main> MODE CASES` process and what it wrote on the result pipe."""

    mode: str
    secret: bool
    seed: int | None  # POPCORN_SEED given to the eval (secret runs only)
    exit_code: int  # 114 on timeout, as the runner sets it
    duration_s: float
    timeout_s: float
    timed_out: bool = False
    check: str | None = None  # "pass", "fail", or None when the eval wrote no check line
    tests: tuple[CaseResult, ...] = ()
    benchmarks: tuple[CaseResult, ...] = ()
    raw: Mapping[str, str] = field(default_factory=dict)  # every key from the pipe
    stdout: str = ""
    stderr: str = ""
    outcome: str = "passed"  # one of OUTCOME_EXIT
    summary: str = ""  # the one categorized line for a failure

    @property
    def succeeded(self) -> bool:
        return not self.timed_out and self.exit_code in SUCCESS_EXIT_CODES

    @property
    def passed(self) -> bool:
        return self.succeeded and self.check == "pass"

    def mean_times_ns(self) -> list[float] | None:
        """Each benchmark's mean, or None when any is missing (no score can be formed)."""
        means = [b.mean_ns for b in self.benchmarks]
        if not means or any(m is None for m in means):
            return None
        return [float(m) for m in means]

    def to_json(self) -> dict:
        data = asdict(self)
        data["tests"] = [c.to_json() for c in self.tests]
        data["benchmarks"] = [c.to_json() for c in self.benchmarks]
        data["raw"] = dict(self.raw)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ModeRun":
        cases = lambda items: tuple(CaseResult.from_json(c) for c in items)  # noqa: E731
        return _build(cls, data, tests=cases, benchmarks=cases, raw=dict)


FAILED_EXIT_CODE = 112  # the protocol's "ran, but a check failed"


def judge_physics(run: ModeRun) -> ModeRun:
    """`run` with every passing benchmark case whose mean beats physics failed ("time beats physics: ...").

    The device is the one the eval reported (`system.device`); only popkit's harness reports the bytes a
    call must move (and the CPU's copy bandwidth), so runs of other harnesses come back unchanged."""
    device, copy_peak = run.raw.get("system.device"), cpu_copy_peak(run.raw)
    cases, changed = [], False
    for case in run.benchmarks:
        reason = beats_physics(case, device, copy_peak) if case.passed else ""
        if reason:
            case, changed = replace(case, passed=False, error=f"time beats physics: {reason}"), True
        cases.append(case)
    if not changed:
        return run
    exit_code = FAILED_EXIT_CODE if run.exit_code == 0 else run.exit_code
    return replace(run, benchmarks=tuple(cases), check="fail", exit_code=exit_code)


@dataclass(frozen=True)
class CompileStep:
    """The compile pre-step: `python submission.py` once, to warm the build cache (not fatal)."""

    exit_code: int
    duration_s: float
    timed_out: bool = False
    log: str = ""  # stdout when it holds load_inline's verbose compile log
    stdout: str = ""
    stderr: str = ""
    diagnostics: tuple[Diagnostic, ...] = ()  # compiler messages placed at lines of the submission

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def build_failed(self) -> bool:
        """The pre-step failed because the extension did not build (not for any other reason)."""
        return not self.ok and any(m in self.stderr or m in self.stdout for m in COMPILE_MARKERS)

    def to_json(self) -> dict:
        data = asdict(self)
        data["diagnostics"] = [d.to_json() for d in self.diagnostics]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CompileStep":
        return _build(cls, data, diagnostics=lambda items: tuple(Diagnostic.from_json(d) for d in items))


def score_s(means_ns: list[float] | None, ranking_by: str) -> float | None:
    """The leaderboard score in seconds (docs/protocol-notes.md §5): last value, arithmetic mean or geometric mean."""
    if not means_ns:
        return None
    values = [m / 1e9 for m in means_ns]
    if ranking_by == "last":
        return values[-1]
    if ranking_by == "mean":
        return sum(values) / len(values)
    if ranking_by == "geom":
        if any(v <= 0 for v in values):
            return None
        return math.exp(sum(math.log(v) for v in values) / len(values))
    raise ValueError(f"unknown ranking {ranking_by!r}")


@dataclass(frozen=True)
class RunReport:
    """Everything one `popkit test` or `popkit bench` learned about one submission."""

    task: str
    task_path: str
    leaderboard: str | None
    ranking_by: str
    submission: str  # path as given
    sha256: str  # of the exact bytes that ran
    mode: str  # test | benchmark | leaderboard | profile (the requested mode)
    harness: str  # "task" (the task's own eval) or "popkit"
    started_at: str  # ISO 8601, UTC
    duration_s: float
    system: Mapping[str, Any] = field(default_factory=dict)
    precompile: CompileStep | None = None
    precompile_skipped: str = ""  # why the pre-step did not run (e.g. "build cache holds this source")
    runs: tuple[ModeRun, ...] = ()
    secret_seeds: tuple[int, ...] = ()
    label: str = ""  # e.g. "reference" for a --baseline run, "hip-on-cuda" for a HIP logic check on NVIDIA
    notes: tuple[str, ...] = ()  # what the run is (e.g. a HIP-on-CUDA logic check) and its warnings
    world_size: int | None = None  # set when --world-size scaled the task's cases down: not leaderboard-faithful
    # How the run's processes were kept apart (executor.Isolation.to_json): {"level": "namespaces"|"none",
    # "detail": ...}; empty in records made before popkit had a sandbox.
    isolation: Mapping[str, str] = field(default_factory=dict)
    skipped_shapes: tuple[str, ...] = ()  # benchmark shapes left out (a CPU run, popkit.measure.sizing): not faithful
    # the GPU's state while the run went on (gpustate.GpuState.to_json: clocks, temperature, power, throttling);
    # empty without NVML
    gpu_state: Mapping[str, Any] = field(default_factory=dict)
    changed: tuple[str, ...] = ()  # --cases/--shape/--timeout, in words (popkit.model.innerloop): not faithful
    schema: str = RUN_SCHEMA

    @property
    def leaderboard_faithful(self) -> bool:
        """False when the cases were changed from the task's (a scaled-down world_size, shapes a CPU left out,
        the inner loop's --cases/--shape/--timeout)."""
        return self.world_size is None and not self.skipped_shapes and not self.changed

    @property
    def outcome(self) -> str:
        """`passed`, or the outcome of the first run that did not pass."""
        for run in self.runs:
            if run.outcome != "passed":
                return run.outcome
        if not self.runs and self.precompile is not None and self.precompile.build_failed:
            return "compile_failed"
        return "passed" if self.runs else "crashed"

    @property
    def exit_code(self) -> ExitCode:
        return OUTCOME_EXIT[self.outcome]

    @property
    def judged(self) -> str:
        """`sealed`: every run's verdict was written where the submission cannot reach (popkit's harness, its trust
        checks on: docs/sealed-run.md); `open`: by an eval as open as the leaderboard's (a task's own, trust off)."""
        sealed = self.runs and all("trusted-verdict" in r.raw.get("trust.checks", "").split(",") for r in self.runs)
        return "sealed" if sealed else "open"

    @property
    def failure(self) -> ModeRun | None:
        return next((r for r in self.runs if r.outcome != "passed"), None)

    def runs_of(self, mode: str, secret: bool | None = None) -> list[ModeRun]:
        return [r for r in self.runs if r.mode == mode and (secret is None or r.secret == secret)]

    def _score(self, mode: str, secret: bool) -> float | None:
        for run in self.runs_of(mode, secret):
            if run.passed:
                return score_s(run.mean_times_ns(), self.ranking_by)
        return None

    @property
    def score_public_s(self) -> float | None:
        """The ranked score: the public leaderboard-mode run (or the benchmark run for `bench`)."""
        mode = "leaderboard" if self.runs_of("leaderboard") else "benchmark"
        return self._score(mode, secret=False)

    @property
    def scores_secret_s(self) -> tuple[float | None, ...]:
        """One score per secret run, in seed order; a secret run must pass but does not rank."""
        mode = "leaderboard" if self.runs_of("leaderboard") else "benchmark"
        return tuple(self._score_for_seed(mode, seed) for seed in self.secret_seeds)

    def _score_for_seed(self, mode: str, seed: int) -> float | None:
        for run in self.runs_of(mode, secret=True):
            if run.seed == seed and run.passed:
                return score_s(run.mean_times_ns(), self.ranking_by)
        return None

    @property
    def warnings(self) -> tuple[str, ...]:
        """Timings whose mean a few slow calls pulled well above the median. (A time that beats physics is
        no warning: it fails its case, judge_physics.)"""
        device = (self.system or {}).get("device")
        found = [noisy_timing(case, device) for run in self.runs for case in run.benchmarks]
        return tuple(dict.fromkeys(w for w in found if w))

    @property
    def folded_warnings(self) -> tuple[str, ...]:
        """`warnings` as a report prints them: the noisy cases of all runs folded into one line."""
        line = folded_noise([case for run in self.runs for case in run.benchmarks], (self.system or {}).get("device"))
        return (line,) if line else ()

    def to_json(self) -> dict:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        data["runs"] = [r.to_json() for r in self.runs]
        data["precompile"] = self.precompile.to_json() if self.precompile else None
        data.update(system=dict(self.system), isolation=dict(self.isolation), gpu_state=dict(self.gpu_state))
        data["outcome"], data["judged"] = self.outcome, self.judged
        data.update(leaderboard_faithful=self.leaderboard_faithful, exit_code=int(self.exit_code),
                    score_public_s=self.score_public_s, scores_secret_s=list(self.scores_secret_s))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RunReport":
        return _build(cls, data, runs=lambda items: tuple(ModeRun.from_json(r) for r in items),
                      precompile=lambda p: CompileStep.from_json(p) if p else None,
                      system=dict, isolation=dict, gpu_state=dict)


# ------------------------------------------------------------------------ a remote submission


@dataclass(frozen=True)
class RemoteRun:
    """One run the server reported: score in seconds, times as the server wrote them."""

    mode: str
    secret: bool
    runner: str
    score: float | None
    passed: bool
    start_time: str | None = None
    end_time: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RemoteRun":
        """Raises ValueError when `data` is not a run object as popcorn-cli writes it."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a run is {type(data).__name__}, not an object")
        score = _typed(data, "score", (int, float))
        return cls(mode=str(data.get("mode", "")), secret=bool(data.get("secret", False)),
                   runner=str(data.get("runner") or ""), score=float(score) if score is not None else None,
                   passed=bool(data.get("passed", False)), start_time=_typed(data, "start_time", str),
                   end_time=_typed(data, "end_time", str))


@dataclass(frozen=True)
class RemoteResult:
    """What popcorn-cli printed: the score lines and its JSON document."""

    submission_id: int | None
    leaderboard: str | None
    file_name: str | None
    done: bool
    runs: tuple[RemoteRun, ...] = ()
    score_public_s: float | None = None  # from `Geomean score (public) on GPU: X s`
    score_secret_s: float | None = None
    score_gpu: str | None = None  # the GPU named on the score lines

    @property
    def passed(self) -> bool:
        return self.done and bool(self.runs) and all(r.passed for r in self.runs)

    def to_json(self) -> dict:
        data = asdict(self)
        data["runs"] = [asdict(r) for r in self.runs]
        data["passed"] = self.passed
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RemoteResult":
        """Raises ValueError when `data` does not have the shape of popcorn-cli's result."""
        runs = _typed(data, "runs", list) or ()
        return cls(submission_id=_typed(data, "submission_id", int), leaderboard=_typed(data, "leaderboard", str),
                   file_name=_typed(data, "file_name", str), done=bool(data.get("done", False)),
                   runs=tuple(RemoteRun.from_json(r) for r in runs),
                   score_public_s=data.get("score_public_s"), score_secret_s=data.get("score_secret_s"),
                   score_gpu=data.get("score_gpu"))


def _typed(data: Mapping[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    """data[key] when it is None or of `types` (a bool is no number); ValueError otherwise."""
    value = data.get(key)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise ValueError(f"`{key}` is {type(value).__name__}")
    return value
