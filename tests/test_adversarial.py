"""Submissions that attack popkit's runner (tests/adversarial/): none may hang popkit, outlive it,
forge its verdict or change its harness unnoticed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

import popkit
from popkit.model.tasks import load_task
from popkit.run import protocol
from popkit.run import runner

ROOT = Path(popkit.__file__).resolve().parent.parent  # the popkit under test, for `python -m popkit`
ATTACKS = Path(__file__).parent / "adversarial"
TASKS = Path(__file__).parent / "fixtures" / "tasks"
NO_PROBE = {"device": "test"}


def attack_env(log: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ATTACKS), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "POPKIT_ATTACK_LOG": str(log)}


def recorded(log: Path) -> list[tuple[str, int, str]]:
    if not log.exists():
        return []
    return [(role, int(pid), cwd) for role, pid, cwd in (line.split(" ", 2) for line in log.read_text().splitlines())]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def assert_nothing_left(log: Path, within_s: float = 5.0) -> None:
    entries = recorded(log)
    assert entries, "the attack recorded no process"
    pids = [pid for _, pid, _ in entries]
    assert wait_until(lambda: not any(alive(p) for p in pids), within_s), \
        [e for e in entries if alive(e[1])]
    workdirs = {cwd for _, _, cwd in entries}
    assert wait_until(lambda: not any(os.path.exists(d) for d in workdirs), within_s), workdirs


def run_attack(name: str, log: Path, task: str = "double", mode: str = "test", **task_changes):
    task_ = load_task(TASKS / task)
    if task_changes:
        task_ = replace(task_, **task_changes)
    options = runner.RunOptions(precompile=False, env=attack_env(log), isolation="none")  # the log is outside
    return runner.run_submission(task_, ATTACKS / name, mode, options, system=NO_PROBE)


# --------------------------------------------------------------------------- 3: hangs past the timeout


@pytest.mark.slow
def test_a_timeout_returns_in_time_whatever_a_detached_grandchild_holds_open(tmp_path):
    log = tmp_path / "attack.log"
    result = {}
    thread = threading.Thread(target=lambda: result.update(report=run_attack("escape.py", log, test_timeout=2.0)),
                              daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(2.0 + 5.0)
    assert not thread.is_alive(), f"a 2 s timeout still running after {time.monotonic() - start:.0f} s"
    run = result["report"].runs[0]
    assert run.timed_out and run.outcome == "timed_out"
    assert {role for role, _, _ in recorded(log)} == {"eval", "grandchild"}
    assert_nothing_left(log)


# ------------------------------------------------------------------ 4: popkit stopped by a signal


def _default_stop_signals() -> None:
    """popkit as a terminal starts it, whatever started the tests: under `nohup` SIGHUP arrives ignored, and
    popkit rightly keeps ignoring it."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _popkit_on(tmp_path: Path, attack: str, start=_default_stop_signals) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "attack.log"
    # isolation none: the attack logs its processes to a file outside its workspace (these tests are about the
    # watchdog, which is the same under the sandbox, where the pid namespace ends every process anyway)
    env = {**os.environ, **attack_env(log), "POPKIT_HOME": str(tmp_path / "home"), "POPKIT_ISOLATION": "none"}
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT), env["PYTHONPATH"]))
    popkit = subprocess.Popen(
        [sys.executable, "-m", "popkit", "test", str(ATTACKS / attack), "--task", str(TASKS / "double"),
         "--no-precompile", "--no-history"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=start)
    assert wait_until(lambda: len(recorded(log)) >= 2, 30), "the attack did not start"
    return popkit, log


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_ends_popkit_cleanly_with_its_children_and_workdir(tmp_path, sig):
    popkit, log = _popkit_on(tmp_path, "escape.py")
    popkit.send_signal(sig)
    out, err = popkit.communicate(timeout=10)
    assert popkit.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1].startswith(f"popkit: stopped by {sig.name};"), err  # after progress lines
    assert "Traceback" not in err
    assert_nothing_left(log)


@pytest.mark.slow
def test_under_nohup_popkit_keeps_ignoring_sighup(tmp_path):
    def nohup() -> None:
        _default_stop_signals()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    popkit, log = _popkit_on(tmp_path, "escape.py", start=nohup)
    popkit.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert popkit.poll() is None, "popkit stopped on a SIGHUP it was started ignoring"
    popkit.send_signal(signal.SIGTERM)
    popkit.communicate(timeout=10)
    assert popkit.returncode == 128 + signal.SIGTERM
    assert_nothing_left(log)


@pytest.mark.slow
def test_sigkill_of_popkit_takes_its_children_and_workdir_with_it(tmp_path):
    popkit, log = _popkit_on(tmp_path, "escape.py")
    popkit.kill()
    popkit.communicate(timeout=10)
    assert_nothing_left(log, within_s=10)


# ----------------------------------------------------------------------- 2: late result-pipe writes


def test_a_pipe_write_after_the_eval_exited_is_not_read(tmp_path):
    log = tmp_path / "attack.log"
    report = run_attack("late_pipe.py", log)
    run = report.runs[0]
    assert run.check == "fail" and run.outcome == "failed", run.raw
    assert int(report.exit_code) == 1
    assert_nothing_left(log)


def test_popkit_harness_needs_its_closing_record_and_keeps_the_first_value_of_a_key():
    key = "k"
    body = b"test-count: 1\ncheck: fail\n"
    import hashlib
    import hmac

    record = b"popkit.end: " + hmac.new(key.encode(), body, hashlib.sha256).hexdigest().encode() + b"\n"
    assert protocol.sealed_pipe(body + record + b"check: pass\n", key) == (body, "")
    forged, problem = protocol.sealed_pipe(b"check: pass\n" + body + record, key)
    assert problem.startswith("result-pipe tampering")
    assert protocol.parse_pipe(forged.decode(), first_wins=True)["check"] == "pass"  # why the record matters
    assert protocol.sealed_pipe(body, key)[1].startswith("result pipe: popkit's harness ended without")
    assert protocol.parse_pipe("check: fail\ncheck: pass\n", first_wins=True) == {"check": "fail"}


@pytest.mark.slow
def test_the_result_pipe_reopened_through_proc_cannot_forge_popkits_harness(tmp_path):
    log = tmp_path / "attack.log"
    task = load_task(Path(popkit.__file__).resolve().parent.parent / "tasks" / "vectoradd")
    options = runner.RunOptions(precompile=False, env=attack_env(log), isolation="none")  # the log is outside
    report = runner.run_submission(task, ATTACKS / "late_pipe_proc.py", "test", options, system=NO_PROBE)
    run = report.runs[0]
    assert run.outcome == "failed" and int(report.exit_code) == 1, run.summary
    # Even as root the sealed worker (no CAP_SYS_PTRACE) cannot reopen the pipe: the run fails on its own wrong
    # results; were a line to arrive, the closing record would name it as tampering.
    assert run.summary.startswith(("result-pipe tampering", "check failed: ")), run.summary
    assert "elements mismatch" in run.summary or run.summary.startswith("result-pipe tampering"), run.summary
    assert_nothing_left(log)


# ---------------------------------------------------------------------------- 5: bounded memory


def test_a_flood_of_output_is_kept_as_a_bounded_head_and_tail(tmp_path):
    log = tmp_path / "attack.log"
    report = run_attack("flood.py", log)
    run = report.runs[0]
    assert run.outcome == "passed", run.summary
    limit = 8 * 1024 + 64 * 1024 + 100  # the first 8 KiB and the last 64 KiB of each
    assert len(run.stdout) < limit and len(run.stderr) < limit
    assert "bytes not kept" in run.stdout
    assert len(json.dumps(report.to_json())) < 4 * limit


def test_a_huge_count_on_the_pipe_is_bounded_by_the_cases_file(tmp_path):
    report = run_attack("huge_count.py", tmp_path / "attack.log")
    run = report.runs[0]
    assert run.raw["test-count"] == "100000000"
    assert len(run.tests) == 2


# --------------------------------------------------------------------------- 9: no case results


def test_an_eval_writing_only_check_pass_does_not_pass(tmp_path):
    (tmp_path / "only_check_eval.py").write_bytes((ATTACKS / "only_check_eval.py").read_bytes())
    (tmp_path / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n"
        "  - {name: eval.py, source: only_check_eval.py}\n"
        "lang: py\ndescription: d\nconfig: {main: eval.py}\ntests:\n  - {size: 1}\n")
    report = runner.run_submission(load_task(tmp_path), Path(__file__).parent / "fixtures" / "submissions" / "good.py",
                                   "test", runner.RunOptions(precompile=False), system=NO_PROBE)
    run = report.runs[0]
    assert run.outcome == "failed" and int(report.exit_code) == 1
    assert "wrote `check: pass` but no case results for its 1 case(s)" in run.summary


# ----------------------------------------------------------------------------- 1: harness tampering


def tamper_task(tmp_path: Path):
    tmp_path.mkdir()
    (tmp_path / "eval.py").write_bytes((TASKS / "common" / "tiny_eval.py").read_bytes())
    (tmp_path / "reference.py").write_text("def ref_kernel(data):\n    return 2 * data\n")
    (tmp_path / "utils.py").write_text("HELPER = 1\n")
    files = "".join(f"  - {{name: {n}, source: {n}}}\n" for n in ("eval.py", "reference.py", "utils.py"))
    (tmp_path / "task.yml").write_text(
        "files:\n  - {name: submission.py, source: '@SUBMISSION@'}\n" + files
        + "lang: py\ndescription: d\nconfig: {main: eval.py}\ntests:\n  - {size: 1}\nbenchmarks:\n  - {size: 2}\n")
    return load_task(tmp_path)


@pytest.mark.parametrize("attack, harness, files", [
    ("tamper_prestep.py", "task", "eval.py"),
    ("tamper_hidden.py", "task", "eval.py"),
    ("tamper_hidden.py", "popkit", "eval.py, popkit_eval.py"),  # popkit's own harness, found by the glob
])
def test_a_task_file_changed_in_the_pre_step_fails_the_run_as_harness_tampering(tmp_path, attack, harness, files):
    options = runner.RunOptions(precompile=True, harness=harness, env=attack_env(tmp_path / "attack.log"))
    report = runner.run_submission(tamper_task(tmp_path / "task"), ATTACKS / attack, "test", options, system=NO_PROBE)
    assert int(report.exit_code) == 1
    assert report.failure.summary == (
        f"harness tampering: the submission modified {files} during the compile pre-step; the leaderboard "
        f"would run the modified file (popkit restored {'it' if ',' not in files else 'them'})")


@pytest.mark.parametrize("precompile, during", [(False, "the test mode"), (True, "the compile pre-step")])
def test_a_task_file_changed_at_import_fails_the_chain_before_a_later_mode_runs_it(tmp_path, precompile, during):
    options = runner.RunOptions(precompile=precompile, env=attack_env(tmp_path / "attack.log"),
                                secret_seeds=(5,))
    report = runner.run_submission(tamper_task(tmp_path / "task"), ATTACKS / "tamper_import.py", "leaderboard",
                                   options, system=NO_PROBE)
    assert int(report.exit_code) == 1 and report.score_public_s is None
    assert report.failure.summary.startswith(
        f"harness tampering: the submission modified eval.py, reference.py, utils.py during {during};")
    assert [r.mode for r in report.runs] == ["test"]  # benchmark and leaderboard never ran the rewritten eval


# ------------------------------------------------------------------- 9: a huge --secret-runs


@pytest.mark.parametrize("command", [["test"], ["bench", "--leaderboard"]])
def test_a_huge_secret_run_count_is_refused_at_once(command, tmp_path):
    from typer.testing import CliRunner

    from popkit.cli import app

    good = Path(__file__).parent / "fixtures" / "submissions" / "good.py"
    args = [*command, str(good), "--task", str(TASKS / "double"), "--secret-runs", "1000000000", "--no-history"]
    done = {}
    thread = threading.Thread(daemon=True, target=lambda: done.update(
        result=CliRunner().invoke(app, args, env={"POPKIT_HOME": str(tmp_path)})))
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "popkit is still drawing a billion secret seeds"
    assert done["result"].exit_code == 2 and "--secret-runs" in done["result"].output


def test_an_ab_comparison_names_harness_tampering_too(tmp_path):
    from popkit.measure import ab

    options = runner.RunOptions(precompile=False, env=attack_env(tmp_path / "attack.log"))
    good = Path(__file__).parent / "fixtures" / "submissions" / "good.py"
    report = ab.run_ab(tamper_task(tmp_path / "task"), good, ATTACKS / "tamper_import.py", options, system=NO_PROBE)
    assert report.failed_side == "B"
    assert report.failure.summary.startswith("harness tampering: the submission modified eval.py, reference.py, "
                                             "utils.py during the benchmark mode of side B")
