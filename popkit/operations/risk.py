"""`popkit risk FILE`: how close each case sits to the task's tolerance, whether the output repeats bit for bit,
on the public cases, on extra seeds and on shapes next to the public grid; one verdict (low / medium / high).

Two processes, and the verdict in neither: the submission's side (risk_children/run_submission.py) runs in the
run's executor (the sandbox where it works) and writes each call's output as raw bytes and a JSON header into its
working folder; the judge (risk_children/judge.py) runs beside the task's files alone, never imports the submission,
regenerates each case's inputs from its seed, reads the outputs as data and calls the task's own check, with the
tolerance scaled to find the margin. popkit reads the judge's numbers and decides the verdict here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from popkit.errors import ExitCode, PopkitError, UsageError
from popkit.machine import nvml
from popkit.model.diagnostics import first_error
from popkit.model.tasks import SUBMISSION_SOURCE, Task
from popkit.run import protocol
from popkit.run.executor import Executor
from popkit.run.runner import RunOptions, RunSession
from popkit.submission.source import Source

HIGH_MARGIN = 0.9  # a case at 90% of its tolerance or more: a secret seed may well tip it over
MEDIUM_MARGIN = 0.5
NEAR_OFFSETS = (-1, 1)  # each integer size parameter of a public case, moved by these
ORIGINS = ("test", "benchmark", "seed", "near")  # the order a failing case is named in
RUN_SCRIPT, JUDGE_SCRIPT = "popkit_risk_run.py", "popkit_risk_judge.py"
PLAN, OUT = "popkit-risk-plan.json", "popkit-risk-out"
_CHILDREN = Path(__file__).parent / "risk_children"
_NOT_SIZES = ("seed", "world_size")


@dataclass(frozen=True)
class CaseRisk:
    """One case as the judge saw it. `margin`: the smallest factor on the task's tolerance at which every output of
    the case passes (worst error over tolerance; None when the check exposes no tolerance or the case fails beyond
    any factor sought); `distinct`: how many different outputs the repeated calls gave."""

    case: Mapping[str, Any]
    origin: str  # test, benchmark (the public grid), seed (a public case on another seed), near (a shape beside one)
    passed: bool
    margin: float | None
    deterministic: bool | None
    distinct: int
    message: str = ""

    def spec(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.case.items())

    def to_json(self) -> dict:
        return {**asdict(self), "case": dict(self.case)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CaseRisk":
        return cls(**{**data, "case": dict(data["case"])})


@dataclass(frozen=True)
class RiskReport:
    task: str
    submission: str
    level: str  # low, medium, high
    reason: str  # one line: what drives the level
    driver: int | None  # index in `cases` of the case that drives it
    cases: tuple[CaseRisk, ...]
    repeats: int  # calls per case
    secret_seeds: tuple[int, ...]  # the extra seeds, combined with each case's seed as a secret run does
    refused: int  # shapes next to the grid that the task's generate_input refused (not cases)
    isolation: str
    tolerance_functions: tuple[str, ...] = ()  # reference.py's functions whose rtol/atol the margin scales
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        return int(ExitCode.FAILED) if self.level == "high" else int(ExitCode.OK)

    def to_json(self) -> dict:
        return {"task": self.task, "submission": self.submission, "level": self.level, "reason": self.reason,
                "driver": self.driver, "cases": [c.to_json() for c in self.cases], "repeats": self.repeats,
                "secret_seeds": list(self.secret_seeds), "refused": self.refused, "isolation": self.isolation,
                "tolerance_functions": list(self.tolerance_functions), "notes": list(self.notes),
                "thresholds": {"high_margin": HIGH_MARGIN, "medium_margin": MEDIUM_MARGIN}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RiskReport":
        return cls(task=data["task"], submission=data["submission"], level=data["level"], reason=data["reason"],
                   driver=data["driver"], cases=tuple(CaseRisk.from_json(c) for c in data["cases"]),
                   repeats=data["repeats"], secret_seeds=tuple(data["secret_seeds"]), refused=data["refused"],
                   isolation=data["isolation"], tolerance_functions=tuple(data["tolerance_functions"]),
                   notes=tuple(data["notes"]))


def plan_cases(task: Task, *, benchmarks: bool, secret_seeds: Sequence[int]) -> list[tuple[dict, str]]:
    """Every case to try, with its origin: the public tests (and benchmarks), each on the extra seeds, and each
    integer size parameter moved by NEAR_OFFSETS (values below 1 left out; the task's generator judges the rest)."""
    public = [(dict(c), "test") for c in task.tests] + ([(dict(c), "benchmark") for c in task.benchmarks]
                                                        if benchmarks else [])
    planned: dict[str, tuple[dict, str]] = {}
    for case, origin in public:
        planned.setdefault(json.dumps(case, sort_keys=True), (case, origin))
    for case, _origin in public:
        seed = case.get("seed")
        if isinstance(seed, int) and not isinstance(seed, bool):
            for secret in secret_seeds:
                moved = {**case, "seed": protocol.secret_case_seed(seed, secret)}
                planned.setdefault(json.dumps(moved, sort_keys=True), (moved, "seed"))
        for key, value in case.items():
            if key in _NOT_SIZES or not isinstance(value, int) or isinstance(value, bool):
                continue
            for offset in NEAR_OFFSETS:
                if value + offset >= 1:
                    moved = {**case, key: value + offset}
                    planned.setdefault(json.dumps(moved, sort_keys=True), (moved, "near"))
    return list(planned.values())


def verdict(cases: Sequence[CaseRisk]) -> tuple[str, str, int | None]:
    """(level, reason, index of the driving case): any failing case, or a margin of HIGH_MARGIN or more, is high;
    a margin of MEDIUM_MARGIN or more, or an output that differs between calls, is medium; else low."""
    if not cases:
        return "high", "no case could be judged", None
    where = {"test": "test case", "benchmark": "benchmark case", "seed": "public case on another seed",
             "near": "shape next to the public grid"}
    failing = [i for i, c in enumerate(cases) if not c.passed]
    if failing:
        i = min(failing, key=lambda j: ORIGINS.index(cases[j].origin))
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        return "high", f"{where[cases[i].origin]} `{cases[i].spec()}` fails{more}: {cases[i].message}", i
    known = [i for i, c in enumerate(cases) if c.margin is not None]
    worst = max(known, key=lambda j: cases[j].margin) if known else None
    varying = [i for i, c in enumerate(cases) if c.deterministic is False]
    if worst is not None and cases[worst].margin >= HIGH_MARGIN:
        return "high", f"`{cases[worst].spec()}` ({cases[worst].origin}) sits at {cases[worst].margin:.0%} of the " \
                       "task's tolerance: another seed may tip it over", worst
    if worst is not None and cases[worst].margin >= MEDIUM_MARGIN:
        return "medium", f"`{cases[worst].spec()}` ({cases[worst].origin}) sits at {cases[worst].margin:.0%} of " \
                         "the task's tolerance", worst
    if varying:
        i = varying[0]
        return "medium", f"not bitwise deterministic: `{cases[i].spec()}` gave {cases[i].distinct} different " \
                         f"outputs over its calls ({len(varying)} case(s) vary); a failure may not replay", i
    if worst is None:
        return "low", "every case passes and repeats bit for bit (the task's check exposes no tolerance: " \
                      "margins unknown)", None
    return "low", f"every case passes and repeats bit for bit; the closest, `{cases[worst].spec()}`, sits at " \
                  f"{cases[worst].margin:.0%} of the tolerance", worst


def gpu_visible(env: Mapping[str, str] | None = None) -> bool:
    driver = nvml.visible_gpus(dict(os.environ if env is None else env))
    return bool(driver and driver.gpus)


def assess(task: Task, source: Source, options: RunOptions, *, repeats: int = 3,
           secret_seeds: Sequence[int] = (), benchmarks: bool | None = None,
           progress: Callable[[str], None] | None = None) -> RiskReport:
    """Run the submission on every planned case (`repeats` calls each) in the run's executor, then judge the
    outputs in a process of the task's files alone. `benchmarks` None: the benchmark shapes only where a GPU is
    visible (on a CPU they are GPU-sized)."""
    progress = progress or (lambda _msg: None)
    if task.multi_gpu:
        raise UsageError(f"{task.name} is a multi-GPU task: popkit risk runs single-GPU tasks",
                         "popkit bench FILE --leaderboard --secret-runs N runs the ranked chain on several seeds")
    if repeats < 2:
        raise UsageError(f"--repeats {repeats}: determinism needs 2 calls or more", "e.g. --repeats 3")
    with_benchmarks = gpu_visible() if benchmarks is None else benchmarks
    planned = plan_cases(task, benchmarks=with_benchmarks, secret_seeds=secret_seeds)
    plan = json.dumps({"repeats": repeats, "cases": [case for case, _ in planned]})
    # The run's session: the toolkit, the executor and the task's own files (risk's script calls the submission
    # itself, so no eval of any harness runs).
    session = RunSession(task, source.path, "test", replace(options, harness="task"), content=source.content,
                         progress=progress, check=False)
    options, env, executor = session.options, session.env(), session.executor
    timeout_s = task.test_timeout + task.benchmark_timeout
    # The files placed and the compile pre-step run as for a cold eval: a build in the store (a `popkit test`
    # before) is reused and a new one lands there, rather than the submission's import compiling in the run's cache.
    with session.opened("popkit-risk-", preflight=False):
        built = session.side.precompile
        if built is not None and built.build_failed:
            why = first_error(built.diagnostics, f"{built.stderr}\n{built.stdout}")
            raise PopkitError(f"{source.path}: the kernel did not build: {why}",
                              f"popkit compile {source.path} shows every compiler message",
                              exit_code=ExitCode.COMPILE_FAILED)
        ws = session.workspace
        ws.write_cases(PLAN, plan)
        progress(f"running {len(planned)} cases x {repeats} calls ({executor.isolation.level})")
        done = session.script(RUN_SCRIPT, (_CHILDREN / "run_submission.py").read_bytes(), [PLAN, OUT], timeout_s)
        notes = [line for line in [session.side.tampered, ws.tampered("popkit risk's run")] if line]
        if done.timed_out or done.code != 0:
            tail = " / ".join((done.stderr.strip() or done.stdout.strip()).splitlines()[-3:])
            what = f"ran past {timeout_s:g} s" if done.timed_out else f"ended with exit {done.code}"
            raise PopkitError(f"the submission's run {what}: {tail or 'no output'}",
                              "run popkit test FILE first: risk needs a file that passes",
                              exit_code=ExitCode.TIMED_OUT if done.timed_out else ExitCode.CRASHED)
        progress("judging the outputs (a process that never imports the submission)")
        judged = _judge(task, plan, ws.cwd / OUT, options.python, env, timeout_s)
    cases = []
    refused = 0
    for (case, origin), found in zip(planned, judged["cases"]):
        if not found["accepted"]:
            if origin != "near":
                raise PopkitError(f"{task.yml}: generate_input refused the task's own case `{case}`: "
                                  f"{found['message']}", "fix the task", exit_code=ExitCode.BAD_TASK)
            refused += 1
            continue
        cases.append(CaseRisk(case=case, origin=origin, passed=bool(found["passed"]), margin=found["margin"],
                              deterministic=found["deterministic"], distinct=found["distinct"],
                              message=found["message"]))
    level, reason, driver = verdict(cases)
    if not with_benchmarks:
        notes.append("benchmark shapes left out (no GPU visible: they are GPU-sized); --benchmarks adds them")
    return RiskReport(task=task.name, submission=str(source.path), level=level, reason=reason, driver=driver,
                      cases=tuple(cases), repeats=repeats, secret_seeds=tuple(secret_seeds), refused=refused,
                      isolation=str(executor.isolation), tolerance_functions=tuple(judged["tolerance_functions"]),
                      notes=tuple(notes))


def _judge(task: Task, plan: str, out: Path, python: str, env: Mapping[str, str], timeout_s: float) -> dict:
    """The judge's document. It runs in a folder of the task's files alone (no submission file), as a plain
    process: none of the submission's code runs in it; it reads the submission's outputs as bytes."""
    with Executor().workspace(prefix="popkit-risk-judge-") as jw:
        for f in task.files:
            if f.source != SUBMISSION_SOURCE:
                jw.add(f.name, (task.path / f.source).read_bytes())
        jw.add(JUDGE_SCRIPT, (_CHILDREN / "judge.py").read_bytes())
        jw.write_cases(PLAN, plan)
        done = jw.run(python, JUDGE_SCRIPT, [PLAN, str(out)], env, timeout_s, result_fd_env="POPKIT_RISK_FD")
    try:
        judged = json.loads(done.pipe)
    except ValueError:
        tail = " / ".join(done.stderr.strip().splitlines()[-3:])
        raise PopkitError(f"the risk judge (the task's reference) failed: {tail or f'exit {done.code}'}",
                          "run popkit test FILE: the task's reference must import and check",
                          exit_code=ExitCode.BAD_TASK) from None
    return judged
