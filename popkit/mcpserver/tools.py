"""The tools `popkit mcp` offers: each a popkit command, its arguments as a JSON schema, and the popkit.api call.

Arguments carry the CLI's option names in snake_case (`tasks_root`, `secret_runs`, `history`, ...) with
the CLI's defaults but one: `harness` is `popkit` (the sealed harness judges agents' runs, as popkit.api's).
A submission is `submission` (a path, relative to the server's working folder) or `source` (the file's
text); bench's second file of an A/B is `submission_b` or `source_b`. Every tool returns the document its
command prints with `--json`.

A tool that runs kernels (`device`) holds the GPU it runs on, or every GPU when it names none, for the
whole call (server.py); nothing else here knows about MCP. A command of popkit that is not a tool here
is listed in NOT_TOOLS with the reason, so that a new command cannot be forgotten (tests/test_mcp_tools.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from popkit import api
from popkit.errors import UsageError
from popkit.ledger.popcorn import DEFAULT_TIMEOUT_S as SUBMIT_TIMEOUT_S
from popkit.ledger.submit import GATES
from popkit.model.tasks import MAX_TIMEOUT_S, MODES
from popkit.run.protocol import MAX_SECRET_RUNS, MAX_SECRET_SEED

Args = Mapping[str, Any]


def _string(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": text, **extra}


def _flag(text: str, default: bool = False) -> dict[str, Any]:
    return {"type": "boolean", "description": text, "default": default}


def _integer(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": text, **extra}


ROOTS = {"type": "array", "items": {"type": "string"},
         "description": "Folders or problem-set yaml files to look up leaderboard names in (as --tasks-root); "
                        "POPKIT_TASKS_PATH of the server's environment is searched too."}
SUBMISSION = _string("Path of the submission file (relative to the server's working folder; absolute is safest).")
SOURCE = _string("The submission's text, instead of `submission`: written to a private temporary file named by "
                 "its sha256 for the call (the history records it under that name).")
TASK = _string("Bundled task name, task folder or leaderboard name. Default: the file's "
               "`#!POPCORN leaderboard` directive.")
PYTHON = _string("Interpreter for the eval or build (default: the one running the server).")
GPU_PIN = _string("Run on this GPU index only (CUDA_VISIBLE_DEVICES); the call then holds only that GPU. "
                  "Default: the run may use every GPU and holds them all.", pattern=r"^[0-9]+$")
RUN_OPTIONS: dict[str, Any] = {
    "task": TASK, "tasks_root": ROOTS,
    "harness": _string("`popkit` (default): popkit's sealed harness judges, where the submission cannot reach; "
                       "`task`: the task's own eval, as open as the leaderboard's (for tasks popkit's harness "
                       "cannot judge, which it refuses by name).", enum=["task", "popkit"], default="popkit"),
    "python": PYTHON,
    "precompile": {"type": "boolean", "description": "Force (true) or skip (false) the compile pre-step; default: "
                                                     "run it only when it can warm the build cache."},
    "world_size": _integer("Multi-GPU tasks: run every case at this world_size (scaled, not leaderboard-faithful).",
                           minimum=1),
    "secret_seeds": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_SECRET_SEED},
                     "description": "Secret seeds: one secret chain each, after the public one."},
    "device": GPU_PIN,
    "require_isolation": _flag("Stop (exit 11) unless every process can be sandboxed."),
    "history": _flag("Record the run in the history.", True),
}


def _schema(properties: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": dict(properties), "required": list(required),
            "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    """One MCP tool: `call(args, progress)` returns a popkit result (popkit.documents gives its document)."""

    name: str
    description: str
    properties: Mapping[str, Any]
    call: Callable[[Args, Any], Any]
    required: tuple[str, ...] = ()
    device: Callable[[Args], bool] = field(default=lambda _args: False)  # whether the call runs kernels

    @property
    def input_schema(self) -> dict[str, Any]:
        return _schema(self.properties, self.required)


def submission_of(args: Args, path_key: str = "submission", text_key: str = "source",
                  required: bool = True) -> api.Submission | None:
    """The file of a call: exactly one of a path (`submission`) and a text (`source`)."""
    path, text = args.get(path_key), args.get(text_key)
    if path is not None and text is not None:
        raise UsageError(f"both `{path_key}` and `{text_key}` given", f"give the path as `{path_key}` or the "
                                                                      f"file's text as `{text_key}`, not both")
    if path is None and text is None:
        if not required:
            return None
        raise UsageError(f"no `{path_key}` and no `{text_key}`",
                         f"give the file's path as `{path_key}` or its text as `{text_key}`")
    return api.SourceText(text) if text is not None else path


def _run_kwargs(args: Args) -> dict[str, Any]:
    return {"task": args.get("task"), "roots": args.get("tasks_root") or (), "harness": args.get("harness", "popkit"),
            "python": args.get("python"), "precompile": args.get("precompile"),
            "world_size": args.get("world_size"), "secret_seeds": tuple(args.get("secret_seeds") or ()),
            "device": args.get("device"), "require_isolation": args.get("require_isolation", False),
            "record": args.get("history", True)}


def _test(args: Args, progress: Any) -> Any:
    return api.test(submission_of(args), secret_runs=args.get("secret_runs", 0),
                    hip_on_cuda=args.get("hip_on_cuda", False), progress=progress, **_run_kwargs(args))


def _tune(args: Args, progress: Any) -> Any:
    against = args.get("against")
    return api.tune(submission_of(args), args["output"], task=args.get("task"), roots=args.get("tasks_root") or (),
                    against=against, engine=args.get("engine", "grid"), max_variants=args.get("max_variants", 64),
                    seed=args.get("seed", 0), budget_s=args.get("budget", 900.0), confirm=args.get("confirm", 2),
                    rounds=args.get("rounds", 8), ab_budget_s=args.get("ab_budget", 60.0), jobs=args.get("jobs", 0),
                    per_shape=args.get("per_shape", True), resume=args.get("resume", False),
                    force=args.get("force", False), allow_cpu=args.get("allow_cpu", False),
                    devices=[d for d in str(args.get("devices") or "").split(",") if d] or None, python=args.get("python"),
                    harness=args.get("harness", "popkit"), world_size=args.get("world_size"),
                    record=args.get("history", True), progress=progress)


def _bench(args: Args, progress: Any) -> Any:
    files = [submission_of(args)]
    other = submission_of(args, "submission_b", "source_b", required=False)
    if other is not None:
        files.append(other)
    return api.bench(*files, leaderboard=args.get("leaderboard", False), profile=args.get("profile", False),
                     profiler=args.get("profiler", "torch"), secret_runs=args.get("secret_runs", 1),
                     baseline=args.get("baseline"), rounds=args.get("rounds", 8), budget_s=args.get("budget", 60.0),
                     allow_cpu=args.get("allow_cpu", False), progress=progress, **_run_kwargs(args))


TOOLS: tuple[Tool, ...] = (
    Tool("tasks", "List the tasks popkit can run (bundled, and problem sets under tasks_root); with check=true, "
         "whether this machine can run each and why not. Returns popkit/tasks/1.",
         {"tasks_root": ROOTS, "check": _flag("Say for each task whether this machine can run it."),
          "python": PYTHON},
         lambda a, _p: api.tasks(roots=a.get("tasks_root") or (), check=a.get("check", False), python=a.get("python"))),
    Tool("task_show", "One task: description, test and benchmark cases, timeouts, files. Returns popkit/task/1.",
         {"name": _string("Task name, folder or leaderboard name."), "tasks_root": ROOTS},
         lambda a, _p: api.task_show(a["name"], roots=a.get("tasks_root") or ()), required=("name",)),
    Tool("new", "Write a starter submission for a task (a simple, correct kernel), refusing to overwrite unless "
         "force. Returns popkit/new/1.",
         {"task": _string("Task name, folder or leaderboard name."), "output": _string("Where to write the .py file."),
          "target": _string("cuda or hip.", enum=["cuda", "hip"], default="cuda"),
          "style": _string("inline (load_inline) or library (a torch.library operator).",
                           enum=["inline", "library"], default="inline"),
          "gpu": _string("GPU for the `#!POPCORN gpu` directive."), "arch": _string("HIP offload architecture."),
          "force": _flag("Overwrite output if it exists."), "tasks_root": ROOTS},
         lambda a, _p: api.new(a["task"], a["output"], target=a.get("target", "cuda"),
                               style=a.get("style", "inline"), gpu=a.get("gpu"), arch=a.get("arch"),
                               force=a.get("force", False), roots=a.get("tasks_root") or ()),
         required=("task", "output")),
    Tool("templates", "Template targets and styles, and which tasks have a kernel spec. Returns popkit/templates/1.",
         {"tasks_root": ROOTS}, lambda a, _p: api.templates(roots=a.get("tasks_root") or ())),
    Tool("compile", "Build the submission's extension without running a kernel (no GPU needed); compiler "
         "messages point at lines of the file. Long: reports progress, can be cancelled. Returns popkit/compile/1 "
         "(status built or failed).",
         {"submission": SUBMISSION, "source": SOURCE, "task": TASK, "tasks_root": ROOTS,
          "clean": _flag("Delete this submission's build folder first."),
          "timeout": {"type": "number", "minimum": 1, "maximum": MAX_TIMEOUT_S, "default": 600,
                      "description": "Seconds one build may take."},
          "python": PYTHON, "arch": _string("HIP without ROCm: the AMD architecture to build for.")},
         lambda a, p: api.compile(submission_of(a), task=a.get("task"), clean=a.get("clean", False),
                                  timeout_s=a.get("timeout", 600.0), python=a.get("python"), arch=a.get("arch"),
                                  roots=a.get("tasks_root") or (), progress=p)),
    Tool("check", "What the leaderboard server would refuse, and the reward-hack lint, before anything runs. "
         "Returns popkit/check/1 (ok false: errors that block).",
         {"submission": SUBMISSION, "source": SOURCE,
          "leaderboard": _string("Leaderboard name (default: the file's directive)."),
          "gpu": _string("GPU (default: the file's directive)."),
          "mode": _string("Mode to check.", enum=list(MODES)), "tasks_root": ROOTS,
          "guard": _flag("Also run KernelGuard when installed.", True)},
         lambda a, _p: api.check(submission_of(a), leaderboard=a.get("leaderboard"), gpu=a.get("gpu"),
                                 mode=a.get("mode"), roots=a.get("tasks_root") or (), guard=a.get("guard", True))),
    Tool("risk", "How likely the file is to fail the ranked run's secret seeds: per case the margin to the task's "
         "tolerance (worst error over tolerance) and whether repeated calls give the same bits, on the public cases, "
         "extra secret seeds and shapes next to the public grid; level low, medium or high with the case that "
         "drives it. Long: reports progress, can be cancelled. Returns popkit/risk/1.",
         {"submission": SUBMISSION, "source": SOURCE, "task": TASK, "tasks_root": ROOTS,
          "repeats": _integer("Calls per case.", minimum=2, maximum=20, default=3),
          "seeds": _integer("Extra random secret seeds.", minimum=0, maximum=20, default=2),
          "benchmarks": _flag("Include the benchmark shapes (default: only where a GPU is visible)."),
          "python": PYTHON},
         lambda a, p: api.risk(submission_of(a), task=a.get("task"), roots=a.get("tasks_root") or (),
                               repeats=a.get("repeats", 3), seeds=a.get("seeds", 2), benchmarks=a.get("benchmarks"),
                               python=a.get("python"), progress=p), device=lambda _a: True),
    Tool("verify", "Re-run an evidence file (bench --evidence) here and say shape by shape whether it reproduces; "
         "a tampered file fails by name, another GPU model or other task files are refused. Long: reports "
         "progress, can be cancelled. Returns popkit/verify/1.",
         {"evidence": _string("Path of the evidence file."), "task": TASK, "tasks_root": ROOTS,
          "tolerance": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.05,
                        "description": "A shape known to lie within this fraction of the recorded time reproduces."},
          "python": PYTHON},
         lambda a, p: api.verify(a["evidence"], task=a.get("task"), roots=a.get("tasks_root") or (),
                                 tolerance=a.get("tolerance", 0.05), python=a.get("python"), progress=p),
         required=("evidence",), device=lambda _a: True),
    Tool("test", "Run the task's tests on the submission as the leaderboard's test mode does, in popkit's sealed "
         "run. Long: reports progress, can be cancelled; waits while another run holds the GPU. Returns "
         "popkit/run/1: outcome passed, failed (a case's error names what was wrong, a reward hack by its "
         "class), compile_failed, timed_out or crashed.",
         {"submission": SUBMISSION, "source": SOURCE, **RUN_OPTIONS,
          "secret_runs": _integer("Also run the tests under this many random secret seeds.", minimum=0,
                                  maximum=MAX_SECRET_RUNS, default=0),
          "hip_on_cuda": _flag("A HIP file on an NVIDIA GPU: a logic check, not AMD timing.")},
         _test, device=lambda _a: True),
    Tool("bench", "Time the submission on the task's benchmarks (benchmark mode), or with leaderboard=true the "
         "ranked chain and its score; with submission_b or source_b an A/B of two files in counterbalanced "
         "rounds (popkit/ab/1: time B / time A per shape and for the score, with 95% intervals). Long: reports "
         "progress, can be cancelled; waits while another run holds the GPU. Returns popkit/run/1 or popkit/ab/1.",
         {"submission": SUBMISSION, "source": SOURCE,
          "submission_b": _string("A/B: the path of file B."), "source_b": _string("A/B: the text of file B."),
          **RUN_OPTIONS,
          "leaderboard": _flag("Run test, benchmark, leaderboard (public, then secret) and report the score."),
          "profile": _flag("Run profile mode."),
          "profiler": _string("With profile: torch or ncu.", enum=["torch", "ncu"], default="torch"),
          "secret_runs": _integer("With leaderboard: secret runs with random seeds.", minimum=0,
                                  maximum=MAX_SECRET_RUNS, default=1),
          "baseline": _string("`reference`: also time the task's reference and give the speed-up.",
                              enum=["reference"]),
          "rounds": _integer("A/B: most rounds (even).", minimum=4, default=8),
          "budget": {"type": "number", "minimum": 0, "default": 60,
                     "description": "A/B: seconds after which no new pair of rounds starts (0: no limit)."},
          "allow_cpu": _flag("Without a GPU: run the benchmark shapes that fit the timeout on the CPU.")},
         _bench, device=lambda _a: True),
    Tool("tune", "Search the launch parameters the file's `#!POPKIT tune` lines allow: every variant built, "
         "checked on the tests (wrong ones dropped), raced on the benchmarks, the finalists confirmed by A/Bs "
         "against the incumbent; the fastest is written to output with its values frozen. Long: reports progress, "
         "can be cancelled; holds the GPUs it uses. Returns popkit/tune/1.",
         {"submission": SUBMISSION, "source": SOURCE, "output": _string("Where to write the tuned file (never the "
                                                                          "input)."),
          "task": TASK, "tasks_root": ROOTS,
          "against": _string("Confirm the finalists against this file instead of the input with its own values."),
          "engine": _string("grid (every point, or a sample) or optuna.", enum=["grid", "optuna"], default="grid"),
          "max_variants": _integer("The most points tried.", minimum=1, maximum=10_000, default=64),
          "seed": _integer("Seed of the grid's sample and of optuna's sampler.", minimum=0, default=0),
          "budget": {"type": "number", "minimum": 0, "default": 900,
                     "description": "Seconds after which no new check, race round or A/B starts (0: no limit)."},
          "confirm": _integer("Finalists confirmed by an A/B.", minimum=1, maximum=8, default=2),
          "rounds": _integer("Most rounds of each A/B (even).", minimum=4, default=8),
          "ab_budget": {"type": "number", "minimum": 0, "default": 60,
                        "description": "Seconds of each A/B after which no new pair of rounds starts."},
          "jobs": _integer("Builds and checks at once (0: up to 8).", minimum=0, maximum=64, default=0),
          "per_shape": _flag("Also try a file that picks the best values by the input's shapes.", True),
          "resume": _flag("Reuse checks and race times of the same variant bytes from the history."),
          "force": _flag("Replace output if it exists."),
          "allow_cpu": _flag("Time a GPU task's benchmarks on a machine without a GPU (slow)."),
          "devices": _string("Spread checks and race evals over these GPUs, e.g. \"0,1\"; the call holds them all.",
                          pattern=r"^[0-9]+(,[0-9]+)*$"),
          "python": PYTHON, "harness": RUN_OPTIONS["harness"], "world_size": RUN_OPTIONS["world_size"],
          "history": _flag("Record every eval in the history (needed by a later resume).", True)},
         _tune, required=("output",), device=lambda _a: True),
    Tool("history", "The recorded runs, newest first. Returns popkit/history/1.",
         {"task": _string("Only runs of this task or leaderboard."),
          "limit": _integer("How many runs.", minimum=1, default=20)},
         lambda a, _p: api.history(task=a.get("task"), limit=a.get("limit", 20))),
    Tool("show", "One recorded run with its report; source=true adds the exact bytes that ran. Returns "
         "popkit/history-run/1.",
         {"run": _integer("Run id, as history lists it."), "source": _flag("Include the submission's text.")},
         lambda a, _p: api.show(a["run"], source=a.get("source", False)), required=("run",)),
    Tool("compare", "Two recorded bench runs shape by shape: time B / time A with 95% intervals (one process "
         "each; for a decision use bench with submission_b). Returns popkit/compare/1.",
         {"run_a": _integer("Run id of A."), "run_b": _integer("Run id of B.")},
         lambda a, _p: api.compare(a["run_a"], a["run_b"]), required=("run_a", "run_b")),
    Tool("doctor", "Check Python, torch, CUDA/ROCm, compilers and popcorn-cli, with a fix for each problem. "
         "Returns popkit/doctor/1.", {"python": PYTHON}, lambda a, _p: api.doctor(python=a.get("python"))),
    Tool("submit", "Check the file, optionally gate it locally, and hand the checked bytes to popcorn-cli. A dry "
         "run (the exact command, nothing sent) unless confirm is true. Returns popkit/submit/1.",
         {"submission": SUBMISSION, "source": SOURCE,
          "mode": _string("test, benchmark, leaderboard or profile.", enum=list(MODES), default="leaderboard"),
          "gpu": _string("GPU to run on (default: the file's directive)."),
          "leaderboard": _string("Leaderboard name (default: the file's directive)."),
          "gate": _string("Run locally first and submit only if it passes.", enum=list(GATES), default="none"),
          "confirm": _flag("Really submit (popcorn-cli, registered). Without it: a dry run."),
          "task": _string("Task for the local gate (default: the leaderboard name)."), "tasks_root": ROOTS,
          "timeout": {"type": "number", "minimum": 1, "maximum": MAX_TIMEOUT_S, "default": SUBMIT_TIMEOUT_S,
                      "description": "Seconds to wait for popcorn-cli."},
          "guard": _flag("Also run KernelGuard when installed.", True), "harness": RUN_OPTIONS["harness"]},
         lambda a, p: api.submit(submission_of(a), mode=a.get("mode", "leaderboard"), gpu=a.get("gpu"),
                                 leaderboard=a.get("leaderboard"), gate=a.get("gate", "none"),
                                 dry_run=not a.get("confirm", False), task=a.get("task"),
                                 roots=a.get("tasks_root") or (), timeout_s=a.get("timeout", SUBMIT_TIMEOUT_S),
                                 guard=a.get("guard", True), harness=a.get("harness", "popkit"), progress=p),
         device=lambda a: a.get("gate", "none") != "none"),
)

# popkit commands that are deliberately not tools, and why.
NOT_TOOLS = {
    "tasks check": "for problem authors validating a task folder, not for submissions",
    "mcp": "the server itself",
    "watch": "runs until Ctrl-C, a verdict per save of a file being edited: an agent calls the test tool per version",
}

BY_NAME = {tool.name: tool for tool in TOOLS}


def tool(name: str) -> Tool:
    """The tool called `name`; UsageError naming the tools there are."""
    if name not in BY_NAME:
        raise UsageError(f"no tool `{name}`", f"the tools are {', '.join(BY_NAME)}")
    return BY_NAME[name]
