"""The leaderboard's eval protocol as pure functions (docs/protocol-notes.md §2-§3): no process, no file.

What goes to an eval (the cases file, the chain of modes, secret seeds, the convention of its command
line and environment) and what comes back (the pipe's `key: value` lines, decoded into CaseResults and
classified into one outcome). The runner and every executor use this module; nothing here runs anything.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import math
import random
import re
import signal
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from popkit.errors import UsageError
from popkit.model.results import COMPILE_MARKERS, TIMEOUT_EXIT_CODE, CaseResult, ModeRun, judge_physics
from popkit.model.tasks import MODES
from popkit.run import proc

# The statistics the leaderboard's evals write per benchmark case (`benchmark.I.<name>`), in nanoseconds
# but `runs`. tests/test_protocol.py pins this tuple to what tasks/eval.py writes.
CASE_STATISTICS = ("runs", "mean", "std", "err", "best", "worst")
# Statistics popkit's harness adds (the leaderboard ignores unknown keys); anything else popkit shows is
# derived from the raw samples (stats.DERIVED), never asked of the harness.
HARNESS_STATISTICS = ("median",)
# Lists popkit's harness may add per benchmark case, one value per timed call like `samples` (ns, but
# `launches`): what the call's own kernels took on the GPU by its trace (CaseResult.breakdown), and the GPU time
# of work on another queue its events missed, which its sample includes (`added_ns`); and the trusted clock's
# time the call's report and its credited overhead leave unexplained (`unexplained_ns`, the time witness).
HARNESS_LISTS = ("samples", "kernel_ns", "gap_ns", "launches", "added_ns", "unexplained_ns")

PIPE_END_KEY = "popkit.end"  # popkit's harness writes this record last (tasks/popkit_trusted.py, ResultPipe)
MALFORMED = "the eval wrote a malformed result"
NEVER_RAN = "did not run: the eval wrote no result for this case (it stopped before it)"
# How popkit's harness (tasks/eval.py) starts a case's error when the task's own reference failed.
REFERENCE_FAILURES = ("reference.py failed to import: ", "generate_input failed: ", "ref_kernel failed: ")
# What torch says when the code asks for CUDA and this torch or this machine has none: the task needs a GPU
# (exit 11), whatever runnable.needs judged from its files.
NO_CUDA_MARKERS = ("Cannot get CUDA generator without ATen_cuda library", "Torch not compiled with CUDA enabled",
                   "Found no NVIDIA driver on your system", "No CUDA GPUs are available",
                   "no CUDA-capable device is detected")
PROTOCOL_EXIT = {
    2: "bad usage or unknown mode",
    110: "CUDA API failure",
    111: "no POPCORN_FD in the environment",
    113: "bad or unreadable cases file",
}

# A secret seed b turns case seed a into a + (a+b)(a+b+1)/2: below 2**31 that stays a 64-bit seed.
MAX_SECRET_SEED = 2**31 - 1
MAX_SECRET_RUNS = 100  # each secret run is a whole chain; more is a typo (`--secret-runs 1000000000` hung)


@dataclass(frozen=True)
class EvalConvention:
    """How one kind of eval is started and read: the single place `run_mode` asks (docs/design.md).

    `first_wins` and `sealed`: popkit's harness keeps a key's first value and ends with an HMAC record
    (`popkit.end`) keyed by a secret it reads from the descriptor named by `key_fd_env`; the leaderboard's
    evals are read with later keys winning and no record.
    """

    name: str
    result_fd_env: str = "POPCORN_FD"
    seed_env: str = "POPCORN_SEED"
    gpus_env: str = "POPCORN_GPUS"
    key_fd_env: str = ""  # empty: the eval gets no key and writes no closing record
    control_fd_env: str = ""  # a warm start's control descriptor (popkit's harness: `popkit test --watch`)
    first_wins: bool = False
    prestep_seed: str = "1"  # POPCORN_SEED of the compile pre-step

    @property
    def sealed(self) -> bool:
        return bool(self.key_fd_env)

    def argv(self, python: str, main: str, mode: str, cases_file: str) -> list[str]:
        return [python, main, mode, cases_file]

    def prestep_argv(self, python: str, submission_name: str) -> list[str]:
        return [python, submission_name]

    def env(self, seed: int | None, gpus: int | None) -> dict[str, str]:
        extra = {}
        if seed is not None:
            extra[self.seed_env] = str(seed)
        if gpus is not None:
            extra[self.gpus_env] = str(gpus)
        return extra

    def reserved_env(self) -> tuple[str, ...]:
        """Variables popkit sets per child: never inherited from popkit's own environment."""
        return tuple(v for v in (self.result_fd_env, self.seed_env, self.gpus_env, self.key_fd_env,
                                 self.control_fd_env) if v)


LEADERBOARD = EvalConvention("leaderboard")
POPKIT_HARNESS = EvalConvention("popkit", key_fd_env="POPKIT_KEY_FD", first_wins=True,
                                control_fd_env="POPKIT_CONTROL_FD")


def render_cases(cases: Sequence[Mapping[str, Any]]) -> str:
    """The cases file: one line per case, `key: value` pairs joined by "; " in yaml order.

    Booleans are written True/False and lists as Python lists (Python's own str of the value).
    """
    return "".join("; ".join(f"{k}: {v}" for k, v in case.items()) + "\n" for case in cases)


def pipe_pair(line: str) -> tuple[str, str] | None:
    """One pipe line as (key, value), split at the first colon, both sides stripped; None without a colon."""
    key, colon, value = line.partition(":")
    return (key.strip(), value.strip()) if colon else None


def parse_pipe(text: str, first_wins: bool = False) -> dict[str, str]:
    """Pipe lines `key: value`. Later keys win, as on the leaderboard; with `first_wins` (popkit's harness)
    the first value of a key stands."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        pair = pipe_pair(line)
        if pair and not (first_wins and pair[0] in result):
            result[pair[0]] = pair[1]
    return result


def sealed_pipe(data: bytes, key: str) -> tuple[bytes, str]:
    """What popkit's harness wrote before its closing record `popkit.end: HMAC`, and what is wrong with it.

    The second value is "" when the record is there and its HMAC (keyed with `key`) matches every byte
    before it; lines after the record are dropped.
    """
    start = 0
    for line in data.splitlines(keepends=True):
        if line.startswith(PIPE_END_KEY.encode() + b":"):
            body = data[:start]
            expected = hmac.new(key.encode(), body, "sha256").hexdigest()
            if hmac.compare_digest(line.split(b":", 1)[1].strip(), expected.encode()):
                return body, ""
            return body, ("result-pipe tampering: the result pipe holds lines popkit's harness did not write "
                          "(another process wrote on it)")
        start += len(line)
    return data, "result pipe: popkit's harness ended without its closing record, so its lines cannot be trusted"


def secret_case_seed(case_seed: int, secret: int) -> int:
    """How the standard eval combines a case seed `a` with the secret seed `b` (docs/protocol-notes.md §4)."""
    a, b = case_seed, secret
    return a + (a + b) * (a + b + 1) // 2


def random_secret_seeds(count: int) -> tuple[int, ...]:
    rng = random.SystemRandom()
    return tuple(rng.randrange(1, MAX_SECRET_SEED + 1) for _ in range(count))


def chain_modes(mode: str, chain: bool = True) -> tuple[str, ...]:
    """A leaderboard submission runs test, benchmark, leaderboard, each only if the previous passed."""
    if mode not in MODES:
        raise UsageError(f"unknown mode `{mode}`", "modes: " + ", ".join(MODES))
    return ("test", "benchmark", "leaderboard") if mode == "leaderboard" and chain else (mode,)


def case_kind(mode: str) -> str:
    """The pipe's case prefix of a mode: `test` in test mode, `benchmark` in every other."""
    return "test" if mode == "test" else "benchmark"


# ------------------------------------------------------------------------------------ decoding


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n")


def _number(raw: Mapping[str, str], key: str) -> float | None:
    try:
        return float(raw[key])
    except (KeyError, ValueError):
        return None


def case_numbers(raw: Mapping[str, str], prefix: str) -> tuple[dict[str, float | None], tuple[float, ...], str]:
    """One case's statistics and samples, and what is malformed among them ('' when nothing is).

    A value that is not a number (or a run count or sample that is not finite) fails the case by name:
    a result popkit cannot read is never a pass, nor a crash of popkit.
    """
    numbers, problems = {}, []
    for key in CASE_STATISTICS + HARNESS_STATISTICS:
        value = numbers[key] = _number(raw, prefix + key)
        if prefix + key in raw and (value is None or key == "runs" and not math.isfinite(value)):
            numbers[key] = None
            problems.append(f"`{prefix}{key}` is {raw[prefix + key][:40]!r}, not a number")
    lists = case_lists(raw, prefix, problems)
    return numbers, lists["samples"], f"{MALFORMED}: {problems[0]}" if problems else ""


def case_lists(raw: Mapping[str, str], prefix: str, problems: list[str] | None = None) -> dict[str, tuple[float, ...]]:
    """Every HARNESS_LISTS key of one case as numbers (() where absent); one not a list of finite numbers is
    () and named in `problems`."""
    lists = {}
    for key in HARNESS_LISTS:
        try:
            values = tuple(float(s) for s in raw.get(prefix + key, "").split(",") if s.strip())
            if not all(map(math.isfinite, values)):
                raise ValueError
        except ValueError:
            values = ()
            if problems is not None:
                problems.append(f"`{prefix}{key}` is {raw[prefix + key][:40]!r}, not a list of numbers")
        lists[key] = values
    return lists


def decode_cases(raw: Mapping[str, str], kind: str, limit: int) -> tuple[CaseResult, ...]:
    """The `kind` cases the eval reported; never more than the `limit` cases it was given."""
    try:
        count = max(0, min(int(raw.get(f"{kind}-count", "0")), limit))
    except ValueError:
        count = 0
    cases = []
    for i in range(count):
        p = f"{kind}.{i}."
        numbers, samples, malformed = case_numbers(raw, p)
        lists = case_lists(raw, p)
        report = raw.get(p + "report", "")
        if report:
            try:
                # The standard evals encode with the alphabet "+*"; translating "*" also reads plain base64.
                report = base64.b64decode(report, altchars=b"+*").decode("utf-8", "replace")
            except (binascii.Error, ValueError):
                pass
        # A benchmark without a status passed when it has a timing or (profile mode) a report.
        implied = "pass" if kind == "benchmark" and (p + "mean" in raw or report) else ""
        if not any(key.startswith(p) for key in raw):
            malformed = NEVER_RAN  # counted, then nothing: the eval stopped before it
        cases.append(CaseResult(
            kind=kind, index=i, spec=raw.get(p + "spec", ""),
            passed=raw.get(p + "status", implied) == "pass" and not malformed,
            error=malformed or _unescape(raw.get(p + "error", "")), message=_unescape(raw.get(p + "message", "")),
            runs=int(numbers["runs"] or 0), mean_ns=numbers["mean"], std_ns=numbers["std"], err_ns=numbers["err"],
            best_ns=numbers["best"], worst_ns=numbers["worst"], median_ns=numbers["median"], samples_ns=samples,
            stop=raw.get(p + "stop", ""), timer=raw.get(p + "timer", ""), report=report, kernel_ns=lists["kernel_ns"],
            gap_ns=lists["gap_ns"], launches=lists["launches"], added_ns=lists["added_ns"],
            unexplained_ns=lists["unexplained_ns"],
            bytes=int(raw[p + "bytes"]) if raw.get(p + "bytes", "").isdigit() else None,
        ))
    return tuple(cases)


# Python's words when the eval cannot take a name from the submission module.
_MISSING_ENTRY = re.compile(r"cannot import name '(\w+)' from 'submission'"
                            r"|module 'submission' has no attribute '(\w+)'")


def where(run: ModeRun) -> str:
    """`benchmark`, or `leaderboard (secret seed 7)`: the step a line is about."""
    return f"{run.mode}{' (secret seed %d)' % run.seed if run.secret else ''}"


def _no_cuda(text: str) -> str:
    """torch's own words when the code asked for CUDA where there is none (NO_CUDA_MARKERS), else ""."""
    return next((m for m in NO_CUDA_MARKERS if m in text), "")


def classify(run: ModeRun) -> tuple[str, str]:
    """The outcome of one eval run and its one categorized line."""
    step = where(run)
    if run.timed_out:
        return "timed_out", f"timed out: {step} ran past its {run.timeout_s:g} s timeout"
    if run.succeeded:
        # The eval's `check` is the verdict; a case whose numbers popkit cannot read fails it anyway.
        failed = [c for c in run.tests + run.benchmarks
                  if not c.passed and (run.check != "pass" or c.error.startswith((MALFORMED, NEVER_RAN)))]
        if failed:
            first = failed[0]
            detail = ((first.error or first.message).splitlines() or ["failed"])[0]
            case = f"{step}, {first.kind} {first.spec or first.index}: {detail}"
            no_cuda = _no_cuda(first.error)
            if no_cuda:
                return "needs_gpu", f"needs a GPU: {step} stopped at \"{no_cuda}\" (no CUDA GPU here)"
            if first.error.startswith(REFERENCE_FAILURES):
                return "bad_task", f"task error: {case} (the task's reference failed)"
            return "failed", f"check failed: {case}"
        if run.check == "pass":
            return "passed", ""
        if run.check is None:
            return "crashed", f"crashed: {step} exited {run.exit_code} without writing a `check` line"
        return "failed", f"check failed: {step}"
    err = run.stderr
    no_cuda = _no_cuda(err)
    if no_cuda:
        return "needs_gpu", f"needs a GPU: {step} stopped at \"{no_cuda}\" (no CUDA GPU here)"
    if any(m in err for m in COMPILE_MARKERS):
        return "compile_failed", f"compile failed: {step} could not build the extension"
    missing = _MISSING_ENTRY.search(err)
    if missing:
        name = missing.group(1) or missing.group(2)
        return "bad_submission", f"bad submission: no `{name}` could be imported from the submission"
    if "SyntaxError" in err and "submission.py" in err:
        return "bad_submission", "bad submission: syntax error in the submission"
    if run.exit_code < 0:
        name = signal.Signals(-run.exit_code).name if -run.exit_code in signal.valid_signals() else "?"
        return "crashed", f"crashed: {step} was killed by signal {name} ({-run.exit_code})"
    meaning = PROTOCOL_EXIT.get(run.exit_code)
    suffix = f" ({meaning})" if meaning else ""
    return "crashed", f"crashed: {step} exited with code {run.exit_code}{suffix}"


def judge(run: ModeRun, cases_given: int, pipe_problem: str = "") -> ModeRun:
    """`run` with its outcome and summary: classify, then what the pipe itself says against a pass.

    A pass needs a sound pipe (`pipe_problem` empty) and a result of the mode's kind for every case given (at
    least one): an eval that writes `check: pass` for fewer cases has not checked the others. The leaderboard
    would take such a pass; popkit, with either harness, does not (an eval is the task's code, not yours).
    """
    outcome, summary = classify(run)
    kind = case_kind(run.mode)
    results = len(run.tests if kind == "test" else run.benchmarks)
    if outcome == "passed" or pipe_problem.startswith("result-pipe tampering"):
        if pipe_problem:
            outcome, summary = "failed", f"{pipe_problem}: {where(run)}"
        elif not run.tests and not run.benchmarks:
            outcome, summary = "failed", (f"check failed: {where(run)} wrote `check: pass` but no case results "
                                          f"for its {cases_given} case(s)")
        elif results < max(cases_given, 1):
            outcome, summary = "failed", (f"check failed: {where(run)} wrote `check: pass` with {results} {kind} "
                                          f"result(s) for its {cases_given} case(s): a pass no case result backs")
    return replace(run, outcome=outcome, summary=summary)
def decode_mode(done: proc.Finished, mode: str, cases: int, *, timeout_s: float, convention: EvalConvention,
                key: str = "", seed: int | None = None, seconds: float | None = None) -> ModeRun:
    """The ModeRun of a finished eval of `cases` cases: its pipe (checked against `key`'s closing record when
    the eval is sealed), decoded and judged. `seconds` replaces the process's own time (a warm start's run is
    timed from its `go`)."""
    pipe, pipe_problem = sealed_pipe(done.pipe, key) if key else (done.pipe, "")
    if done.pipe_overflow:
        pipe_problem = f"result pipe: the eval wrote more than {proc.PIPE_BYTES // 2**20} MiB on it"
    raw = parse_pipe(pipe.decode("utf-8", "replace"), first_wins=convention.first_wins)
    run = ModeRun(mode=mode, secret=seed is not None, seed=seed,
                  exit_code=TIMEOUT_EXIT_CODE if done.timed_out else done.code,
                  duration_s=done.seconds if seconds is None else seconds,
                  timeout_s=timeout_s, timed_out=done.timed_out, check=raw.get("check"),
                  tests=decode_cases(raw, "test", cases),
                  benchmarks=decode_cases(raw, "benchmark", cases), raw=raw,
                  stdout=done.stdout, stderr=done.stderr)
    return judge(judge_physics(run), cases, pipe_problem)


