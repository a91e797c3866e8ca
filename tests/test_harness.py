"""popkit's harness, tasks/eval.py: its pure pieces, and the protocol as the runner sees it.

Protocol runs go through popkit.run.runner (one way to run an eval) except where the test needs to
break the protocol itself (no POPCORN_FD, no arguments, forged environment). Eval processes get
OMP_NUM_THREADS=1: on a small CPU box torch's thread pool otherwise turns a 1 ms check into 50 ms.
"""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from popkit.model.tasks import load_task
from popkit.run import protocol
from popkit.run import runner
from popkit.run.executor import Executor
from test_harness_split import load_harness

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "harness"
EVAL_PATH = ROOT / "tasks" / "eval.py"
CHILD_ENV = {"OMP_NUM_THREADS": "1"}


def load_eval():
    """popkit's harness (tasks/eval.py and the modules it loads), its names in one namespace."""
    return load_harness("popkit_harness_under_test")


ev = load_eval()


def workdir_for(task_dir: Path, submission: str | bytes, dest: Path):
    """The task's files flat in `dest`, as the runner lays them out; returns the workspace and the eval's name."""
    data = submission.encode() if isinstance(submission, str) else submission
    ws = Executor().new_workspace(dest)
    return ws, ws.prepare(load_task(task_dir), data)


def run_eval(task_dir: Path, submission: str | bytes, mode: str, cases: list[dict], tmp_path: Path, *,
             seed: int | None = None, env: dict | None = None, timeout_s: float = 120):
    """One eval process through popkit.run.runner; returns its ModeRun (raw pipe keys in .raw)."""
    dest = tmp_path / f"work-{mode}-{len(list(tmp_path.iterdir()))}"
    ws, main = workdir_for(task_dir, submission, dest)
    options = runner.RunOptions(env={**CHILD_ENV, **(env or {})})
    return runner.run_mode(ws, main, mode, cases, timeout_s=timeout_s, options=options, seed=seed)


def raw_eval(workdir: Path, args: list[str], env: dict, with_fd: bool = True, timeout_s: float = 120):
    """Run eval.py by hand (to break the protocol on purpose): (exit code, pipe text, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPCORN_", "POPKIT_"))} | CHILD_ENV | env
    fds: tuple[int, ...] = ()
    read_fd = write_fd = None
    if with_fd:
        read_fd, write_fd = os.pipe()
        env["POPCORN_FD"] = str(write_fd)
        fds = (write_fd,)
    proc = subprocess.Popen([sys.executable, "eval.py", *args], cwd=workdir, env=env, pass_fds=fds,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    text = ""
    if with_fd:
        os.close(write_fd)
        with os.fdopen(read_fd) as pipe:
            text = pipe.read()
    _, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, text, err.decode()


DOUBLER = FIXTURES / "doubler"
GOOD_DOUBLER = "def custom_kernel(data):\n    return data['x'] * data['scale']\n"
SMALL = [{"size": 8, "seed": 11}, {"size": 33, "seed": 12}]


# ====================================================================================== pure pieces


def test_case_lines_parse_python_literals_and_keep_other_text():
    case = ev.parse_case_line("size: 127; seed: -4; x: 0.5; flag: True; off: False; dims: [1, 2]; name: fp8")
    assert case == {"size": 127, "seed": -4, "x": 0.5, "flag": True, "off": False, "dims": [1, 2], "name": "fp8"}
    assert type(case["x"]) is float and type(case["flag"]) is bool


def test_case_lines_split_only_outside_brackets_and_quotes():
    assert ev.parse_case_line("dims: [1; 2]; tag: 'a; b'") == {"dims": "[1; 2]", "tag": "a; b"}
    assert ev.parse_case_line("shape: (2, 3);  k: 4 ") == {"shape": (2, 3), "k": 4}


@pytest.mark.parametrize("text", ["size 127", "size: 1; size: 2", ": 3", "9x: 1", "; ;"])
def test_bad_case_lines_are_refused(text):
    with pytest.raises(ev.CasesError):
        ev.parse_case_line(text)


def test_cases_file_skips_blank_lines_and_names_the_bad_line():
    assert ev.parse_cases("size: 1\n\n  \nsize: 2\n") == [{"size": 1}, {"size": 2}]
    with pytest.raises(ev.CasesError, match="line 2"):
        ev.parse_cases("size: 1\nbroken\n")
    with pytest.raises(ev.CasesError):
        ev.parse_cases("\n")


def test_secret_seed_transform_matches_the_protocol_and_the_runner():
    assert ev.combine_seed(4242, 7) == 4242 + (4242 + 7) * (4242 + 7 + 1) // 2
    assert ev.combine_seed(4242, 7) == protocol.secret_case_seed(4242, 7)
    assert ev.apply_secret_seed({"size": 3, "seed": 1}, 2) == {"size": 3, "seed": 1 + 3 * 4 // 2}
    assert ev.apply_secret_seed({"size": 3}, 2) == {"size": 3}
    assert ev.apply_secret_seed({"size": 3, "seed": 5}, None) == {"size": 3, "seed": 5}


def test_values_on_the_pipe_stay_on_one_line():
    assert ev.escape_value("a\nb\r\nc") == "a\\nb\\nc"
    assert ev.format_spec({"size": 3, "dims": [1, 2]}) == "size: 3; dims: [1, 2]"


def test_statistics_use_the_sample_std_and_report_the_median():
    s = ev.summarize([10.0, 20.0, 30.0, 40.0])
    assert (s.runs, s.mean, s.best, s.worst, s.median) == (4, 25.0, 10.0, 40.0, 25.0)
    assert math.isclose(s.std, math.sqrt(500 / 3))
    assert math.isclose(s.err, s.std / 2)
    assert ev.summarize([5.0, 1.0, 3.0]).median == 3.0
    one = ev.summarize([7.0])
    assert (one.std, one.err, one.median) == (0.0, 0.0, 7.0)


def test_stop_rule_needs_three_runs_then_converges_or_hits_budgets():
    budget = ev.Budget(max_repeats=100, max_time_ns=10e9)
    assert ev.stop_reason([100.0, 100.0], budget, 0) is None  # identical, but fewer than 3
    assert ev.stop_reason([100.0] * 3, budget, 0) == "converged"  # err = 0
    noisy = [100.0, 200.0, 100.0]
    assert ev.stop_reason(noisy, budget, 0) is None
    assert ev.stop_reason(noisy, budget, 121e9) == "wall_time"
    assert ev.stop_reason([4e9, 5e9, 4e9], budget, 0) == "max_time"  # mean*runs = 13 s > 10 s
    assert ev.stop_reason(noisy, ev.Budget(max_repeats=3, max_time_ns=10e9), 0) == "max_repeats"
    # converged (err/mean < 0.001) takes precedence over the other rules
    assert ev.stop_reason([1e10, 1e10, 1e10], budget, 200e9) == "converged"


class FakeClock:
    """A wall clock that moves only when a measurement is made."""

    def __init__(self, step_ns: float):
        self.now, self.step = 0.0, step_ns

    def __call__(self) -> float:
        return self.now


def test_timing_loop_stops_on_wall_time_with_an_injected_clock():
    clock = FakeClock(step_ns=50e9)
    durations = iter([100.0, 300.0, 100.0, 300.0, 100.0])

    def measure():
        clock.now += clock.step
        return {"ok": True, "ns": next(durations)}

    loop = ev.timing_loop(measure, clock, ev.Budget(100, 1e12))
    assert loop.stop == "wall_time" and loop.samples == [100.0, 300.0, 100.0]


def test_timing_loop_reports_the_failing_call_and_keeps_earlier_samples():
    replies = iter([{"ok": True, "ns": 5.0}, {"ok": False, "error": "boom"}])
    loop = ev.timing_loop(lambda: next(replies), FakeClock(0), ev.Budget(100, 1e9))
    assert loop.stop == "failed" and loop.samples == [5.0] and loop.failure["error"] == "boom"


def test_warmup_and_case_budgets_follow_the_protocol():
    assert ev.BUDGETS["benchmark"] == (ev.Budget(100, 0.1e9), ev.Budget(100, 10e9))
    assert ev.BUDGETS["leaderboard"] == (ev.Budget(100, 0.01e9), ev.Budget(100, 30e9))


def test_storage_overlap_sees_views_but_not_copies():
    import torch

    x = torch.arange(8.0)
    assert ev.shares_storage(x[2:5], x) and ev.shares_storage(x.view(2, 4), x[7:])
    assert not ev.shares_storage(x.clone(), x)
    assert not ev.shares_storage(torch.empty(0), x)


def test_poison_bytes_are_nan_for_floats_and_recognised_afterwards():
    import torch

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        t = torch.zeros(5, dtype=dtype)
        assert ev.poison(t, 0xFF) and torch.isnan(t.float()).all()
        assert ev.poisoned_fraction(t, 0xFF) == 1.0 and ev.poisoned_fraction(t, 0x7F) == 0.0
    ints = torch.zeros(4, dtype=torch.int32)
    ev.poison(ints, 0xFF)
    assert ints.tolist() == [-1] * 4
    a = torch.tensor([float("nan"), 1.0])
    assert ev.same_bits(a, a.clone()) and not ev.same_bits(a, torch.tensor([float("nan"), 2.0]))
    assert not ev.same_bits(a, a.double())


def test_output_type_rule_wants_plain_tensors_or_the_references_types():
    import torch

    class Sub(torch.Tensor):
        pass

    ref = ev.type_template(torch.zeros(2))
    assert ev.output_type_problem(torch.ones(2), ref) is None
    assert "lazy output" in ev.output_type_problem(torch.ones(2).as_subclass(Sub), ref)
    assert "wrong output type" in ev.output_type_problem([1.0, 2.0], ref)
    overridden = torch.ones(2)
    overridden.cpu = lambda: None
    assert "overrides 'cpu'" in ev.output_type_problem(overridden, ref)
    pair = ev.type_template((torch.zeros(1), torch.zeros(1)))
    assert ev.output_type_problem([torch.ones(1), torch.ones(1)], pair) is None
    assert "expected 2 outputs" in ev.output_type_problem((torch.ones(1),), pair)
    assert ev.output_type_problem(3.0, ev.type_template(1.5)) is None


def test_check_results_old_and_new_style():
    assert ev.normalize_verdict((True, "")) == (True, "")
    assert ev.normalize_verdict((False, "bad")) == (False, "bad")
    assert ev.normalize_verdict("") == (True, "")
    assert ev.normalize_verdict("values differ") == (False, "values differ")
    assert ev.normalize_verdict(None)[0] is False


# ====================================================================================== protocol


@pytest.fixture
def doubler_dir(tmp_path):
    dest = tmp_path / "doubler"
    workdir_for(DOUBLER, GOOD_DOUBLER, dest)
    (dest / "cases.txt").write_text("size: 8; seed: 1\n")
    return dest


def test_exit_111_without_a_result_fd(doubler_dir):
    code, _, err = raw_eval(doubler_dir, ["test", "cases.txt"], {}, with_fd=False)
    assert code == 111 and "POPCORN_FD" in err


@pytest.mark.parametrize("args", [["fast", "cases.txt"], ["test"], []])
def test_exit_2_for_bad_usage_or_unknown_mode(doubler_dir, args):
    assert raw_eval(doubler_dir, args, {})[0] == 2


@pytest.mark.parametrize("content", [None, "size 8\n", "", "size: 1; size: 2\n"])
def test_exit_113_for_a_missing_or_bad_cases_file(doubler_dir, content):
    if content is not None:
        (doubler_dir / "bad.txt").write_text(content)
    assert raw_eval(doubler_dir, ["test", "bad.txt"], {})[0] == 113


@pytest.mark.slow
def test_an_eval_says_where_its_time_went_by_the_trusted_clock(tmp_path):
    """phase.NAME_ns: the worker's start until `ready` holds the submission's import (here a 0.4 s sleep), the
    cases their calls (0.05 s each, at least 3 calls a case), and the phases fit in the eval's wall time."""
    sub = ("import time\ntime.sleep(0.4)\n\ndef custom_kernel(data):\n    time.sleep(0.05)\n"
           "    return data['x'] * data['scale']\n")
    run = run_eval(DOUBLER, sub, "benchmark", SMALL[:1], tmp_path)
    assert run.exit_code == 0, run.raw
    phases = {name: int(run.raw[f"phase.{name}_ns"]) for name in ev.PHASES}
    assert set(ev.PHASES) == {"judge", "ready", "cases", "close"} and min(phases.values()) >= 0
    assert phases["ready"] >= 0.4e9 and phases["cases"] >= 3 * 0.05e9
    assert (phases["ready"] + phases["cases"] + phases["close"]) / 1e9 <= run.duration_s


@pytest.mark.slow
def test_a_sealed_worker_ends_at_once_and_an_open_one_as_the_leaderboard_process_does(tmp_path):
    """The submission's atexit handler sleeps 2 s: the sealed worker's exit skips it (phase.close_ns), the open
    worker (POPKIT_TRUST=0, the leaderboard's own eval) runs it as a normal interpreter exit would."""
    sub = ("import atexit, time\natexit.register(time.sleep, 2.0)\n\n"
           "def custom_kernel(data):\n    return data['x'] * data['scale']\n")
    sealed = run_eval(DOUBLER, sub, "test", SMALL[:1], tmp_path)
    opened = run_eval(DOUBLER, sub, "test", SMALL[:1], tmp_path, env={"POPKIT_TRUST": "0"})
    assert sealed.exit_code == opened.exit_code == 0, (sealed.raw, opened.raw)
    assert int(sealed.raw["phase.close_ns"]) < 1.5e9 <= 2e9 <= int(opened.raw["phase.close_ns"])


@pytest.mark.slow
def test_passing_test_mode_writes_the_protocol_keys(tmp_path):
    run = run_eval(DOUBLER, GOOD_DOUBLER, "test", SMALL, tmp_path)
    raw = run.raw
    assert run.exit_code == 0 and raw["check"] == "pass"
    assert raw["test-count"] == "2"
    assert raw["test.0.spec"] == "size: 8; seed: 11" and raw["test.1.spec"] == "size: 33; seed: 12"
    assert raw["test.0.status"] == raw["test.1.status"] == "pass"
    assert raw["system.device"] in ("cpu",) or raw["system.arch"]
    assert raw["system.torch"] and "system.cuda" in raw and "system.hip" in raw
    assert set(raw["trust.checks"].split(",")) == set(ev.TRUST_CHECKS)


@pytest.mark.slow
def test_failed_check_exits_112_with_an_old_style_message(tmp_path):
    run = run_eval(DOUBLER, "def custom_kernel(data):\n    return data['x'] * 3\n", "test", SMALL, tmp_path)
    assert run.exit_code == 112 and run.raw["check"] == "fail"
    assert run.raw["test.0.status"] == "fail"
    assert run.raw["test.0.error"] == "values differ\\nsecond line of the message"  # newline escaped
    assert run.tests[0].error == "values differ\nsecond line of the message"


@pytest.mark.slow
def test_secret_seed_changes_every_case_seed(tmp_path):
    run = run_eval(DOUBLER, GOOD_DOUBLER, "test", SMALL, tmp_path, seed=99)
    assert run.exit_code == 0
    assert run.raw["test.0.spec"] == f"size: 8; seed: {ev.combine_seed(11, 99)}"
    assert run.raw["test.1.spec"] == f"size: 33; seed: {ev.combine_seed(12, 99)}"


@pytest.mark.slow
def test_exception_in_the_kernel_names_type_and_message_and_keeps_the_traceback(tmp_path):
    sub = "def custom_kernel(data):\n    raise ValueError('no luck\\nat all')\n"
    run = run_eval(DOUBLER, sub, "test", SMALL[:1], tmp_path)
    assert run.exit_code == 112
    assert run.tests[0].error == "ValueError: no luck"
    assert "Traceback" in run.tests[0].message and "submission.py" in run.tests[0].message


@pytest.mark.slow
def test_cuda_api_failure_exits_110(tmp_path):
    sub = ("def custom_kernel(data):\n"
           "    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
    run = run_eval(DOUBLER, sub, "test", SMALL, tmp_path)
    assert run.exit_code == 110 and run.raw["check"] == "fail"
    assert run.raw["test.0.error"].startswith("RuntimeError: CUDA error")
    assert "test.1.status" not in run.raw  # the context is gone; nothing more runs


@pytest.mark.slow
def test_benchmark_mode_writes_statistics_computed_from_the_samples(tmp_path):
    run = run_eval(DOUBLER, GOOD_DOUBLER, "benchmark", [{"size": 64, "seed": 3}], tmp_path)
    raw = run.raw
    assert run.exit_code == 0 and raw["check"] == "pass" and raw["benchmark-count"] == "1"
    samples = [float(s) for s in raw["benchmark.0.samples"].split(",")]
    stats = ev.summarize(samples)
    assert int(raw["benchmark.0.runs"]) == len(samples) == stats.runs
    for key in ("mean", "std", "err", "best", "worst", "median"):
        assert math.isclose(float(raw[f"benchmark.0.{key}"]), getattr(stats, key), rel_tol=1e-12)
    assert raw["benchmark.0.stop"] in ("converged", "max_time", "wall_time", "max_repeats")
    assert raw["benchmark.0.timer"] == ("cuda-event" if raw["system.device"] != "cpu" else "cpu-monotonic")
    assert len(samples) <= 100


@pytest.mark.slow
def test_leaderboard_mode_rechecks_fresh_inputs_and_passes_an_honest_kernel(tmp_path):
    run = run_eval(DOUBLER, GOOD_DOUBLER, "leaderboard", [{"size": 64, "seed": 3}], tmp_path, seed=5)
    assert run.exit_code == 0 and run.raw["check"] == "pass"
    assert run.benchmarks[0].runs >= 3


@pytest.mark.slow
def test_profile_mode_writes_a_base64_profiler_table(tmp_path):
    run = run_eval(DOUBLER, GOOD_DOUBLER, "profile", [{"size": 64, "seed": 3}], tmp_path)
    assert run.exit_code == 0 and run.raw["check"] == "pass"
    table = base64.b64decode(run.raw["benchmark.0.report"]).decode()
    assert "Name" in table and "Self CPU" in table and "aten::mul" in table


@pytest.mark.slow
def test_trust_checks_can_be_turned_off_for_fidelity_runs(tmp_path):
    passthrough_view = "def custom_kernel(data):\n    data['x'].mul_(data['scale'])\n    return data['x']\n"
    on = run_eval(DOUBLER, passthrough_view, "test", SMALL[:1], tmp_path)
    off = run_eval(DOUBLER, passthrough_view, "test", SMALL[:1], tmp_path, env={"POPKIT_TRUST": "0"})
    assert on.tests[0].error == "output aliases input 0 (same storage)"
    assert off.exit_code == 0 and off.raw["trust.checks"] == ""


@pytest.mark.slow
def test_import_failures_fail_every_case(tmp_path):
    run = run_eval(DOUBLER, "def kernel(data):\n    return data\n", "benchmark", SMALL, tmp_path)
    assert run.exit_code == 112
    assert [c.error for c in run.benchmarks] == ["submission.py defines no custom_kernel(data)"] * 2
    run = run_eval(DOUBLER, "import no_such_module_anywhere\n", "test", SMALL[:1], tmp_path)
    assert run.tests[0].error.startswith("ModuleNotFoundError: No module named 'no_such_module_anywhere'")


@pytest.mark.slow
def test_the_submission_never_sees_the_pipe_the_seed_or_the_trust_switches(tmp_path):
    """A probe kernel fails the case if it can see POPCORN_*/POPKIT_* or holds the result pipe."""
    probe = textwrap.dedent("""\
        import os

        def custom_kernel(data):
            leaks = [k for k in os.environ if k.startswith(("POPCORN_", "POPKIT_"))]
            inode = open("pipe_inode.txt").read().strip()
            for name in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{name}") == f"pipe:[{inode}]":
                        leaks.append(f"fd {name}")
                except OSError:
                    pass
            if leaks:
                raise RuntimeError("leaked: " + ", ".join(leaks))
            return data["x"] * data["scale"]
        """)
    dest = tmp_path / "probe"
    workdir_for(DOUBLER, probe, dest)
    (dest / "cases.txt").write_text("size: 8; seed: 1\n")
    read_fd, write_fd = os.pipe()
    (dest / "pipe_inode.txt").write_text(str(os.fstat(write_fd).st_ino))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPCORN_", "POPKIT_"))}
    env |= CHILD_ENV | {"POPCORN_FD": str(write_fd), "POPCORN_SEED": "123", "POPKIT_TRUST": "1",
                        "POPKIT_TIMING_AUDIT": "drain"}
    proc = subprocess.Popen([sys.executable, "eval.py", "test", "cases.txt"], cwd=dest, env=env,
                            pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        raw = protocol.parse_pipe(pipe.read())
    proc.communicate(timeout=120)
    assert proc.returncode == 0, raw
    assert raw["test.0.status"] == "pass" and raw["check"] == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["test", "benchmark", "leaderboard"])
def test_in_out_buffers_are_not_poisoned(mode, tmp_path):
    """accumulate's reference reads acc before writing it: an honest in-place kernel must pass
    (in benchmark mode every timed call adds into the same acc, so its last output is not checked)."""
    sub = "def custom_kernel(data):\n    x, acc = data\n    acc += x\n    return acc\n"
    run = run_eval(FIXTURES / "accumulate", sub, mode, [{"size": 64, "seed": 4}], tmp_path, seed=8)
    assert run.exit_code == 0, [c.error for c in run.tests + run.benchmarks]


@pytest.mark.slow
def test_returning_a_view_is_fine_when_the_reference_does_the_same(tmp_path):
    sub = "def custom_kernel(x):\n    return x.view(-1, 2), x + x\n"
    run = run_eval(FIXTURES / "reshape", sub, "test", SMALL, tmp_path)
    assert run.exit_code == 0, [c.error for c in run.tests]
    # ... but a view where the reference returns a new tensor is aliasing
    bad = "def custom_kernel(x):\n    x.mul_(2)\n    return x.view(-1, 2).clone(), x\n"
    run = run_eval(FIXTURES / "reshape", bad, "test", SMALL[:1], tmp_path)
    assert run.tests[0].error == "output aliases input 0 (same storage)"


@pytest.mark.slow
def test_a_thread_left_running_by_the_import_fails_every_case(tmp_path):
    sub = textwrap.dedent("""\
        import threading
        import time

        def _spin():
            while True:
                time.sleep(0.01)

        threading.Thread(target=_spin, daemon=True).start()

        def custom_kernel(data):
            return data["x"] * data["scale"]
        """)
    run = run_eval(DOUBLER, sub, "test", SMALL, tmp_path)
    assert run.exit_code == 112
    assert all(c.error.startswith("background thread started by the submission's import") for c in run.tests)


# ============================================================================ unsynchronized work


def test_drain_rule_fails_work_that_outlives_the_end_event_on_enough_calls():
    margin = ev.DRAIN_MARGIN_NS
    honest = [4e3] * 97 + [margin * 40] * 3  # three calls stalled by the host, out of 100
    assert ev.unsynchronized_work(honest) is None
    assert ev.unsynchronized_work([5e3, 6e3, 4e3]) is None
    side_queue = [250e3] * 10  # every call leaves 250 µs of work behind
    verdict = ev.unsynchronized_work(side_queue)
    assert verdict.startswith("unsynchronized work: 10 of 10 timed calls left work running on the device")
    assert "250 µs" in verdict
    assert ev.unsynchronized_work([250e3] * 3) is not None  # the fewest calls a case makes
    assert ev.unsynchronized_work([250e3] * 2 + [4e3]) is None  # two late calls of three: noise can do that
    # A share of the calls, not a count: an honest kernel on a stalling VM drained late on 21 of 100 calls
    # (H100); 49 late calls of 100 pass, 50 fail.
    assert ev.unsynchronized_work([4e3] * 79 + [66e3] * 21) is None
    assert ev.unsynchronized_work([4e3] * 51 + [250e3] * 49) is None
    assert ev.unsynchronized_work([4e3] * 50 + [250e3] * 50) is not None
    assert ev.unsynchronized_work([margin] * 10) is None  # the margin itself is still honest
    assert ev.unsynchronized_work([]) is None


class FakeDevice:
    """A device whose last call left `leftover_ns` of work on another queue: the end event completes at once,
    the device-wide synchronize waits for the rest. The host clock moves only inside synchronize."""

    def __init__(self, event_ns: float, leftover_ns: float, sync_cost_ns: float = 3e3):
        self.now, self.event_ns, self.leftover, self.sync_cost = 0.0, event_ns, leftover_ns, sync_cost_ns
        self.log: list[str] = []

    def clock(self) -> float:
        return self.now

    def event_sync(self, event) -> None:
        self.log.append(f"wait {event}")

    def device_sync(self) -> None:
        self.log.append("synchronize")
        self.now += self.sync_cost + self.leftover
        self.leftover = 0.0


def test_drain_is_the_device_wide_synchronize_after_the_end_event_completed():
    device = FakeDevice(event_ns=10e3, leftover_ns=300e3)
    drain = ev.measure_drain("end", event_sync=device.event_sync, device_sync=device.device_sync,
                             clock_ns=device.clock)
    assert device.log == ["wait end", "synchronize"]  # the end event first, then every queue
    assert drain == 303e3
    idle = FakeDevice(event_ns=10e3, leftover_ns=0)
    assert ev.measure_drain("end", event_sync=idle.event_sync, device_sync=idle.device_sync,
                            clock_ns=idle.clock) == 3e3


class ScriptedLink:
    """The parent's view of a worker that answers from a script (no process, no torch)."""

    def __init__(self, calls: list[dict]):
        self.calls, self.requests = iter(calls), []

    def receive(self) -> dict:
        return {"ok": True, "system": {"device": "Fake GPU"}, "timer": "cuda-event"}

    def request(self, op: str, **fields) -> dict:
        self.requests.append(op)
        if op == "bench_call":
            return next(self.calls)
        return {"ok": True}

    def kill(self) -> None:
        pass


class PipeLines:
    def __init__(self):
        self.lines: dict[str, str] = {}

    def write(self, key, value):
        self.lines.setdefault(key, str(value))


def _session_with(calls: list[dict], trust: bool = True, audit: str = "drain"):
    pipe = PipeLines()
    session = ev.Session(pipe, ScriptedLink(calls), "benchmark", [{"size": 8, "seed": 1}], trust,
                         clock_ns=FakeClock(0), audit=audit)
    session.start()
    return session, pipe


def test_a_case_whose_calls_leave_work_behind_fails_with_the_class():
    warmup = [{"ok": True, "ns": 10e3, "drain": 4e3}] * 3
    late = [{"ok": True, "ns": 10e3, "drain": 290e3}] * 3
    session, pipe = _session_with(warmup + late)
    session.run()
    assert not session.all_passed
    assert pipe.lines["benchmark.0.status"] == "fail"
    assert pipe.lines["benchmark.0.error"].startswith("unsynchronized work: 3 of 3 timed calls")
    assert pipe.lines["benchmark.0.drain_max"] == "290000.0"
    assert pipe.lines["benchmark.0.drains"] == "290000.0,290000.0,290000.0"
    assert pipe.lines["trust.audit"] == "drain"
    assert "benchmark.0.mean" not in pipe.lines  # a failed case has no statistics, as in the protocol
    assert pipe.lines["benchmark.0.audit_samples"] == "10000.0,10000.0,10000.0"  # its event times stay readable


def test_honest_calls_pass_and_report_their_drain_and_trust_off_skips_the_rule():
    calls = [{"ok": True, "ns": 10e3, "drain": 4e3}] * 6
    session, pipe = _session_with(calls)
    session.run()
    assert session.all_passed and pipe.lines["benchmark.0.drain_median"] == "4000.0"
    off, pipe_off = _session_with([{"ok": True, "ns": 10e3, "drain": 290e3}] * 6, trust=False)
    off.run()
    assert off.all_passed and "benchmark.0.status" not in pipe_off.lines


@pytest.mark.parametrize("broken,error", [
    ("generate_input", "generate_input failed: ValueError: the task is broken"),
    ("ref_kernel", "ref_kernel failed: ValueError: the task is broken"),
    ("import", "reference.py failed to import: ValueError: the task is broken"),
])
@pytest.mark.slow
def test_a_broken_reference_is_a_task_error_not_the_submissions(tmp_path, broken, error):
    reference = (FIXTURES / "doubler" / "reference.py").read_text()
    if broken == "import":
        reference += "\nraise ValueError('the task is broken')\n"
    else:
        reference = reference.replace(f"def {broken}(", f"def {broken}(*_a, **_k):\n    raise ValueError("
                                      f"'the task is broken')\n\n\ndef _unused_{broken}(")
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "reference.py").write_text(reference)
    (tmp_path / "task" / "task.yml").write_text(
        (FIXTURES / "doubler" / "task.yml").read_text().replace("../../../../tasks/eval.py", str(EVAL_PATH)))
    sub = tmp_path / "sub.py"
    sub.write_text("def custom_kernel(data):\n    return data['x'] * data['scale']\n")
    report = runner.run_submission(load_task(tmp_path / "task"), sub, "test",
                                   runner.RunOptions(precompile=False, env=CHILD_ENV), system={"device": "test"})
    assert report.outcome == "bad_task" and int(report.exit_code) == 3
    assert report.runs[0].summary == f"task error: test, test size: 8; seed: 1: {error} (the task's reference failed)"


@pytest.mark.slow
def test_a_cache_keyed_on_addresses_is_named_even_when_the_allocator_never_reuses_one(tmp_path):
    """The cheat keeps every input alive, so no fresh allocation ever gets an old address; every second
    leaderboard call gets its input in the previous call's tensors, so the cache replays and is named."""
    cheat = ("_keep, _cache = [], {}\n\ndef custom_kernel(data):\n    _keep.append(data)\n"
             "    key = data['x'].data_ptr()\n    if key not in _cache:\n"
             "        _cache[key] = data['x'] * data['scale']\n    return _cache[key]\n")
    run = run_eval(DOUBLER, cheat, "leaderboard", [{"size": 64, "seed": 3}], tmp_path, seed=5)
    assert run.exit_code == 112
    assert run.benchmarks[0].error.startswith("output replay: custom_kernel returned a previous call's result")
