"""`popkit test --watch` / `bench --watch`: saves noticed and debounced, warm pairs started in the sandbox, their
verdicts equal to cold ones, nothing left after Ctrl-C (popkit/operations/filewatch.py, warm.py, watch.py; tasks/eval.py's
warm start).

The fast tests use a scripted file and fake clocks, the fixture tasks' files, and processes without torch; those
marked slow start warm pairs of popkit's harness, which import torch (seconds each on a small CPU box).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from popkit.errors import SubmissionError
from popkit.model.tasks import load_task, resolve_task, task_roots
from popkit.operations import watch
from popkit.operations.filewatch import parses
from popkit.operations.workflows import Request
from popkit.run import proc
from popkit.run import runner
from popkit.run import sandbox
from popkit.run import warm
from popkit.run._watchdog import descendants
from popkit.run.executor import Executor
from popkit.submission.source import Source
from test_harness_split import load_harness

ROOT = Path(__file__).resolve().parent.parent
FIX = Path(__file__).parent / "fixtures"
DOUBLER = FIX / "harness" / "doubler"
CHILD_ENV = {"OMP_NUM_THREADS": "1"}
BUNDLED = ("identity", "vectoradd", "grayscale", "vectorsum", "softmax", "matmul")
needs_sandbox = pytest.mark.skipif(bool(sandbox.unavailable()), reason=f"no sandbox here: {sandbox.unavailable()}")

HONEST = b'import torch\n\n\ndef custom_kernel(data):\n    return data["x"] * data["scale"]\n'
EDITED = b'import torch\n\n\ndef custom_kernel(data):\n    return (data["x"] * data["scale"]).clone()  # v2\n'
ALIASING = b'import torch\n\n\ndef custom_kernel(data):\n    data["x"].mul_(data["scale"])\n    return data["x"]\n'


def load_eval():
    """popkit's harness (tasks/eval.py and the modules it loads), its names in one namespace."""
    return load_harness("popkit_harness_for_watch")


ev = load_eval()


# ------------------------------------------------------------------------------ what a warm start generates


def test_a_warm_start_generates_the_inputs_a_run_asks_for_first():
    cases = [{"size": 8, "seed": 1}, {"size": 16, "seed": 2}]
    assert ev.inputs_ahead("test", cases, trust=True) == [
        {"size": 8, "seed": 1}, {"size": 8, "seed": 8}, {"size": 16, "seed": 2}, {"size": 16, "seed": 9}]
    assert ev.inputs_ahead("test", cases, trust=False) == cases
    assert ev.inputs_ahead("benchmark", cases, trust=True) == [  # the warm-up's (seed + 1009), then each case's
        {"size": 8, "seed": 1010}, {"size": 8, "seed": 1017}, {"size": 8, "seed": 1}, {"size": 8, "seed": 8},
        {"size": 16, "seed": 2}, {"size": 16, "seed": 9}]
    assert ev.inputs_ahead("profile", cases, trust=True) == []
    assert ev.WARM_READY_LINE.encode() + b"\n" == warm.READY_LINE


# ------------------------------------------------------------------------------ which tasks a warm worker runs


def test_the_bundled_tasks_run_their_own_eval_warm():
    for name in BUNDLED:
        task = resolve_task(name, task_roots([]))
        assert warm.harness_for(task) == "task" and warm.unfit_reason(task) == ""
    assert warm.harness_for(load_task(DOUBLER)) == "task"


def _own_eval_task(root: Path, reference: str, eval_text: str = "from submission import custom_kernel\n") -> Path:
    task = root / "set" / "mine"
    task.mkdir(parents=True)
    (task / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n  - {name: reference.py, source: reference.py}\n"
        "  - {name: eval.py, source: eval.py}\nlang: py\ndescription: x\nconfig: {main: eval.py}\n"
        "tests:\n  - {size: 8, seed: 1}\nbenchmarks:\n  - {size: 16, seed: 2}\n")
    (task / "reference.py").write_text(reference)
    (task / "eval.py").write_text(eval_text)
    return task


def test_a_task_popkits_harness_cannot_run_is_named_with_the_reason(tmp_path):
    assert warm.unfit_reason(load_task(FIX / "tasks" / "pair")) == (
        "its eval takes forward, backward from the submission, and popkit's harness calls custom_kernel(data)")
    assert warm.unfit_reason(load_task(FIX / "tasks" / "multi")).startswith(
        "its cases run on several GPUs (world_size 2)")
    assert warm.unfit_reason(load_task(FIX / "tasks" / "double")) == (
        "it has no reference.py, which popkit's harness imports")
    partial = _own_eval_task(tmp_path, "def generate_input(size, seed):\n    pass\nref_kernel = None\n")
    assert warm.unfit_reason(load_task(partial)) == (
        "its reference.py defines no check_implementation, which popkit's harness calls")
    whole = _own_eval_task(tmp_path / "b", (DOUBLER / "reference.py").read_text())
    assert warm.harness_for(load_task(whole)) == "popkit" and warm.unfit_reason(load_task(whole)) == ""


@pytest.fixture
def cli(cli, tmp_path):
    """The shared CLI, with SUB in an argument standing for an honest submission in the test's folder."""
    sub = tmp_path / "sub.py"
    sub.write_bytes(HONEST)
    return lambda *args: cli(*(a.replace("SUB", str(sub)) for a in args))


@pytest.mark.parametrize("args, message", [
    (("test", "SUB", "--watch", "--secret-runs", "1"), "--watch runs the public cases only"),
    (("test", "SUB", "--watch", "--keep-workdir"), "--watch removes each warm worker's folder after its verdict"),
    (("bench", "SUB", "--watch", "--leaderboard"), "--watch runs benchmark mode, not the ranked chain or profile"),
    (("bench", "SUB", "--watch", "--baseline", "reference"), "--watch times the submission only"),
    (("bench", "SUB", "SUB", "--watch"), "--watch watches one file on one GPU"),
])
def test_what_watch_cannot_do_is_a_usage_error(cli, args, message):
    result = cli(*args, "--task", str(DOUBLER), "--json")
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "popkit/error/1" and doc["message"].startswith(message), doc


def test_a_task_popkits_harness_cannot_run_exits_11_instead_of_running_cold(cli):
    result = cli("test", "SUB", "--task", str(FIX / "tasks" / "pair"), "--watch")
    assert result.exit_code == 11, result.output
    assert ("--watch: popkit's harness cannot run pair: its eval takes forward, backward from the submission"
            in " ".join(result.output.split()))
    assert "run it cold: popkit test" in " ".join(result.output.split())


def test_a_verdict_that_never_ran_is_a_json_line_with_the_error():
    verdict = watch.Verdict(index=2, trigger="save", submission="sub.py", sha256="ab", saved_at=1e9, seconds=0.52,
                            ready_at_save=True, warmup_s=3.0, harness="task", note="warm worker: ...",
                            error=SubmissionError("sub.py:4:39: syntax error: invalid syntax", "fix it"))
    doc = verdict.to_json()
    assert doc["schema"] == "popkit/watch/1" and doc["worker"] == "warm"
    assert (doc["outcome"], doc["exit_code"], doc["report"]) == ("bad_submission", 4, None)
    assert doc["error"]["message"] == "sub.py:4:39: syntax error: invalid syntax"
    assert doc["saved_at"] == "2001-09-09T01:46:40.000+00:00"


# ------------------------------------------------------------------------------ proc.run's seams for a warm start


def test_a_moving_deadline_stops_a_child_and_a_kept_pipe_reaches_it(tmp_path):
    read, write = os.pipe()
    go_at: list[float] = []
    out: dict = {}
    code = "import os; print(os.read(int(os.environ['CTL']), 100).decode().strip(), flush=True); import time; time.sleep(60)"

    def run() -> None:
        out["done"] = proc.run([sys.executable, "-c", code], tmp_path, dict(os.environ), 300, inputs={"CTL": read},
                               deadline=lambda: go_at[0] + 1.5 if go_at else None)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    go_at.append(time.monotonic())
    os.write(write, b"go now\n")
    os.close(write)
    thread.join(10)
    assert not thread.is_alive()
    done = out["done"]
    assert done.timed_out and done.stdout.strip() == "go now"
    # ended by the moving deadline (go + 1.5 s), long before its fixed 300 s
    assert 1.5 <= done.seconds < 0.5 + 1.5 + proc.DEADLINE_POLL_S + 1.0


# ------------------------------------------------------------------------------ warm pairs (slow: torch)


def _raw_warm_eval(tmp_path: Path, go: bytes | None) -> tuple[int, bytes, str]:
    """tasks/eval.py started warm by hand: (exit code, what it wrote on the pipe, stderr)."""
    ws = Executor().new_workspace(tmp_path)
    main = ws.prepare(load_task(DOUBLER), HONEST)
    ws.write_cases("test.txt", "size: 8; seed: 1\n")
    pipe_r, pipe_w = os.pipe()
    ctl_r, ctl_w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPCORN_", "POPKIT_"))}
    env.update(CHILD_ENV, POPCORN_FD=str(pipe_w), POPKIT_CONTROL_FD=str(ctl_r))
    child = subprocess.Popen([sys.executable, main, "test", "test.txt"], cwd=tmp_path, env=env,
                             pass_fds=(pipe_w, ctl_r), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(pipe_w)
    os.close(ctl_r)
    first = os.read(pipe_r, len(warm.READY_LINE))
    assert first == warm.READY_LINE
    if go is not None:
        os.write(ctl_w, go)
    os.close(ctl_w)
    with os.fdopen(pipe_r, "rb") as f:
        rest = f.read()
    _, err = child.communicate(timeout=120)
    return child.returncode, rest, err.decode()


@pytest.mark.slow
def test_a_warm_start_without_go_writes_nothing_and_a_wrong_go_is_refused(tmp_path):
    code, rest, _ = _raw_warm_eval(tmp_path / "a", None)
    assert (code, rest) == (0, b"")
    line = json.dumps({"mode": "benchmark", "cases": "size: 8; seed: 1\n", "key": "k"})
    code, rest, err = _raw_warm_eval(tmp_path / "b", f"go {line}\n".encode())
    assert (code, rest) == (2, b"")
    assert "eval: bad control line: `go` asks for benchmark mode; this warm start prepared test mode" in err


def _verdicts_of(request: Request, count: int = 1, **kw) -> list[watch.Verdict]:
    verdicts: list[watch.Verdict] = []
    watch.run(request, on_verdict=verdicts.append, stop=lambda: len(verdicts) >= count, **kw)
    return verdicts


@pytest.mark.slow
def test_a_task_with_its_own_eval_is_judged_warm_by_popkits_harness_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("POPKIT_HOME", str(tmp_path / "home"))
    task = _own_eval_task(tmp_path, (DOUBLER / "reference.py").read_text())
    sub = tmp_path / "sub.py"
    sub.write_bytes(HONEST)
    request = Request((Source.read(sub),), "test", str(task), options=runner.RunOptions(env=CHILD_ENV))
    (verdict,) = _verdicts_of(request)
    report = verdict.report
    assert report.outcome == "passed" and report.harness == "popkit" and report.label == "warm"
    assert verdict.harness == "popkit" and report.notes[0].startswith("warm worker, popkit's harness: this task's own")
    assert verdict.to_json()["note"] == report.notes[0]


def _started(pid: int) -> bytes | None:
    """A process's start time (field 22 of /proc/PID/stat), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except OSError:
        return None


def _tree(pid: int) -> set[tuple[int, bytes]]:
    """Every process below `pid`, each with its start time (a pid reused later is another process)."""
    return {(child, start) for child in descendants(pid) if (start := _started(child)) is not None}


def _alive(procs: set[tuple[int, bytes]]) -> set[tuple[int, bytes]]:
    return {(pid, start) for pid, start in procs if _started(pid) == start}


class Session:
    """`popkit test FILE --watch --json` in a child process: its JSON lines and its stderr, as they come."""

    def __init__(self, tmp_path: Path, sub: Path, *args: str):
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {**os.environ, **CHILD_ENV, "TMPDIR": str(self.tmp), "XDG_DATA_HOME": str(tmp_path / "data"),
               "PYTHONPATH": os.pathsep.join((str(ROOT), os.environ.get("PYTHONPATH", "")))}
        env.pop("POPKIT_HOME", None)
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "popkit", "test", str(sub), "--task", str(DOUBLER), "--watch", "--json", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err.append), daemon=True).start()

    @staticmethod
    def _read(stream, put) -> None:
        for line in stream:
            put(line)

    def verdict(self, timeout: float = 180.0) -> dict:
        return json.loads(self.lines.get(timeout=timeout))

    def readies(self) -> int:
        return sum(line.startswith("watch: ready") for line in list(self.err))

    def wait_ready(self, count: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while self.readies() < count:
            assert time.monotonic() < deadline, "".join(self.err)
            assert self.proc.poll() is None, "".join(self.err)
            time.sleep(0.05)


def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _save(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.slow
@needs_sandbox
def test_a_watch_judges_every_save_warm_in_the_sandbox_and_ctrl_c_leaves_nothing(tmp_path):
    sub = tmp_path / "sub.py"
    sub.write_bytes(HONEST)
    s = Session(tmp_path, sub)
    first = s.verdict()
    assert (first["verdict"], first["trigger"], first["outcome"], first["exit_code"]) == (0, "start", "passed", 0)
    report = first["report"]
    assert report["schema"] == "popkit/run/1" and report["label"] == "warm" and report["harness"] == "task"
    assert report["isolation"]["level"] == "namespaces"
    assert first["note"].startswith("warm worker: the eval was started before the save")

    s.wait_ready(1)
    _save(sub, EDITED)  # an edit is picked up, judged by a pair that was ready
    edited = s.verdict()
    assert (edited["trigger"], edited["outcome"], edited["ready_at_save"]) == ("save", "passed", True)
    assert edited["sha256"] == hashlib.sha256(EDITED).hexdigest() == edited["report"]["sha256"]
    assert edited["warmup_s"] > 0 and edited["save_to_verdict_s"] > 0

    s.wait_ready(2)
    half = ALIASING[:ALIASING.index(b".mul_(") + 6]  # a partial write, then the rest: one verdict, on the whole
    assert not parses(half)
    _save(sub, half)
    time.sleep(0.15)
    _save(sub, ALIASING)
    cheat = s.verdict()
    assert cheat["sha256"] == hashlib.sha256(ALIASING).hexdigest()
    assert (cheat["outcome"], cheat["exit_code"]) == ("failed", 1)
    (case,) = cheat["report"]["runs"][0]["tests"]
    assert case["error"] == "output aliases input 0 (same storage)"  # the cheat, failed by its name

    s.wait_ready(3)
    _save(sub, b"def custom_kernel(data:\n")
    broken = s.verdict()
    assert (broken["outcome"], broken["exit_code"], broken["report"]) == ("bad_submission", 4, None)
    assert "syntax error" in broken["error"]["message"]

    history = subprocess.run([sys.executable, "-m", "popkit", "history", "--json"], env=s.env, capture_output=True,
                             text=True, timeout=60)
    runs = json.loads(history.stdout)["runs"]
    assert len(runs) == 3 and all(r["device"].endswith("[warm]") for r in runs), runs

    before = _tree(s.proc.pid)
    assert len(before) >= 5, before  # watchdog, unshare, the sandbox's process 1, the eval, its worker
    s.proc.send_signal(signal.SIGINT)
    s.proc.wait(timeout=30)
    assert s.proc.returncode == 130
    assert not _alive(before), "processes of the watch outlived Ctrl-C"
    assert not [p.name for p in s.tmp.iterdir() if p.name.startswith("popkit-")]


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED)
def test_a_warm_verdict_equals_the_cold_one_for_the_bundled_examples(name):
    task = resolve_task(name, task_roots([]))
    path = ROOT / "submissions" / name / "pytorch.py"
    content = path.read_bytes()
    options = runner.RunOptions(env=CHILD_ENV)
    executor = sandbox.executor_for("auto")
    cold = runner.run_submission(task, path, "test", options, system={"device": "cpu"}, executor=executor)
    pair = warm.WarmPair(task, "test", content, replace(options, label="warm"), executor)
    try:
        result = pair.go(content, lambda _msg: None)
    finally:
        pair.discard()
    (warm_run,) = result.runs
    (cold_run,) = cold.runs
    assert [(c.spec, c.passed, c.error) for c in warm_run.tests] == [(c.spec, c.passed, c.error)
                                                                     for c in cold_run.tests]
    assert (warm_run.outcome, warm_run.check) == (cold_run.outcome, cold_run.check) == ("passed", "pass")
    assert warm_run.raw["trust.checks"] == cold_run.raw["trust.checks"]


LOGGED = '''
import multiprocessing
import sys

_generate = generate_input


def generate_input(size, seed, scale=2.0):
    side = "worker" if multiprocessing.parent_process() is not None else "trusted"
    with open("generated.log", "a") as log:
        log.write(f"{seed} {'submission' in sys.modules} {side}\\n")
    return _generate(size, seed, scale)
'''


@pytest.mark.slow
def test_a_warm_pair_generates_the_inputs_before_the_submission_is_imported(tmp_path):
    task_dir = tmp_path / "set" / "logged"
    task_dir.mkdir(parents=True)
    (task_dir / "task.yml").write_text((DOUBLER / "task.yml").read_text().replace(
        "../../../../tasks/eval.py", "eval.py").replace("{size: 8, seed: 1}", "{size: 8, seed: 1}\n  - {size: 9, seed: 3}"))
    (task_dir / "eval.py").write_bytes((ROOT / "tasks" / "eval.py").read_bytes())
    (task_dir / "reference.py").write_text((DOUBLER / "reference.py").read_text() + LOGGED)
    task = load_task(task_dir)
    pair = warm.WarmPair(task, "test", HONEST, runner.RunOptions(env=CHILD_ENV, label="warm"), Executor())
    try:
        result = pair.go(HONEST, lambda _msg: None)
        lines = [line.split() for line in (pair.workspace.cwd / "generated.log").read_text().splitlines()]
    finally:
        pair.discard()
    assert result.runs[0].outcome == "passed" and result.ready_at_go is False
    # Every input of both cases (seed, and seed + 7 for the fresh-seed check) was generated in the worker before
    # the import, once, and handed to the run: none was generated after it. The trusted side makes its own
    # copies, and never imports the submission.
    assert [w[:2] for w in lines if w[2] == "worker"] == [["1", "False"], ["8", "False"], ["3", "False"],
                                                          ["10", "False"]]
    assert sorted(int(t[0]) for t in lines if t[2] == "trusted") == [1, 3, 8, 10]
    assert all(t[1] == "False" for t in lines)


@pytest.mark.slow
def test_a_warm_benchmark_verdict_has_the_cold_ones_cases_and_keys():
    task = load_task(DOUBLER)
    options = runner.RunOptions(env=CHILD_ENV)
    executor = sandbox.executor_for("auto")
    cold = runner.run_submission(task, Path("sub.py"), "benchmark", options, system={"device": "cpu"},
                                 content=HONEST, executor=executor)
    pair = warm.WarmPair(task, "benchmark", HONEST, replace(options, label="warm"), executor)
    try:
        result = pair.go(HONEST, lambda _msg: None)
    finally:
        pair.discard()
    (warm_run,), (cold_run,) = result.runs, cold.runs
    assert (warm_run.outcome, cold_run.outcome) == ("passed", "passed")
    assert [c.spec for c in warm_run.benchmarks] == [c.spec for c in cold_run.benchmarks]
    assert sorted(warm_run.raw) == sorted(cold_run.raw)
    assert all(c.runs >= 3 and c.mean_ns > 0 for c in warm_run.benchmarks)


@pytest.mark.slow
def test_a_warm_run_gets_its_modes_timeout_from_go(tmp_path):
    task_dir = tmp_path / "set" / "quick"
    task_dir.mkdir(parents=True)
    (task_dir / "task.yml").write_text((DOUBLER / "task.yml").read_text().replace(
        "../../../../tasks/eval.py", "eval.py").replace("test_timeout: 60", "test_timeout: 3"))
    (task_dir / "eval.py").write_bytes((ROOT / "tasks" / "eval.py").read_bytes())
    (task_dir / "reference.py").write_text((DOUBLER / "reference.py").read_text())
    loop = b"def custom_kernel(data):\n    while True:\n        pass\n"
    pair = warm.WarmPair(load_task(task_dir), "test", HONEST, runner.RunOptions(env=CHILD_ENV, label="warm"),
                         Executor())
    try:
        deadline = time.monotonic() + 120
        while not pair.ready:  # a pair may wait far longer than the mode's timeout before its `go`
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(4)
        assert pair.alive
        started = time.monotonic()
        result = pair.go(loop, lambda _msg: None)
        took = time.monotonic() - started
    finally:
        pair.discard()
    (run,) = result.runs
    assert run.timed_out and run.outcome == "timed_out" and run.exit_code == 114
    assert 3.0 <= run.duration_s <= took < 3.0 + proc.DEADLINE_POLL_S + 2 * proc.KILL_GRACE_S
