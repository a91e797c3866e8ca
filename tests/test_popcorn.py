"""popkit.ledger.popcorn and `popkit submit`, against the stand-in popcorn-cli in tests/fake_popcorn/."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from popkit.cli import app
from popkit.errors import PopcornError, RefusedError, UsageError
from popkit.ledger import popcorn
from popkit.ledger import submit
from popkit.ledger.history import History
from popkit.model.results import RemoteResult, RemoteRun

FAKE = Path(__file__).resolve().parent / "fake_popcorn" / "popcorn-cli"
BODY = "import torch\n\n\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"
SOURCE = "#!POPCORN leaderboard fake-board\n#!POPCORN gpu H100\n" + BODY

REAL_OUTPUT = """\
Geomean score (public) on H100: 0.0000123 s
Geomean score (secret) on H100: 0.0000125 s

{
  "submission_id": 4242,
  "leaderboard": "vectoradd",
  "file_name": "v7.py",
  "done": true,
  "runs": [
    {"mode": "test", "secret": false, "runner": "H100", "score": null, "passed": true,
     "start_time": "2026-11-02T10:00:00Z", "end_time": "2026-11-02T10:00:05Z"},
    {"mode": "leaderboard", "secret": false, "runner": "H100", "score": 1.23e-05, "passed": true,
     "start_time": "2026-11-02T10:00:05Z", "end_time": "2026-11-02T10:00:20Z"},
    {"mode": "leaderboard", "secret": true, "runner": "H100", "score": 1.25e-05, "passed": true,
     "start_time": "2026-11-02T10:00:20Z", "end_time": "2026-11-02T10:00:35Z"}
  ]
}
"""


# ------------------------------------------------------------------------------------- argv


@pytest.mark.parametrize("mode", ["test", "benchmark", "leaderboard", "profile"])
def test_argv_for_each_mode(mode):
    argv = popcorn.build_argv("/bin/popcorn-cli", Path("/tmp/s/v7.py"), gpu="H100", leaderboard="vectoradd",
                              mode=mode, output=Path("/tmp/s/out.txt"))
    assert argv == ["/bin/popcorn-cli", "submit", "--gpu", "H100", "--leaderboard", "vectoradd", "--mode", mode,
                    "--no-tui", "-o", "/tmp/s/out.txt", "/tmp/s/v7.py"]


# ----------------------------------------------------------------------------------- parsing


def test_parse_real_output_format():
    result = popcorn.parse_output(REAL_OUTPUT)
    assert result.submission_id == 4242 and result.leaderboard == "vectoradd" and result.done
    assert result.file_name == "v7.py"
    assert result.score_public_s == pytest.approx(1.23e-05) and result.score_secret_s == pytest.approx(1.25e-05)
    assert result.score_gpu == "H100"
    assert [(r.mode, r.secret, r.score, r.passed) for r in result.runs] == [
        ("test", False, None, True), ("leaderboard", False, pytest.approx(1.23e-05), True),
        ("leaderboard", True, pytest.approx(1.25e-05), True)]
    assert result.runs[1].start_time == "2026-11-02T10:00:05Z"
    assert result.passed


def test_parse_score_lines_case_insensitive_with_long_gpu_names():
    text = ("Submitting v7.py...\nGEOMEAN SCORE (Public) on NVIDIA H100 80GB HBM3: 1.5e-05 s\n\n"
            '{"submission_id": 1, "leaderboard": "x", "file_name": "f.py", "done": true, "runs": []}\n')
    result = popcorn.parse_output(text)
    assert result.score_public_s == pytest.approx(1.5e-05) and result.score_gpu == "NVIDIA H100 80GB HBM3"
    assert result.score_secret_s is None
    assert not result.passed  # no runs: nothing passed


def test_parse_without_scores_and_without_json():
    text = '\n{"submission_id": 7, "leaderboard": "x", "file_name": "f.py", "done": true, "runs": ' \
           '[{"mode": "test", "secret": false, "runner": "A100", "score": null, "passed": false}]}'
    result = popcorn.parse_output(text)
    assert result.submission_id == 7 and result.score_public_s is None and not result.passed
    assert popcorn.parse_output("Submission accepted.\n{not json\n") is None


def test_parse_a_result_nested_past_the_stack_is_no_result():
    deep = '{"submission_id": 1, "runs": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert popcorn.parse_output(deep) is None


def test_remote_result_round_trip():
    result = popcorn.parse_output(REAL_OUTPUT)
    assert RemoteResult.from_json(json.loads(json.dumps(result.to_json()))) == result


# ------------------------------------------------------------------------- discovery, registration


def test_find_popcorn_order(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "popcorn").symlink_to(FAKE)
    assert popcorn.find_popcorn({"PATH": str(bin_dir)}) == str(bin_dir / "popcorn")
    (bin_dir / "popcorn-cli").symlink_to(FAKE)
    assert popcorn.find_popcorn({"PATH": str(bin_dir)}) == str(bin_dir / "popcorn-cli")
    assert popcorn.find_popcorn({"PATH": "", "POPKIT_POPCORN": str(FAKE)}) == str(FAKE)


def test_find_popcorn_missing_says_how_to_install():
    with pytest.raises(PopcornError) as info:
        popcorn.find_popcorn({"PATH": ""})
    assert "popcorn-cli not found" in info.value.message
    assert "install popcorn-cli and put it on PATH, or set POPKIT_POPCORN" in info.value.hint
    with pytest.raises(PopcornError, match="POPKIT_POPCORN=/nonexistent"):
        popcorn.find_popcorn({"PATH": "", "POPKIT_POPCORN": "/nonexistent"})


def test_registration_honours_home(tmp_path):
    env = {"HOME": str(tmp_path)}
    assert popcorn.config_path(env) == tmp_path / ".popcorn.yaml"
    assert popcorn.registration_problem(env) == f"{tmp_path / '.popcorn.yaml'} not found"
    (tmp_path / ".popcorn.yaml").write_text("other: 1\n")
    assert "no cli_id" in popcorn.registration_problem(env)
    (tmp_path / ".popcorn.yaml").write_text("cli_id: abc123\n")
    assert popcorn.registration_problem(env) == ""


# ------------------------------------------------------------------------------- the one call


class FakeRun:
    """Records the subprocess.run call and answers like popcorn-cli would."""

    def __init__(self, returncode=0, stdout="", stderr="", raises=None, writes=None):
        self.calls = []
        self.answer = (returncode, stdout, stderr)
        self.raises, self.writes = raises, writes

    def __call__(self, argv, **kwargs):
        self.calls.append((argv, kwargs))
        if self.raises:
            raise self.raises
        if self.writes:
            Path(argv[argv.index("-o") + 1]).write_text(self.writes)
        code, out, err = self.answer
        return subprocess.CompletedProcess(argv, code, out, err)


def test_call_popcorn_exact_call_and_output_file(tmp_path):
    argv = popcorn.build_argv("popcorn-cli", tmp_path / "v7.py", gpu="H100", leaderboard="vectoradd",
                              mode="leaderboard", output=tmp_path / "out.txt")
    run = FakeRun(stdout="progress only\n", writes=REAL_OUTPUT)
    result = popcorn.call_popcorn(argv, tmp_path / "out.txt", 120.0, run=run)
    assert run.calls == [(argv, {"capture_output": True, "text": True, "encoding": "utf-8", "errors": "replace",
                                 "timeout": 120.0,
                                 "stdin": subprocess.DEVNULL})]
    assert result.submission_id == 4242


def test_call_popcorn_falls_back_to_stdout(tmp_path):
    result = popcorn.call_popcorn(["p"], tmp_path / "none.txt", 5, run=FakeRun(stdout=REAL_OUTPUT))
    assert result.score_public_s == pytest.approx(1.23e-05)


@pytest.mark.parametrize("run, message", [
    (FakeRun(1, "", "Error: 429 Too Many Requests"), "rate-limited"),
    (FakeRun(1, "", "Error: test 2 failed"), "failed (popcorn-cli exit 1)"),
    (FakeRun(1, "", "submission marked as hacked"), "flagged as hacked"),
    (FakeRun(0, "ok\n", ""), "printed no result JSON"),
    (FakeRun(0, "Error: HTTP 429 Too Many Requests\n", ""), "rate-limited"),
    (FakeRun(1, REAL_OUTPUT.replace("4242", "429"), "Error: benchmark failed"), "failed (popcorn-cli exit 1)"),
    (FakeRun(raises=subprocess.TimeoutExpired(["p"], 5)), "did not finish in 5 s"),
])
def test_call_popcorn_errors(tmp_path, run, message):
    with pytest.raises(PopcornError) as info:
        popcorn.call_popcorn(["p"], tmp_path / "out.txt", 5, run=run)
    assert message in info.value.message


def test_stage_copy_is_byte_identical(tmp_path):
    content = SOURCE.encode()
    sha = hashlib.sha256(content).hexdigest()
    copy = popcorn.stage_copy(content, "v7.py", sha, tmp_path)
    assert copy == tmp_path / "v7.py" and copy.read_bytes() == content
    with pytest.raises(Exception, match="differs from the checked file"):
        popcorn.stage_copy(content, "v8.py", "0" * 64, tmp_path)


def test_plan_refuses_check_errors_and_needs_a_target(tmp_path):
    path = tmp_path / "v7.py"
    with pytest.raises(RefusedError, match="stream"):
        submit.plan_submission(path, (SOURCE + "# stream\n").encode(), mode="test", gpu=None, leaderboard=None,
                                gate="none", exe="p", folder=tmp_path, guard=False)
    with pytest.raises(UsageError, match="no leaderboard"):
        submit.plan_submission(path, BODY.encode(), mode="test", gpu="H100", leaderboard=None, gate="none",
                                exe="p", folder=tmp_path, guard=False)
    with pytest.raises(UsageError, match="no GPU"):
        submit.plan_submission(path, BODY.encode(), mode="test", gpu=None, leaderboard="x", gate="none",
                                exe="p", folder=tmp_path, guard=False)
    with pytest.raises(UsageError, match="unknown gate"):
        submit.plan_submission(path, SOURCE.encode(), mode="test", gpu=None, leaderboard=None, gate="full",
                                exe="p", folder=tmp_path, guard=False)


# --------------------------------------------------------------------------------- the command


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".popcorn.yaml").write_text("cli_id: test-id\n")
    return {"POPKIT_POPCORN": str(FAKE), "HOME": str(home), "POPKIT_HOME": str(tmp_path / "ledger"),
            "FAKE_POPCORN_LOG": str(tmp_path / "calls.jsonl"), "FAKE_POPCORN": "success", "POPKIT_WIDTH": "200",
            "NO_COLOR": "1"}


@pytest.fixture
def sub(tmp_path):
    path = tmp_path / "v7.py"
    path.write_text(SOURCE)
    return path


def _calls(env):
    log = Path(env["FAKE_POPCORN_LOG"])
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _submit(env, *args):
    return CliRunner().invoke(app, ["submit", *args, "--no-guard"], env=env)


def test_submit_success_hands_over_the_checked_bytes_and_records(env, sub):
    before = sub.read_bytes()
    result = _submit(env, str(sub))
    assert result.exit_code == 0, result.output
    assert "submission 4242" in result.output
    assert "score (public) on H100: 12.3 µs" in result.output
    assert "PASSED · recorded as run 1" in result.output
    (call,) = _calls(env)
    argv = call["argv"]
    assert argv[:9] == ["submit", "--gpu", "H100", "--leaderboard", "fake-board", "--mode", "leaderboard",
                        "--no-tui", "-o"]
    assert Path(argv[-1]).name == "v7.py" and Path(argv[-1]) != sub
    assert call["sha256"] == hashlib.sha256(before).hexdigest()
    assert sub.read_bytes() == before
    assert not Path(argv[-1]).exists()  # the staged copy is cleaned up
    record = History(Path(env["POPKIT_HOME"]) / "history.sqlite3").get_run(1)
    assert (record.kind, record.remote_id, record.outcome) == ("submit", 4242, "passed")


def test_submit_flags_override_directives(env, sub):
    result = _submit(env, str(sub), "--gpu", "A100", "--mode", "test", "--leaderboard", "fake-board")
    assert result.exit_code == 0, result.output
    argv = _calls(env)[0]["argv"]
    assert argv[1:8] == ["--gpu", "A100", "--leaderboard", "fake-board", "--mode", "test", "--no-tui"]


def test_submit_json(env, sub):
    result = _submit(env, str(sub), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == "popkit/submit/1" and doc["remote"]["submission_id"] == 4242
    assert doc["plan"]["argv"][-1].endswith("v7.py") and doc["history_id"] == 1


def test_submit_shows_latest_local_result_of_same_bytes(env, sub):
    from tests.test_history import make_report

    db = History(Path(env["POPKIT_HOME"]) / "history.sqlite3")
    sha = hashlib.sha256(sub.read_bytes()).hexdigest()
    local_id = db.record_run(make_report(sha=sha, means=(10000.0,)), sub.read_bytes())
    result = _submit(env, str(sub))
    assert result.exit_code == 0, result.output
    assert f"local run {local_id} (bench" in result.output
    assert "remote / local: 1.23×" in result.output


def test_dry_run_prints_the_exact_command_and_sends_nothing(env, sub):
    result = _submit(env, str(sub), "--dry-run", "--mode", "benchmark")
    assert result.exit_code == 0, result.output
    assert "dry run" in result.output and "nothing was sent" in result.output
    line = next(l for l in result.output.splitlines() if l.startswith(str(FAKE)))
    assert " submit --gpu H100 --leaderboard fake-board --mode benchmark --no-tui -o " in line
    staged = Path(line.split()[-1])
    assert staged.name == "v7.py" and not staged.parent.exists()  # a dry run leaves no staged folder behind
    assert _calls(env) == []


def test_dry_run_without_popcorn_cli_still_shows_the_command(env, sub):
    env = {**env, "POPKIT_POPCORN": "", "PATH": ""}
    result = _submit(env, str(sub), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "popcorn-cli submit --gpu H100" in result.output
    assert "install popcorn-cli and put it on PATH, or set POPKIT_POPCORN" in result.output


@pytest.mark.parametrize("behaviour, message", [
    ("429", "rate-limited by the leaderboard (HTTP 429)"),
    ("fail", "remote submission failed (popcorn-cli exit 1)"),
    ("hacked", "remote submission flagged as hacked"),
    ("nojson", "printed no result JSON"),
])
def test_submit_error_paths(env, sub, behaviour, message):
    result = _submit({**env, "FAKE_POPCORN": behaviour}, str(sub))
    assert result.exit_code == 9, result.output
    assert message in result.output
    if behaviour == "fail":
        assert "mismatch found" in result.output  # popcorn-cli's last lines are shown
    record = History(Path(env["POPKIT_HOME"]) / "history.sqlite3").get_run(1)
    assert record.outcome == "error" and message in record.error


def test_submit_output_not_utf8_is_decoded_and_recorded(env, sub):
    result = _submit({**env, "FAKE_POPCORN": "binary"}, str(sub))
    assert result.exit_code == 0, result.output
    assert "PASSED · recorded as run 1" in result.output
    record = History(Path(env["POPKIT_HOME"]) / "history.sqlite3").get_run(1)
    assert (record.kind, record.remote_id, record.outcome) == ("submit", 4242, "passed")


@pytest.mark.parametrize("behaviour", ["badshape", "badscore"])
def test_submit_result_of_the_wrong_shape_is_no_result_and_recorded(env, sub, behaviour):
    result = _submit({**env, "FAKE_POPCORN": behaviour}, str(sub))
    assert result.exit_code == 9, result.output
    assert "error: popcorn-cli finished but printed no result JSON" in result.output
    assert "Traceback" not in result.output
    record = History(Path(env["POPKIT_HOME"]) / "history.sqlite3").get_run(1)
    assert record.outcome == "error" and "printed no result JSON" in record.error


def test_submit_interrupted_while_popcorn_runs_is_still_recorded(env, sub, monkeypatch):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(popcorn, "call_popcorn", interrupted)
    result = _submit(env, str(sub))
    assert result.exit_code == 130, result.output
    record = History(Path(env["POPKIT_HOME"]) / "history.sqlite3").get_run(1)
    assert (record.kind, record.outcome, record.error) == ("submit", "error", "interrupted (KeyboardInterrupt)")


def test_submit_failure_hint_is_bounded_for_one_huge_line(env, sub):
    result = _submit({**env, "FAKE_POPCORN": "longline", "FAKE_POPCORN_BYTES": "2000000"}, str(sub), "--json")
    assert result.exit_code == 9, result.output
    doc = json.loads(result.stdout)
    assert doc["message"] == "remote submission failed (popcorn-cli exit 1)"
    assert len(doc["hint"]) < 5000 and "characters cut" in doc["hint"]


def test_submit_timeout(env, sub):
    result = _submit({**env, "FAKE_POPCORN": "slow"}, str(sub), "--timeout", "1")
    assert result.exit_code == 9 and "did not finish in 1 s" in result.output


def test_submit_without_popcorn_cli(env, sub):
    result = _submit({**env, "POPKIT_POPCORN": "", "PATH": ""}, str(sub))
    assert result.exit_code == 9
    assert "popcorn-cli not found" in result.output
    assert "install popcorn-cli and put it on PATH, or set POPKIT_POPCORN" in result.output


def test_submit_not_registered(env, sub, tmp_path):
    empty_home = tmp_path / "nobody"
    empty_home.mkdir()
    result = _submit({**env, "HOME": str(empty_home)}, str(sub))
    assert result.exit_code == 9
    assert f"not registered: {empty_home / '.popcorn.yaml'} not found" in result.output
    assert "popcorn-cli register discord" in result.output
    assert _calls(env) == []


def test_submit_stops_on_check_errors(env, sub):
    sub.write_text(SOURCE + "s = torch.cuda.current_stream()\n")
    result = _submit(env, str(sub))
    assert result.exit_code == 8
    assert "stream" in result.output and "nothing submitted" in result.output
    assert _calls(env) == []


def test_submit_stops_on_failed_gate(env, sub, monkeypatch):
    from dataclasses import replace

    from popkit.run import runner
    from tests.test_history import make_report

    failing = make_report(mode="test")
    failing = replace(failing, runs=(replace(failing.runs[0], check="fail", exit_code=112, outcome="failed",
                                             summary="test 1 failed: mismatch"),))
    seen = {}

    def fake_run(task, path, mode, options, progress=None, content=None, **_):
        seen.update(task=task.name, mode=mode, content=content)
        return failing

    monkeypatch.setattr(runner, "run_submission", fake_run)
    monkeypatch.setattr("popkit.model.tasks.resolve_task", lambda spec, roots=(): type("T", (), {"name": spec})())
    result = _submit(env, str(sub), "--gate", "test")
    assert result.exit_code == 1, result.output
    assert "NOT SUBMITTED" in result.output and "test 1 failed: mismatch" in result.output
    assert seen == {"task": "fake-board", "mode": "test", "content": sub.read_bytes()}
    assert _calls(env) == []
    runs = History(Path(env["POPKIT_HOME"]) / "history.sqlite3").list_runs()
    assert [r.kind for r in runs] == ["test"]  # the gate run is recorded, nothing was submitted


def test_submit_unknown_mode_is_usage(env, sub):
    result = _submit(env, str(sub), "--mode", "ranked")
    assert result.exit_code == 2 and "unknown mode `ranked`" in result.output


def test_remote_run_from_json_defaults():
    run = RemoteRun.from_json({"mode": "test", "passed": True})
    assert (run.secret, run.score, run.runner) == (False, None, "")


def test_dry_run_with_a_gate_runs_the_gate_and_fails_with_it(env, sub, monkeypatch):
    from dataclasses import replace

    from popkit.run import runner
    from tests.test_history import make_report

    failing = make_report(mode="test")
    failing = replace(failing, runs=(replace(failing.runs[0], check="fail", exit_code=112, outcome="failed",
                                             summary="check failed: test, size: 3: mismatch"),))
    monkeypatch.setattr(runner, "run_submission", lambda task, path, mode, options, **_: failing)
    monkeypatch.setattr("popkit.model.tasks.resolve_task", lambda spec, roots=(): type("T", (), {"name": spec})())
    result = _submit(env, str(sub), "--gate", "test", "--dry-run")
    assert result.exit_code == 1, result.output
    assert "local gate (test): failed" in result.output
    assert "would not be submitted: the local gate failed (`popkit test FILE` shows the details)" in result.output
    assert "dry run: nothing was sent" in result.output and _calls(env) == []


def test_submit_timeout_kills_the_children_of_a_popcorn_cli_wrapper(env, sub, tmp_path):
    import os
    import threading
    import time

    wrapper, pidfile = tmp_path / "popcorn-wrapper", tmp_path / "child.pid"
    wrapper.write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > {pidfile}\nwait\n")
    wrapper.chmod(0o755)
    done = {}
    thread = threading.Thread(daemon=True, target=lambda: done.update(
        result=_submit({**env, "POPKIT_POPCORN": str(wrapper)}, str(sub), "--timeout", "1")))
    thread.start()
    thread.join(1 + 5 + 5)  # the timeout, the watchdog's grace, popkit's own start
    assert not thread.is_alive(), "popkit waited on the wrapper's child after its timeout"
    assert done["result"].exit_code == 9 and "did not finish in 1 s" in done["result"].output
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


# ------------------------------------------------------------------- popkit killed during the hand-off


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_until(condition, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_sigkill_of_popkit_during_submit_leaves_no_staging_folder_and_no_popcorn(env, sub):
    """The staged copy lives in a proc.WorkDir: its guard removes it when popkit dies, SIGKILL included, and
    the watchdog takes the hanging popcorn-cli with it."""
    root = Path(popcorn.__file__).resolve().parents[1]  # the popkit under test
    env = {**os.environ, **env, "FAKE_POPCORN": "slow",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    popkit = subprocess.Popen([sys.executable, "-m", "popkit", "submit", str(sub), "--no-guard"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_until(lambda: _calls(env), 60), "popcorn-cli was not called"
        call = _calls(env)[0]
        staged = Path(call["argv"][-1])
        assert staged.is_file() and staged.read_bytes() == sub.read_bytes()
    finally:
        popkit.kill()
        popkit.wait(10)
    assert _wait_until(lambda: not staged.parent.exists(), 10), f"{staged.parent} left behind"
    assert _wait_until(lambda: not _alive(call["pid"]), 10), "popcorn-cli outlived popkit"
    assert sub.read_text() == SOURCE
