"""Every wrong and cheating submission fails with the message that names its class; honest ones pass.

The files live in submissions/wrong/ and submissions/cheats/ (each says in its docstring what it does
and which message catches it). They run against the bundled tasks through popkit.run.runner, with small
cases so a CPU box gets through them; on a GPU the same tests exercise the CUDA paths.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from popkit.model.tasks import load_task
from popkit.run import runner
from popkit.run.executor import Executor

ROOT = Path(__file__).resolve().parent.parent
TASKS, SUBMISSIONS = ROOT / "tasks", ROOT / "submissions"
CHILD_ENV = {"OMP_NUM_THREADS": "1"}  # see test_harness.py: torch's thread pool on a small CPU box

# Small cases per bundled task: a few shapes (odd ones included) and several seeds.
TEST_CASES = {
    "identity": [{"size": 1, "seed": 11}, {"size": 1000, "seed": 12}, {"size": 4099, "seed": 13}],
    "vectoradd": [{"size": 1, "seed": 21}, {"size": 17, "seed": 22}, {"size": 64, "seed": 23}],
    "grayscale": [{"height": 1, "width": 1, "seed": 31}, {"height": 17, "width": 33, "seed": 32}],
    "vectorsum": [{"size": 1, "seed": 41}, {"size": 4099, "seed": 42}],
    "softmax": [{"rows": 1, "cols": 1, "seed": 51}, {"rows": 17, "cols": 129, "seed": 52}],
    "matmul": [{"m": 1, "n": 1, "k": 1, "seed": 61}, {"m": 17, "n": 33, "k": 65, "seed": 62}],
}
# Benchmark shapes larger than every test shape (size_gated.py takes its shortcut above 64 x 64).
BENCH_CASES = {"identity": [{"size": 8192, "seed": 71}], "vectoradd": [{"size": 96, "seed": 72}]}


def task_of(submission: Path) -> str:
    """The leaderboard name from the file's `#!POPCORN leaderboard NAME` directive."""
    first = submission.read_text().splitlines()[0].split()
    assert first[:2] == ["#!POPCORN", "leaderboard"], f"{submission}: no directive on the first line"
    return first[2]


def run(submission: Path, mode: str, tmp_path: Path, *, cases=None, seed=None, timeout_s=180.0, task_name=None,
        env=None):
    """One eval of a bundled task through the runner (the task's eval.py is popkit's harness); `task_name`
    runs the file on another task than its directive names; `env` adds to the eval's environment."""
    task_name = task_name or task_of(submission)
    task = load_task(TASKS / task_name)
    if cases is None:
        cases = TEST_CASES[task_name] if mode == "test" else BENCH_CASES[task_name]
    dest = tmp_path / f"{submission.stem}-{mode}"
    ws = Executor().new_workspace(dest)
    main = ws.prepare(task, submission.read_bytes())
    return runner.run_mode(ws, main, mode, cases, timeout_s=timeout_s,
                           options=runner.RunOptions(env={**CHILD_ENV, **(env or {})}), seed=seed)


def failures(mode_run) -> list[str]:
    return [c.error for c in mode_run.tests + mode_run.benchmarks if not c.passed]


def assert_caught(mode_run, expected: str) -> None:
    errors = failures(mode_run)
    assert mode_run.exit_code == 112 and mode_run.check == "fail", (mode_run.exit_code, errors, mode_run.stderr)
    assert errors and all(expected in e for e in errors), errors


CHEATS = [
    ("passthrough.py", "test", "output aliases input 0 (same storage)"),
    ("fabricated_buffer.py", "test", "fabricated output: custom_kernel returned the output buffer from data"),
    ("fabricated_garbage.py", "test", "elements mismatch"),
    ("input_mutation.py", "test", "input 0 was modified by custom_kernel"),
    ("output_aliasing.py", "test", "output aliases input 0 (same storage)"),
    ("lazy_output.py", "test", "lazy output: custom_kernel returned a LazySum (a torch.Tensor subclass)"),
    ("replay_cache.py", "test", "output replay: custom_kernel returned a previous call's result"),
    ("replay_data_ptr.py", "leaderboard", "output replay: custom_kernel returned a previous call's result"),
    ("batch_and_skip.py", "test", "output replay: custom_kernel returned a previous call's result"),
    ("size_gated.py", "benchmark", "elements mismatch"),
    ("mode_branching.py", "benchmark", "mode branching: custom_kernel's output is wrong in benchmark mode"),
    ("timer_patch.py", "test", "timer patched: time.perf_counter_ns was replaced"),
    ("synchronize_patch.py", "test", "timer patched: torch.cuda.synchronize was replaced"),
    ("check_patch.py", "test", "harness patched: reference.check_implementation was replaced"),
    ("pipe_write.py", "test", "result-pipe write: foreign bytes arrived on the harness channel"),
    ("background_thread.py", "test", "background thread started by custom_kernel"),
]


def test_every_cheat_file_is_covered():
    names = {name for name, _, _ in CHEATS} | {"stale_memory.py", "side_stream.py", "side_stream_share.py"}
    names |= {"tensor_int.py", "judge_swap.py", "json_forge.py", "channel_takeover.py", "measure_forge.py",
              "ready_forge.py", "reach_parent.py"}  # test_verdict.py
    names |= {"physics_forge.py"}  # test_cpu_physics.py
    assert names == {p.name for p in (SUBMISSIONS / "cheats").glob("*.py")}


@pytest.mark.slow
@pytest.mark.parametrize("name,mode,expected", CHEATS, ids=[c[0][:-3] for c in CHEATS])
def test_cheat_is_caught_and_named(name, mode, expected, tmp_path):
    assert_caught(run(SUBMISSIONS / "cheats" / name, mode, tmp_path), expected)


@pytest.mark.slow
def test_stale_memory_fails(tmp_path):
    """On a CPU, malloc does not always hand the poisoned block back (it splits and merges free
    chunks), so an uncomputed output reads as zeros or garbage: caught as wrong values, named only
    when the poison shows. GPU caching allocators reuse whole blocks: see the next test."""
    result = run(SUBMISSIONS / "cheats" / "stale_memory.py", "test", tmp_path)
    assert result.exit_code == 112 and result.check == "fail"
    assert all("stale memory:" in e or "elements mismatch" in e for e in failures(result)), failures(result)


@pytest.mark.gpu
@pytest.mark.slow
def test_stale_memory_is_named_on_a_gpu(tmp_path):
    assert_caught(run(SUBMISSIONS / "cheats" / "stale_memory.py", "test", tmp_path), "stale memory:")


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", [
    ("size_gated.py", "elements mismatch"),
    ("mode_branching.py", "mode branching: custom_kernel's output is wrong in leaderboard mode"),
    ("batch_and_skip.py", "output replay: custom_kernel returned a previous call's result"),
    ("timer_patch.py", "timer patched: time.perf_counter_ns was replaced"),
    ("background_thread.py", "background thread started by custom_kernel"),
])
def test_cheat_is_caught_in_the_ranked_mode_too(name, expected, tmp_path):
    assert_caught(run(SUBMISSIONS / "cheats" / name, "leaderboard", tmp_path, seed=random.randrange(1, 2**31)),
                  expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["size_gated.py", "mode_branching.py"])
def test_shape_and_mode_cheats_pass_test_mode(name, tmp_path):
    """What makes them cheats: test mode alone would let them through."""
    result = run(SUBMISSIONS / "cheats" / name, "test", tmp_path)
    assert result.exit_code == 0 and result.check == "pass", failures(result)


@pytest.mark.slow
def test_forged_pipe_lines_never_win(tmp_path):
    """Forged `check: pass` lines never make a run pass. Where the forger cannot reach the pipe, the harness's
    own lines fail every case; where it can (as root, seen in about 1 run in 10 on a busy machine), its bytes
    break the harness's closing record and the run fails as tampering, whatever the lines say."""
    result = run(SUBMISSIONS / "cheats" / "pipe_write.py", "test", tmp_path)
    assert result.outcome == "failed" and int(result.exit_code) != 0, result.summary
    if result.raw["check"] == "fail":  # nothing foreign arrived
        assert all(result.raw[f"test.{i}.status"] == "fail" for i in range(len(TEST_CASES["vectoradd"])))
    else:
        assert result.summary.startswith("result-pipe tampering: "), result.summary


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("task", list(TEST_CASES))
def test_side_queue_cheat_fails_with_its_class_on_every_bundled_task(task, tmp_path):
    """At the task's own benchmark shapes: every case whose escaped work the trace audit sees fails with its
    class; a case whose escaped work ended within its margin can only fail on physics, or pass."""
    result = run(SUBMISSIONS / "cheats" / "side_stream.py", "benchmark", tmp_path, task_name=task,
                 cases=load_task(TASKS / task).benchmarks, timeout_s=600)
    errors = failures(result)
    assert result.exit_code == 112 and result.check == "fail", (result.exit_code, errors, result.stderr)
    assert any(e.startswith("unsynchronized work:") for e in errors), errors
    assert all(e.startswith(("unsynchronized work:", "time beats physics:")) for e in errors), errors
    assert not result.benchmarks[-1].passed  # the largest shape, where the fake gain is largest


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("task", list(TEST_CASES))
def test_the_side_queue_cheat_on_one_call_in_ten_fails_by_name_or_is_timed_to_its_trace(task, tmp_path):
    """No share to hide under: a cheating call is named (work past the margin), or no call's time is shorter than
    its own GPU work by the trace (`kernel_ns`: busy time on every queue, the side one included).

    The cheat goes to the side queue on calls 10, 20, ... of the process, so the case must take more calls than
    that: the smallest shape, whose time is noisy enough that the leaderboard loop runs to its 100 calls. (On the
    largest shape, an H200 stopped the leaderboard loop after 3 timed calls: with the warm-up's, fewer than 10
    calls in all, none of them a cheating one, so the run was honest and rightly passed.) There the side work is
    short: on an H100 it ended within the audit's 10 µs margin, and 5 of 6 tasks passed with cheating calls
    timed at 1.7 µs against a median of 6.8 µs (vectoradd), before such calls were timed to their trace. Where
    launching the reference takes the host longer than the GPU takes to run it (softmax, matmul), the side work
    ends before the end event is even queued: the events cover it and nothing is added."""
    result = run(SUBMISSIONS / "cheats" / "side_stream_share.py", "leaderboard", tmp_path, task_name=task,
                 cases=load_task(TASKS / task).benchmarks[:1], timeout_s=600, env={"POPKIT_CHEAT_SHARE": "0.1"})
    errors = failures(result)
    assert result.raw["trust.audit"] == "trace", result.raw.get("trust.audit_note")
    if result.exit_code == 112:
        assert errors and errors[0].startswith("unsynchronized work: call "), errors
        return
    (case,) = result.benchmarks
    assert result.exit_code == 0 and case.runs >= 20 and len(case.kernel_ns) == case.runs, (errors, case.runs)
    # CUDA events resolve about 0.5 µs; the trace's timestamps are the GPU's own. The cheating calls read 1.2 µs
    # (identity) and 1.7 µs (vectoradd) before the fix, against medians of 4.3 and 6.8 µs.
    short = [(i, t, k) for i, (t, k) in enumerate(zip(case.samples_ns, case.kernel_ns), 1) if t < k - 1_500]
    assert not short, (short, case.added_ns)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("task", list(TEST_CASES))
def test_honest_torch_submission_passes_the_timing_audit_at_benchmark_shapes(task, tmp_path):
    result = run(SUBMISSIONS / task / "pytorch.py", "benchmark", tmp_path, cases=load_task(TASKS / task).benchmarks,
                 timeout_s=600)
    assert result.exit_code == 0 and result.check == "pass", failures(result)
    assert result.raw["trust.audit"] == "trace", result.raw.get("trust.audit_note")
    for i in range(len(result.benchmarks)):
        assert float(result.raw[f"benchmark.{i}.drain_max"]) >= 0
        overruns = [float(x) for x in result.raw[f"benchmark.{i}.overruns"].split(",")]
        assert len(overruns) == result.benchmarks[i].runs


WRONG = [
    ("wrong_values.py", "elements mismatch"),
    ("wrong_shape.py", "shape mismatch: expected"),
    ("wrong_dtype.py", "dtype mismatch: expected torch.float16, got torch.float32"),
    ("raises.py", "RuntimeError: custom_kernel gave up on purpose"),
    ("syntax_error.py", "SyntaxError: "),
    ("no_custom_kernel.py", "submission.py defines no custom_kernel(data)"),
]


def test_every_wrong_file_is_covered():
    names = {name for name, _ in WRONG} | {"infinite_loop.py"}
    assert names == {p.name for p in (SUBMISSIONS / "wrong").glob("*.py")}


@pytest.mark.slow
@pytest.mark.parametrize("name,expected", WRONG, ids=[w[0][:-3] for w in WRONG])
def test_wrong_submission_fails_with_its_message(name, expected, tmp_path):
    assert_caught(run(SUBMISSIONS / "wrong" / name, "test", tmp_path), expected)


@pytest.mark.slow
def test_infinite_loop_is_stopped_by_the_runner_timeout(tmp_path):
    # A short timeout: the run is stopped in the loop, or in the eval's start-up on a busy machine; both
    # are the runner's timeout, which is what this proves.
    started = time.monotonic()
    result = run(SUBMISSIONS / "wrong" / "infinite_loop.py", "test", tmp_path, timeout_s=5)
    assert result.timed_out and result.exit_code == 114
    assert time.monotonic() - started < 5 + 10


@pytest.mark.parametrize("name", ["side_stream.py", "side_stream_share.py"])
def test_the_side_queue_cheats_never_say_the_refused_word(name):
    """They must get past the server's word ban, as the real trick does."""
    assert "str" + "eam" not in (SUBMISSIONS / "cheats" / name).read_text().lower()


def _share_cheat(monkeypatch, share: str | None):
    """submissions/cheats/side_stream_share.py as a module (its reference stubbed), POPKIT_CHEAT_SHARE set."""
    import importlib.util
    import sys
    import types

    monkeypatch.setitem(sys.modules, "reference", types.SimpleNamespace(ref_kernel=lambda data: data))
    if share is None:
        monkeypatch.delenv("POPKIT_CHEAT_SHARE", raising=False)
    else:
        monkeypatch.setenv("POPKIT_CHEAT_SHARE", share)
    spec = importlib.util.spec_from_file_location("share_cheat", SUBMISSIONS / "cheats" / "side_stream_share.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_share_cheat_cheats_on_an_even_share_of_its_calls(monkeypatch):
    cheat = _share_cheat(monkeypatch, None)
    assert cheat.SHARE == 0.4 and [n for n in range(1, 11) if cheat.cheats_on(n)] == [3, 5, 8, 10]
    for share, first in [("0.1", [10, 20]), ("0.2", [5, 10]), ("0.49", [3, 5]), ("0", []), ("1", [1, 2])]:
        cheat = _share_cheat(monkeypatch, share)
        calls = [n for n in range(1, 101) if cheat.cheats_on(n)]
        assert len(calls) == round(100 * float(share)) and calls[:2] == first, share
    with pytest.raises(ValueError, match=r"^POPKIT_CHEAT_SHARE must be a fraction from 0 to 1, got '1.5'$"):
        _share_cheat(monkeypatch, "1.5")


def test_no_submission_outside_wrong_and_cheats_says_the_refused_word():
    """The server refuses the substring anywhere; only the deliberately bad files may contain it."""
    word = "str" + "eam"
    for path in SUBMISSIONS.rglob("*"):
        if path.is_file() and path.parent.name not in ("wrong", "cheats"):
            assert word not in path.read_text(errors="replace").lower(), path


def test_every_wrong_and_cheat_file_has_a_directive_and_a_docstring():
    for folder in ("wrong", "cheats"):
        for path in (SUBMISSIONS / folder).glob("*.py"):
            lines = path.read_text().splitlines()
            assert lines[0].startswith("#!POPCORN leaderboard "), path
            assert lines[1].startswith('"""'), path
            assert (TASKS / task_of(path) / "reference.py").is_file() or task_of(path) in TEST_CASES, path


# ------------------------------------------------------------------------------ honest kernels


def honest_tasks() -> list[str]:
    return [t for t in TEST_CASES if (TASKS / t / "reference.py").is_file() and (SUBMISSIONS / t / "pytorch.py").is_file()]


@pytest.mark.slow
@pytest.mark.parametrize("task", honest_tasks())
def test_honest_torch_submission_passes_every_trust_check(task, tmp_path):
    seed = random.randrange(1, 2**31)
    result = run(SUBMISSIONS / task / "pytorch.py", "test", tmp_path, seed=seed)
    assert result.exit_code == 0 and result.check == "pass", (f"secret seed {seed}", failures(result))


@pytest.mark.slow
@pytest.mark.parametrize("task", [t for t in honest_tasks() if t in BENCH_CASES])
@pytest.mark.parametrize("mode", ["benchmark", "leaderboard"])
def test_honest_torch_submission_passes_timed_modes(task, mode, tmp_path):
    seed = random.randrange(1, 2**31)
    result = run(SUBMISSIONS / task / "pytorch.py", mode, tmp_path, seed=seed)
    assert result.exit_code == 0 and result.check == "pass", (f"secret seed {seed}", failures(result))
    assert result.benchmarks[0].runs >= 3


@pytest.mark.gpu
@pytest.mark.nvcc
@pytest.mark.slow
@pytest.mark.parametrize("task", [t for t in TEST_CASES if (SUBMISSIONS / t / "cuda.py").is_file()
                                  and (TASKS / t / "reference.py").is_file()])
def test_honest_cuda_submission_passes(task, tmp_path):
    seed = random.randrange(1, 2**31)
    result = run(SUBMISSIONS / task / "cuda.py", "test", tmp_path, seed=seed, timeout_s=600)
    assert result.exit_code == 0 and result.check == "pass", (f"secret seed {seed}", failures(result))
    timed = run(SUBMISSIONS / task / "cuda.py", "benchmark", tmp_path, seed=seed, timeout_s=600,
                cases=load_task(TASKS / task).benchmarks)
    assert timed.exit_code == 0 and timed.check == "pass", (f"secret seed {seed}", failures(timed))
